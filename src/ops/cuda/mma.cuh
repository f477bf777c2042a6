// Tensor-core fragments shared by the GEMMs (moe_experts.cu, moe_tiled_gemm.cu, skinny_gemm.cu) and KDA
// prefill (kda_prefill.cu): the mma.sync m16n8k16 bf16 and m16n8k8 tf32 wrappers, the tf32 split
// that keeps fp32-class accuracy, the shared-memory fragment loads and the streaming weight load.
#pragma once

#include <cstdint>

#include "ops/cuda/async_copy.cuh"

namespace hlm::cuda {

// mma.sync m16n8k16 (bf16 in, fp32 accumulate). Lane l = 4g + t holds A rows g and g + 8 at k = 2t, 2t+1
// (registers a0: row g, a1: row g + 8) and k = 2t + 8, 2t + 9 (a2: row g, a3: row g + 8), B column g at
// the same k (b0, b1), and C rows g, g + 8 at columns 2t, 2t + 1 (c0 c1: row g, c2 c3: row g + 8).
// Any permutation of k applied to A and B alike leaves the product unchanged, and the k a lane holds
// depend only on t; so each lane feeds the mma from columns of its own choosing, the same for A (weight
// rows) and B (token rows): contiguous runs of 8 columns that come in as one 16-byte load.
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices; lane l gives the address of row (l & 7) of matrix (l >> 3); register i holds, in
// each lane, row lane/4 and columns 2·(lane%4) + {0, 1} of matrix i (with .trans: of its transpose). The
// address is a shared-memory one (smem_addr), or a generic pointer.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) { ldsm_x4(r, smem_addr(p)); }
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// ldmatrix on 32-bit data: an 8x8 b16 matrix is 8 rows of 4 words, and lane 4g + t receives word t of row g,
// which is the layout of the m16n8k8 tf32 fragments below (A: row g or g + 8 at k = t or t + 4; B: column g
// at k = t or t + 4, from an [n][k] array). So one ldmatrix.x4 loads an A fragment, or the B fragments of
// two n8 tiles, where scalar loads took four or eight instructions. Lane l gives the address of row l & 7 of
// matrix l >> 3: its base plus the lane offset below. Rows whose stride is an odd multiple of 16 bytes
// (mod 128) keep each matrix's 8 rows in distinct banks.
// Lane offset, in words, for the A fragment of rows 0 .. 15 and k 0 .. 7 of a row-major fp32 array with row
// stride ld: matrices (rows 0-7, k 0-3), (rows 8-15, k 0-3), (rows 0-7, k 4-7), (rows 8-15, k 4-7) are
// a[0] .. a[3].
__device__ __forceinline__ int ldsm_tf32_a_offset(int lane, int ld) {
  return ((lane & 7) + 8 * ((lane >> 3) & 1)) * ld + 4 * (lane >> 4);
}
// Lane offset for the B fragments of n 0 .. 15 (two n8 tiles) and k 0 .. 7 of an [n][k] fp32 array with
// row stride ld: matrices (n 0-7, k 0-3), (n 0-7, k 4-7), (n 8-15, k 0-3), (n 8-15, k 4-7) are tile 0's
// b[0], b[1], then tile 1's.
__device__ __forceinline__ int ldsm_tf32_b2_offset(int lane, int ld) {
  return ((lane & 7) + 8 * (lane >> 4)) * ld + 4 * ((lane >> 3) & 1);
}

// Lane offset for the B fragments of one n8 tile over two k-steps (n 0 .. 7, k 0 .. 15) of an [n][k] fp32
// array with row stride ld: matrices (k 0-3), (k 4-7), (k 8-11), (k 12-15) are the first k-step's b[0], b[1],
// then the second's.
__device__ __forceinline__ int ldsm_tf32_b1_offset(int lane, int ld) {
  return (lane & 7) * ld + 4 * (lane >> 3);
}

// mma.sync m16n8k8 (tf32 in, fp32 accumulate). Lane l = 4g + t holds A rows g and g + 8 at k = t (a0: row
// g, a1: row g + 8) and k = t + 4 (a2, a3), B column g at k = t and t + 4 (b0, b1), and C as mma_bf16.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// An fp32 value as the sum of two tf32 values: big = x rounded to nearest (ties away) at tf32's 10
// mantissa bits, small = the remainder x − big (exact in fp32) rounded the same way, so that big + small
// carries x to about 2^-22 of its size. The rounding is an add and a mask on the bits (finite x), two
// integer instructions where cvt.rna.tf32.f32 is several.
__device__ __forceinline__ uint32_t round_tf32(float x) {
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
template <int N>
struct Tf32Frag {
  uint32_t big[N], small[N];
};
template <int N>
__device__ __forceinline__ Tf32Frag<N> split_tf32(const float (&x)[N]) {
  Tf32Frag<N> f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    f.big[i] = round_tf32(x[i]);
    f.small[i] = round_tf32(x[i] - __uint_as_float(f.big[i]));
  }
  return f;
}

// c + corr += A·B for fp32 A and B on the tf32 tensor cores with fp32-class accuracy (CUTLASS's "3xTF32"):
// A·B = Ab·Bb + (As·Bb + Ab·Bs) + As·Bs, the last term (≈ 2^-22 of the product) dropped. The small products
// go to their own accumulator, which keeps them from being rounded away against the large one and gives
// the tensor pipe two independent dependency chains instead of one three times as long; the result is
// c + corr.
__device__ __forceinline__ void mma_tf32x3(float (&c)[4], float (&corr)[4], const Tf32Frag<4>& a,
                                           const Tf32Frag<2>& b) {
  mma_tf32(corr, a.small, b.big);
  mma_tf32(c, a.big, b.big);
  mma_tf32(corr, a.big, b.small);
}

// c += A·B on one tf32 pass, each operand rounded to tf32 (≈ 2^-11 of its size): for products that reach
// only a bf16 output, whose own rounding (2^-9) is the larger error.
__device__ __forceinline__ void mma_tf32x1(float (&c)[4], const float (&a)[4], const uint32_t (&b)[2]) {
  const uint32_t ar[4] = {round_tf32(a[0]), round_tf32(a[1]), round_tf32(a[2]), round_tf32(a[3])};
  mma_tf32(c, ar, b);
}

// An A fragment of fp32 values by ldmatrix, from the lane's address (ldsm_tf32_a_offset).
__device__ __forceinline__ void ldsm_tf32_a(float (&a)[4], unsigned addr) {
  uint32_t r[4];
  ldsm_x4(r, addr);
#pragma unroll
  for (int e = 0; e < 4; ++e) a[e] = __uint_as_float(r[e]);
}

// The m16n8k8 A fragment of a 16 x 8 block of fp32 in shared memory whose element (row r, k) sits at
// base[r * row_stride + k * k_stride] (k_stride 1: row-major; row_stride 1: the transpose of a row-major
// matrix), for lane (g, t).
__device__ __forceinline__ void load_tf32_a(float (&a)[4], const float* base, int row_stride, int k_stride,
                                            int g, int t) {
  a[0] = base[g * row_stride + t * k_stride];
  a[1] = base[(g + 8) * row_stride + t * k_stride];
  a[2] = base[g * row_stride + (t + 4) * k_stride];
  a[3] = base[(g + 8) * row_stride + (t + 4) * k_stride];
}
// Weights are read once: through L2 without allocating in L1, which keeps the token rows there. The
// 256-byte L2 prefetch hint lets a miss bring the rest of its 256 bytes, which the GEMMs' lanes read in
// 64-byte pieces per row at about the same time (neighbour lanes, warps and CTAs).
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

}  // namespace hlm::cuda
