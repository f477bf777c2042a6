// An MLA layer's new latent cache row (Ops::mla_cache_write) as one CTA's body, so that a kernel can run it
// beside other work in one launch: mla_cache_write_kernel (mla.cu) runs it alone, mla_write_absorb_kernel
// (mla_write_absorb.cu) beside the layer's query absorption.
#pragma once

#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

// One CTA per row; a row whose slot is outside the cache (another rank's token, or past the end) is skipped
// whole. The RMSNorm is rms_norm's (rms_inv, rms_normed), the
// rope columns are copied. It replaced the norm, the two copies of the concatenation and cache_write on
// what was then a side stream of the MLA layer (that branch, not the query projection beside it, was the
// one the attention waited for); the write now runs on the step's own stream (mla_layer.cc says why).
struct MlaCacheWriteParams {
  const void* ckv;  // [T, L + R] BF16 or F32
  const void* w;    // [L] BF16 or F32
  const int64_t* slots;
  bf16* cache;  // [pages·P, L + R]
  int64_t rows, latent, width, capacity;
  float eps;
};

constexpr int kCacheWriteThreads = 128;
constexpr int kCacheWriteCached = 4;  // latent columns per thread kept in registers: L <= 512 in one pass

// The slot (host-written before the step) and the norm weight come before pdl_wait(), the weight from DRAM
// in a decode step (the step's weights stream through L2); the row's loads go out together after it, so
// the kernel waits on one round trip, not one for the row and another for the weight after the reduction.
// Measured on an H200 (48B, batch 1, the write on the step's stream, mla_layer.cc), against the kernel with
// every load after the wait: the step 2.412-2.415 ms against 2.429-2.447 at 4K, 2.720-2.731 against
// 2.751-2.776 at 128K, 4.318 against 4.376 at 1M (one call); traced on a side stream, where it started when
// q|kv_a ended, 2.6-2.8 µs from its start against 3.7.
template <class XT, class WT>
__device__ __forceinline__ void mla_cache_write_row(const MlaCacheWriteParams& p, int64_t row) {
  __shared__ float scratch[32];
  const int64_t slot = p.slots[row];
  const XT* x = static_cast<const XT*>(p.ckv) + row * p.width;
  const WT* w = static_cast<const WT*>(p.w);
  float xv[kCacheWriteCached], wv[kCacheWriteCached];
#pragma unroll
  for (int i = 0; i < kCacheWriteCached; ++i) {
    const int64_t d = threadIdx.x + i * kCacheWriteThreads;
    wv[i] = d < p.latent ? to_float(w[d]) : 0.0f;
  }
  pdl_wait();
  pdl_trigger();
  if (slot < 0 || slot >= p.capacity) return;  // the whole CTA: one row
#pragma unroll
  for (int i = 0; i < kCacheWriteCached; ++i) {
    const int64_t d = threadIdx.x + i * kCacheWriteThreads;
    xv[i] = d < p.latent ? to_float(x[d]) : 0.0f;
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kCacheWriteCached; ++i) sum_sq += xv[i] * xv[i];
  for (int64_t d = threadIdx.x + kCacheWriteCached * kCacheWriteThreads; d < p.latent;
       d += kCacheWriteThreads) {
    const float v = to_float(x[d]);
    sum_sq += v * v;
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float inv = rms_inv(sum_sq, p.latent, p.eps);
  bf16* dst = p.cache + slot * p.width;
#pragma unroll
  for (int i = 0; i < kCacheWriteCached; ++i) {
    const int64_t d = threadIdx.x + i * kCacheWriteThreads;
    if (d < p.latent) dst[d] = __float2bfloat16_rn(rms_normed(xv[i], inv, wv[i]));
  }
  for (int64_t d = threadIdx.x + kCacheWriteCached * kCacheWriteThreads; d < p.latent;
       d += kCacheWriteThreads) {
    dst[d] = __float2bfloat16_rn(rms_normed(to_float(x[d]), inv, to_float(w[d])));
  }
  for (int64_t d = p.latent + threadIdx.x; d < p.width; d += kCacheWriteThreads) {
    dst[d] = __float2bfloat16_rn(to_float(x[d]));
  }
}

// The checked parameters of Ops::mla_cache_write's arguments, errors naming `op` (mla.cu).
MlaCacheWriteParams mla_cache_write_params(const char* op, const Tensor& ckv, int64_t latent,
                                           const Tensor& norm_w, float eps, const Tensor& slots,
                                           Tensor& cache);

}  // namespace hlm::cuda
