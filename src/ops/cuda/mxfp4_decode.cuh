// MXFP4 (e2m1 codes in pairs per byte, an e8m0 scale per 32 columns) decoded to bf16 in registers, shared by
// the routed experts' weight-streaming kernels (moe_experts.cu) and their tiled GEMMs (moe_tiled_gemm.cu).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace hlm::cuda {

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The bf16x2 factors that take one MXFP4 row's decoded codes (below) to value · 2^(s - 127) for its scale
// byte s: f1 = 2^(s - 1), a normal bf16 for s <= 128 (scales up to 2); a larger scale takes f1 = 2^127 and
// a second factor f2 = 2^(s - 128) (f2 = 1 otherwise). !kBig: s <= 128 is known, f1 is one multiply-add
// ((s + 126) << 7 in both halves) and f2 unused.
struct Mxfp4Factors {
  uint32_t f1, f2;
};
template <bool kBig>
__device__ __forceinline__ Mxfp4Factors mxfp4_factors(uint32_t s) {
  if constexpr (!kBig) return {s * 0x00800080u + 0x3F003F00u, 0};
  const uint32_t e1 = s <= 128 ? s + 126 : 254u, e2 = s <= 128 ? 127u : s - 1;
  return {(e1 << 7) * 0x10001u, (e2 << 7) * 0x10001u};
}

// Eight e2m1 codes (nibble i = column i of a run) -> four bf16x2 words holding the columns (j, j + 4),
// each times 2^(s - 127). Moving the sign to bit 15 and the 3 magnitude bits to bits 8..6 of a half makes
// a bf16 worth the e2m1 value · 2^-126 (code 1, 0.5, becomes the subnormal 2^-127, which bf16 arithmetic
// keeps); the multiply by f1 (and, kBig, f2) then gives value · 2^(s - 127), exactly.
// The bits move in two steps, which costs fewer integer instructions than masking and shifting magnitude
// and sign of each word apart (this decode is most of an MXFP4 chunk's instructions). For v = q (nibbles
// 0, 1 | 4, 5) and v = q >> 8 (nibbles 2, 3 | 6, 7 in the same places): one select puts each nibble's sign
// 6 bits above its magnitude (magnitude bits from v, sign bits from v << 6); then a mask and one shift
// per word, by 6 for nibbles 0 | 4 and by 2 for nibbles 1 | 5, land both in place: 13 integer
// instructions per 8 codes against 18 (ptxas output), and the K3 experts took 125 µs at batch 1 against
// 137, 710 against 771 at batch 8 (kernel_bench --moe on an H200).
template <bool kBig>
__device__ __forceinline__ void e2m1x8_to_bf16(uint32_t q, const Mxfp4Factors& f, uint32_t (&w)[4]) {
  constexpr uint32_t kMagnitudes = 0x00770077u;  // bits 0-2 and 4-6 of each half
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t v = h == 0 ? q : q >> 8;
    uint32_t both;  // (v & kMagnitudes) | ((v << 6) & ~kMagnitudes) as one LOP3 (ptxas made it two)
    asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(both) : "r"(v), "r"(v << 6), "n"(kMagnitudes));
    w[2 * h] = (both & 0x02070207u) << 6;
    w[2 * h + 1] = (both & 0x20702070u) << 2;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w[j] = mul_bf16x2(w[j], f.f1);
    if constexpr (kBig) w[j] = mul_bf16x2(w[j], f.f2);
  }
}

// The same eight codes as bf16x2 words in column order, (0, 1), (2, 3), (4, 5), (6, 7): what a row stored
// in shared memory for the tensor cores' k-major operands needs.
template <bool kBig>
__device__ __forceinline__ void e2m1x8_to_bf16_ordered(uint32_t q, const Mxfp4Factors& f, uint32_t (&w)[4]) {
  uint32_t paired[4];  // (j, j + 4)
  e2m1x8_to_bf16<kBig>(q, f, paired);
  w[0] = __byte_perm(paired[0], paired[1], 0x5410);
  w[1] = __byte_perm(paired[2], paired[3], 0x5410);
  w[2] = __byte_perm(paired[0], paired[1], 0x7632);
  w[3] = __byte_perm(paired[2], paired[3], 0x7632);
}

}  // namespace hlm::cuda
