// Device helpers shared by the CUDA kernels: loads and stores that convert between F32 and BF16, warp and
// block reductions, and the scalar activations with the same formulas as the CPU backend
// (ops/cpu/cpu_kernels.h), so both backends compute the same function.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

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

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
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
// act(gate) · up: silu, or SiTU = [β·tanh(g/β)·sigmoid(g)] · [β_l·tanh(u/β_l)] (cpu_kernels.h glu_value).
__device__ __forceinline__ float glu_value(float g, float u, bool situ, float beta, float linear_beta) {
  if (!situ) return silu(g) * u;
  const float gate = beta * tanhf(g / beta) * logistic(g);
  return gate * (linear_beta * tanhf(u / linear_beta));
}

}  // namespace hlm::cuda
