// Device helpers shared by the CUDA kernels: loads and stores that convert between F32 and BF16, warp and
// block reductions, and the scalar activations with the same formulas as the CPU backend
// (ops/cpu/cpu_kernels.h), so both backends compute the same function.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace hlm::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// bf16 packing, one definition for every kernel: a bf16x2 word holds `lo` at the lower address, and
// float -> bf16 rounds to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t w) {
  return {__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u)};
}
// Eight floats, given as the bits of two 16-byte words, as eight bf16 in one 16-byte word.
__device__ __forceinline__ uint4 f32x8_to_bf16(const uint4& a, const uint4& b) {
  return make_uint4(pack_bf16x2(__uint_as_float(a.x), __uint_as_float(a.y)),
                    pack_bf16x2(__uint_as_float(a.z), __uint_as_float(a.w)),
                    pack_bf16x2(__uint_as_float(b.x), __uint_as_float(b.y)),
                    pack_bf16x2(__uint_as_float(b.z), __uint_as_float(b.w)));
}
// Eight bf16 in one 16-byte word as floats.
__device__ __forceinline__ void bf16x8_to_f32(const uint4& q, float (&v)[8]) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = unpack_bf16x2(w[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// N consecutive elements (F32 or BF16) as floats, in vector loads of up to 16 bytes; p must be aligned to
// the vector's size (N · sizeof(T) bytes, or 16).
template <int N, class T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[N]) {
  constexpr int kBytes = N * sizeof(T) < 16 ? N * sizeof(T) : 16, kPer = kBytes / sizeof(T);
  static_assert(N % kPer == 0 && (kBytes == 16 || kBytes == 8 || kBytes == 4 || kBytes == 2));
  using Word = std::conditional_t<
      kBytes == 16, uint4,
      std::conditional_t<kBytes == 8, uint2, std::conditional_t<kBytes == 4, uint32_t, uint16_t>>>;
#pragma unroll
  for (int w = 0; w < N / kPer; ++w) {
    const Word word = *reinterpret_cast<const Word*>(p + w * kPer);
    const T* e = reinterpret_cast<const T*>(&word);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[w * kPer + i] = to_float(e[i]);
  }
}

// N consecutive elements kept as they are in memory: one vector load (N · sizeof(T) <= 16 bytes; p
// aligned to that size) whose conversion waits until the values are used. Memory-bound kernels issue
// several such loads before converting the first, so that each is not a round trip of its own (a load
// converted inside the branch that guards it is: see kda_prefill.cu).
template <class T, int N>
struct alignas(N * sizeof(T)) RawVec {
  static_assert(N * sizeof(T) <= 16 && (N & (N - 1)) == 0, "RawVec: one vector load of at most 16 bytes");
  T e[N];
  __device__ __forceinline__ void load(const T* p) { *this = *reinterpret_cast<const RawVec*>(p); }
  __device__ __forceinline__ void to_floats(float (&v)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = to_float(e[i]);
  }
};
// N floats stored as N consecutive elements of T (bf16: rounded to nearest even) in one vector store.
template <class T, int N>
__device__ __forceinline__ void store_floats(T* p, const float (&v)[N]) {
  RawVec<T, N> out;
#pragma unroll
  for (int i = 0; i < N; ++i) out.e[i] = from_float<T>(v[i]);
  *reinterpret_cast<RawVec<T, N>*>(p) = out;
}

// 2^x by the hardware's approximation (a few ulp; 2^-inf = +0), without exp2f's range fix-up: for softmax
// weights, whose arguments are at most a few units above 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// RMSNorm (docs/MODEL.md §4), one definition for its kernels: rms_inv is 1 / sqrt(mean(x²) + eps) from the
// row's sum of squares, and rms_normed one output before its store: the normalized value rounded to bf16,
// then times the weight.
template <class Int>
__device__ __forceinline__ float rms_inv(float sum_sq, Int dim, float eps) {
  return rsqrtf(sum_sq / static_cast<float>(dim) + eps);
}
__device__ __forceinline__ float rms_normed(float x, float inv, float w) {
  return w * __bfloat162float(__float2bfloat16_rn(x * inv));
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats; blockDim.x % 32 == 0.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(total);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = lane < warps ? scratch[lane] : -__int_as_float(0x7f800000);
  return warp_max(m);
}

__device__ __forceinline__ float logistic(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
// silu's formula with the hardware's exp and division (each within 2 ulp; x -> -inf gives -0), for outputs
// rounded to bf16 (8 significant bits): in the KDA short conv the per-element arithmetic takes about as
// long as the loads (ncu: 41% of the issue slots against 37% of DRAM bandwidth).
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.0f + __expf(-x)); }
// act(gate) · up: silu, or SiTU = [β·tanh(g/β)·sigmoid(g)] · [β_l·tanh(u/β_l)] (cpu_kernels.h glu_value).
__device__ __forceinline__ float glu_value(float g, float u, bool situ, float beta, float linear_beta) {
  if (!situ) return silu(g) * u;
  const float gate = beta * tanhf(g / beta) * logistic(g);
  return gate * (linear_beta * tanhf(u / linear_beta));
}

}  // namespace hlm::cuda
