// The per-head product y_h = x_h · w_h with w [H, a, b], a <= 128 (head_matmul's plain form; MLA's query
// absorption, q_nope · W_UK per head, with the rope columns copied beside it), as one CTA's body, so that a
// kernel can run it beside other work in one launch: head_rows_kernel (skinny_gemm.cu) runs it alone,
// mla_write_absorb_kernel (mla_write_absorb.cu) beside an MLA layer's cache write.
#pragma once

#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

// Grid (ceil(b / 128), H), 128 threads: thread (r, c) holds the 8 columns at 8c of the CTA's 128 for the
// rows r, r + 8, ... of w_h (16 rows, one 16-byte load each, all issued before pdl_wait()), the head's
// token rows go to shared memory as fp32, and per token each thread sums its rows' products into 8 fp32
// columns, which the 8 row groups add in shared memory in group order (a fixed order). The weights are
// read once whatever the token count; the products are fp32 on CUDA cores (at most 16 tokens x 8
// columns x 16 rows per thread).
constexpr int kHeadColThreads = 16;                                // 8 columns each: 128 per CTA
constexpr int kHeadRowGroups = 8;                                  // threads down the rows
constexpr int kHeadRowsPerThread = 16;                             // w_h rows in flight per thread
constexpr int kHeadMaxRows = kHeadRowGroups * kHeadRowsPerThread;  // the largest a
constexpr int kHeadThreads = kHeadColThreads * kHeadRowGroups;
constexpr int kHeadMaxTokens = 16;  // token rows per call, at most

struct HeadRowsParams {
  const bf16* w;  // [H, a, b]
  const void* x;  // [T, H, x_ld] BF16 or F32: columns [0, a) multiply w, [a, a + tail) are copied
  bf16* y;        // [T, H, y_ld]: columns [0, b) the product, [b, b + tail) the copy
  int64_t heads, a, b, tail;
  int64_t x_ld, y_ld;
  int tokens;
};

// CTA (col_block, h) of that grid, as a body that head_rows_kernel (skinny_gemm.cu) runs alone and
// mla_write_absorb_kernel beside the MLA cache write.
template <class XT>
__device__ __forceinline__ void head_rows_block(const HeadRowsParams& p, int64_t col_block, int64_t h) {
  __shared__ float xs[kHeadMaxTokens][kHeadMaxRows];              // [T, a] of this head
  __shared__ float partial[kHeadRowGroups][kHeadColThreads * 8];  // [row group, column]
  const int c = threadIdx.x % kHeadColThreads, r = threadIdx.x / kHeadColThreads;
  const int64_t col = col_block * (kHeadColThreads * 8) + c * 8;
  const bf16* w = p.w + h * p.a * p.b;  // [a, b]
  uint4 wr[kHeadRowsPerThread];
#pragma unroll
  for (int i = 0; i < kHeadRowsPerThread; ++i) {
    const int64_t row = r + i * kHeadRowGroups;
    wr[i] = col < p.b && row < p.a ? load_streaming(w + row * p.b + col) : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();
  pdl_trigger();
  const XT* x = static_cast<const XT*>(p.x);
  for (int64_t i = threadIdx.x; i < p.tokens * p.a; i += kHeadThreads) {
    const int64_t t = i / p.a, k = i % p.a;
    xs[t][k] = to_float(x[(t * p.heads + h) * p.x_ld + k]);
  }
  if (col_block == 0) {
    for (int64_t i = threadIdx.x; i < p.tokens * p.tail; i += kHeadThreads) {
      const int64_t t = i / p.tail, k = i % p.tail;
      p.y[(t * p.heads + h) * p.y_ld + p.b + k] =
          from_float<bf16>(to_float(x[(t * p.heads + h) * p.x_ld + p.a + k]));
    }
  }
  __syncthreads();
  for (int t = 0; t < p.tokens; ++t) {
    float acc[8] = {};
#pragma unroll
    for (int i = 0; i < kHeadRowsPerThread; ++i) {
      const int row = r + i * kHeadRowGroups;
      if (row >= p.a) break;  // uniform over the thread's remaining rows
      float wf[8];
      bf16x8_to_f32(wr[i], wf);
      const float xv = xs[t][row];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = fmaf(xv, wf[j], acc[j]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) partial[r][c * 8 + j] = acc[j];
    __syncthreads();
    const int64_t out_col = col_block * (kHeadColThreads * 8) + threadIdx.x;
    if (out_col < p.b) {
      float v = 0.0f;
#pragma unroll
      for (int g = 0; g < kHeadRowGroups; ++g) v += partial[g][threadIdx.x];
      p.y[(t * p.heads + h) * p.y_ld + out_col] = __float2bfloat16_rn(v);
    }
    __syncthreads();  // partial is rewritten for the next token
  }
}

// The checked parameters of x [T, H, c] (columns [0, a) times w [H, a, b], then `tail` columns copied)
// into y [T, H, b + tail] (skinny_gemm.cu).
HeadRowsParams head_rows_params(const Tensor& x, const Tensor& w, int64_t tail, Tensor& y);

}  // namespace hlm::cuda
