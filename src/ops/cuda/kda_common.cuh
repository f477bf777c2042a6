// Pieces shared by the KDA kernels (kda_conv_gate.cu, kda_decode.cu, kda_prefill.cu): the device view of a
// SeqBatch table, float tensors whose dtype is chosen at run time, the head-size switch, and the argument
// checks of the two KDA core ops.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cpu/cpu_kernels.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"

namespace hlm::cuda {

// One row of SeqBatch::table (I32 [S, 3]).
struct Span {
  int begin;
  int count;
  int slot;
};

__device__ __forceinline__ Span load_span(const int32_t* table, int s) {
  return Span{table[3 * s], table[3 * s + 1], table[3 * s + 2]};
}

// The span whose rows include `row`, found by the whole (1-D) block; every thread gets it. Rows outside
// every span, and spans without a valid slot, give {0, 0, -1}. `shared` is one Span of shared memory.
__device__ __forceinline__ Span block_find_span(const int32_t* table, int num_spans, int64_t row,
                                                Span* shared) {
  if (threadIdx.x == 0) *shared = Span{0, 0, -1};
  __syncthreads();
  for (int s = threadIdx.x; s < num_spans; s += blockDim.x) {
    const Span span = load_span(table, s);
    // Spans are disjoint, so at most one thread writes.
    if (span.count > 0 && span.slot >= 0 && row >= span.begin && row < span.begin + span.count)
      *shared = span;
  }
  __syncthreads();
  return *shared;
}

// The KDA l2norm as one factor, x · scale / sqrt(Σx² + 1e-6) (eps inside the sqrt, docs/MODEL.md §5.4),
// from a float sum of squares; the division in double as in the CPU op.
__device__ __forceinline__ float l2_factor(float sum_sq, float scale) {
  return static_cast<float>(static_cast<double>(scale) / sqrt(static_cast<double>(sum_sq) + 1e-6));
}

// The forget gate of one element in log space (ops.h kda_gate, the CPU op's formula): z = graw + dt_bias,
// rate = exp(A_log) of the element's head.
__device__ __forceinline__ float kda_gate_value(float z, float rate, float lower_bound) {
  if (lower_bound == 0.0f) return -rate * (z > 20.0f ? z : log1pf(expf(z)));  // softplus, torch's threshold
  return lower_bound * logistic(rate * z);
}

// A float tensor (F32 or BF16) read with its dtype known only at run time: for weights and the conv cache,
// which are small next to the activations; the branch is uniform across a warp.
struct FloatIn {
  const void* p;
  bool bf16;
  __device__ __forceinline__ float load(int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
  }
};
struct FloatInOut {
  void* p;
  bool bf16;
  __device__ __forceinline__ float load(int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
  }
  __device__ __forceinline__ void store(int64_t i, float v) const {
    if (bf16) {
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(p)[i] = v;
    }
  }
};
inline FloatIn float_in(const Tensor& t) { return FloatIn{t.raw(), t.dtype() == DType::kBF16}; }
inline FloatInOut float_in_out(Tensor& t) { return FloatInOut{t.raw(), t.dtype() == DType::kBF16}; }

// Calls f(std::integral_constant<int, D>{}) for a head size with tiled KDA kernels (16, 32, 64, 128) and
// returns true; false for any other size.
template <class F>
bool dispatch_head_dim(int64_t dim, F&& f) {
  switch (dim) {
    case 16:
      f(std::integral_constant<int, 16>{});
      return true;
    case 32:
      f(std::integral_constant<int, 32>{});
      return true;
    case 64:
      f(std::integral_constant<int, 64>{});
      return true;
    case 128:
      f(std::integral_constant<int, 128>{});
      return true;
    default:
      return false;
  }
}

// What both KDA core kernels read and write; each kernel's params struct extends it.
template <class XT>
struct KdaCoreParams {
  const XT* q;           // [T, H, K]
  const XT* k;           // [T, H, K]
  const XT* v;           // [T, H, V]
  const float* g;        // [T, H, K]
  const float* beta;     // [T, H]
  float* state;          // [slots, H, K, V]
  __nv_bfloat16* out;    // [T, H, V]
  const int32_t* table;  // [S, 3]
  int num_spans;
  int heads;
};

// g and beta may be undefined where a kernel computes them (kda_decode_gated).
template <class XT>
KdaCoreParams<XT> kda_core_params(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                  const Tensor& beta, const SeqBatch& seqs, Tensor& state, Tensor& out) {
  return {static_cast<const XT*>(q.raw()),
          static_cast<const XT*>(k.raw()),
          static_cast<const XT*>(v.raw()),
          g.defined() ? g.data<float>() : nullptr,
          beta.defined() ? beta.data<float>() : nullptr,
          state.data<float>(),
          static_cast<__nv_bfloat16*>(out.raw()),
          seqs.table.data<int32_t>(),
          static_cast<int>(seqs.spans.size()),
          static_cast<int>(q.dim(1))};
}

// `seqs` must have its device table (I32 [S, 3], one row per host span) and host spans that follow the
// batch rules (ops/cpu check_seq_spans: inside the rows, disjoint, distinct slots).
inline void check_seq_batch(const SeqBatch& seqs, int64_t rows, int64_t slots, const char* op) {
  const auto spans = static_cast<int64_t>(seqs.spans.size());
  expect_cuda(seqs.table, op, "seqs.table", {DType::kI32}, 2, "[S, 3] (token_begin, token_count, slot)");
  expect_dim(seqs.table, 0, spans, op, "seqs.table [S, 3]", "the number of host spans");
  expect_dim(seqs.table, 1, 3, op, "seqs.table [S, 3]", "token_begin, token_count, slot");
  HLM_CHECK(spans <= 65535, "{}: {} sequences in one batch; the kernels take at most 65535", op, spans);
  HLM_CHECK(rows <= INT32_MAX, "{}: {} rows do not fit the I32 span table", op, rows);
  cpu::check_seq_spans(seqs.spans, rows, slots, op);
}

// q, k [T, H, K] and v [T, H, V] of one activation dtype, and state [slots, H, K, V] F32 with the batch.
inline void check_kda_qkv_state(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                const SeqBatch& seqs, const Tensor& state) {
  expect_cuda(q, op, "q", {DType::kBF16, DType::kF32}, 3, "[T, H, K]");
  expect_cuda(k, op, "k", {q.dtype()}, 3, "[T, H, K] of q's dtype");
  expect_cuda(v, op, "v", {q.dtype()}, 3, "[T, H, V] of q's dtype");
  expect_cuda(state, op, "state", {DType::kF32}, 4, "[slots, H, K, V]");
  expect_same_shape(q, k, op, "q [T, H, K]", "k");
  const int64_t rows = q.dim(0), heads = q.dim(1);
  expect_dim(v, 0, rows, op, "v [T, H, V]", "the token count of q [T, H, K]");
  expect_dim(v, 1, heads, op, "v [T, H, V]", "the head count of q [T, H, K]");
  expect_dim(state, 1, heads, op, "state [slots, H, K, V]", "the head count of q [T, H, K]");
  expect_dim(state, 2, q.dim(2), op, "state [slots, H, K, V]", "the key dimension of q [T, H, K]");
  expect_dim(state, 3, v.dim(2), op, "state [slots, H, K, V]", "the value dimension of v [T, H, V]");
  HLM_CHECK(heads <= 65535, "{}: {} heads; the kernels take at most 65535", op, heads);
  check_seq_batch(seqs, rows, state.dim(0), op);
}

// The arguments of kda_prefill / kda_decode (ops.h): check_kda_qkv_state's, g [T, H, K] F32 and beta
// [T, H] F32.
inline void check_kda_core_args(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& g, const Tensor& beta, const SeqBatch& seqs,
                                const Tensor& state) {
  check_kda_qkv_state(op, q, k, v, seqs, state);
  expect_cuda(g, op, "g", {DType::kF32}, 3, "[T, H, K]");
  expect_cuda(beta, op, "beta", {DType::kF32}, 2, "[T, H]");
  expect_same_shape(q, g, op, "q [T, H, K]", "g");
  expect_dim(beta, 0, q.dim(0), op, "beta [T, H]", "the token count of q [T, H, K]");
  expect_dim(beta, 1, q.dim(1), op, "beta [T, H]", "the head count of q [T, H, K]");
}

// A decode batch's limits beyond check_seq_batch: one token per sequence, the grid and alignment limits of
// the decode kernels (rows of the batch, key dimension kd).
inline void check_kda_decode_batch(const char* op, int64_t rows, int64_t kd, const SeqBatch& seqs,
                                   const Tensor& state) {
  for (size_t i = 0; i < seqs.spans.size(); ++i) {
    HLM_CHECK(seqs.spans[i].token_count <= 1,
              "{}: sequence {} has {} new tokens; decode takes at most 1 (use kda_prefill for more)", op, i,
              seqs.spans[i].token_count);
  }
  HLM_CHECK(rows <= 65535, "{}: {} rows in one decode batch; the grid takes at most 65535", op, rows);
  HLM_CHECK(3 * kd * static_cast<int64_t>(sizeof(float)) <= 48 * 1024,
            "{}: key dimension {} is too large for the kernel's shared memory (at most 4096)", op, kd);
  HLM_CHECK(reinterpret_cast<uintptr_t>(state.raw()) % 16 == 0,
            "{}: the state must be 16-byte aligned for vector access", op);
}

// The per-head parameters of a fused decode (KdaHeadParams) for `heads` heads of K = V = kd.
inline void check_kda_head_params(const char* op, const KdaHeadParams& hp, int64_t heads, int64_t kd) {
  expect_cuda(hp.a_log, op, "a_log", {DType::kF32, DType::kBF16}, 1, "[H]");
  expect_dim(hp.a_log, 0, heads, op, "a_log [H]", "the head count");
  expect_cuda(hp.dt_bias, op, "dt_bias", {DType::kF32, DType::kBF16}, 1, "[H*K]");
  expect_dim(hp.dt_bias, 0, heads * kd, op, "dt_bias [H*K]", "H*K");
  expect_cuda(hp.o_norm, op, "o_norm", {DType::kF32, DType::kBF16}, 1, "[V]");
  expect_dim(hp.o_norm, 0, kd, op, "o_norm [V]", "the head dimension");
  HLM_CHECK(hp.lower_bound <= 0.0f, "{}: lower_bound must be 0 (softplus gate) or negative, got {}", op,
            hp.lower_bound);
}

}  // namespace hlm::cuda
