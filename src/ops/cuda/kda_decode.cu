// KDA recurrent decode (docs/MODEL.md §5.5), the same function as ops/cpu/kda.cc kda_decode: one token per
// sequence, decay first, delta-rule update, output read after the update; q and k are L2-normalized in the
// kernel (eps 1e-6 inside the sqrt, q scaled by K^-0.5).
//
// Cost: a pure fp32 read-modify-write of the state, K·V·8 bytes moved per (token, head) (128 KB at
// K = V = 128; 4 MB per layer at batch 1 with 32 heads) against 7 FLOP per state element (a decay multiply
// and three FMAs); q, k, v, g, beta and the output are under 2% of the bytes. So each state element is read
// and written exactly once, coalesced, a thread's state loads are all issued together, and a head is split
// over 4 CTAs (K = V = 128: 128 CTAs at batch 1, about one per SM, 16 KB of state each in registers). A
// trivial in-place stream of the same bytes takes 2.38 µs as a graph node, and 1.34 µs with programmatic
// dependent launch and its loads issued before griddepcontrol.wait (KERNELS.md §3.3): the ≤ 2 µs target
// needs PDL, and the state loads below come before the wait for the kernel before (see the kernel).
//
// kda_decode_gated is the same kernel with the layer's small ops around the recurrence folded in, which
// saves three launches per KDA layer: the decays come from the raw gate projection (kda_gate's formula per
// element), beta is the sigmoid of its logit, and the output goes through the gated RMSNorm before it is
// stored. The norm spans a head's V columns, which kSplits CTAs share, so those CTAs form a thread-block
// cluster and add their partial sums of squares through distributed shared memory. It pays off only for
// small batches (kGatedMaxHeadRows); larger ones take the separate ops.
#include "ops/cuda/kda_decode_tile.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {
namespace {

// kda_decode_gated's inputs beyond the core's (the core's g and beta are unused there).
struct KdaGatedInputs {
  FloatIn graw;         // [T, H*K]
  FloatIn beta_logits;  // [T, H]
  FloatIn out_gate;     // [T, H, V]
  FloatIn a_log;        // [H]
  FloatIn dt_bias;      // [H*K]
  FloatIn o_norm;       // [V]
  float lower_bound;
  float eps;
};

template <class XT>
struct KdaDecodeParams : KdaCoreParams<XT> {
  int kdim;  // the generic kernel's sizes; the tiled kernel has them as template arguments
  int vdim;
  KdaGatedInputs gated;  // the gated kernel only
};

// The l2norm factors of q (with its K^-0.5 scale) and of k from their [kd] values in shared memory; the
// whole block takes part. Each thread sums the elements d = tid, tid + blockDim, ..., so a thread that wrote
// exactly those needs no barrier before the call. `scratch` holds 32 float2.
__device__ __forceinline__ float2 l2_factors(const float* q_sh, const float* k_sh, int kd, float2* scratch) {
  float q_sq = 0.0f, k_sq = 0.0f;
  for (int d = threadIdx.x; d < kd; d += blockDim.x) {
    q_sq += q_sh[d] * q_sh[d];
    k_sq += k_sh[d] * k_sh[d];
  }
  q_sq = warp_sum(q_sq);
  k_sq = warp_sum(k_sq);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = {q_sq, k_sq};
  __syncthreads();
  q_sq = 0.0f;
  k_sq = 0.0f;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) {
    q_sq += scratch[w].x;
    k_sq += scratch[w].y;
  }
  return {l2_factor(q_sq, 1.0f / sqrtf(static_cast<float>(kd))), l2_factor(k_sq, 1.0f)};
}

// The generic kernel's inputs: q, k and the decays exp(log_decay(d)) of one (token, head) ([kd] each) in
// shared memory, and the l2norm factors of q (with its K^-0.5 scale) and of k; the whole block takes part,
// and the arrays are visible to every thread on return. `scratch` holds 32 float2.
template <class XT, class LogDecay>
__device__ __forceinline__ float2 load_q_k_decay(const XT* q, const XT* k, LogDecay log_decay, int kd,
                                                 float* q_sh, float* k_sh, float* decay_sh, float2* scratch) {
  for (int d = threadIdx.x; d < kd; d += blockDim.x) {
    q_sh[d] = to_float(q[d]);
    k_sh[d] = to_float(k[d]);
    decay_sh[d] = expf(log_decay(d));
  }
  return l2_factors(q_sh, k_sh, kd, scratch);
}

// Grid (kSplits, H, T): a CTA per (row of the batch, head, kCols value columns). Every column of S^T k̂,
// of the update and of S^T q̂ involves only that column of the state, so splitting V needs no exchange
// between CTAs; each CTA recomputes the (cheap) norms of q and k. A thread keeps its kRows × 4 state
// values in registers from load to store, and reads q, k and the log decays of its kRows key rows straight
// from global memory (the quads of a row group share them through L1), so after the PDL wait the plain
// kernel has one round of loads and one barrier, recur()'s reduction (the gated one computes each decay
// once, behind one more). A row that no span covers gets zeros.
// kGated: kda_decode_gated (the file comment), launched in clusters of kSplits CTAs along x.
// PDL: the span lookup and the state loads come before pdl_wait(). The span table is host-written
// metadata, and the state is written only by this layer's own decode or prefill kernel of an earlier step
// (or reset between steps), never by the kernel just before this one; every earlier kernel has completed
// once this grid runs (pdl.cuh). So the 16 KB of state per CTA stream in while the short conv finishes.
template <int D, class XT, bool kGated>
__global__ void __launch_bounds__(DecodeTile<D>::kThreads) kda_decode_kernel(KdaDecodeParams<XT> p) {
  using Tile = DecodeTile<D>;
  __shared__ Span span_shared;
  __shared__ float4 sum_scratch[Tile::kWarps * Tile::kQuads * kRecurSums];
  __shared__ float decay_sh[D];  // kGated: exp(g) of the head's key rows
  __shared__ float sum_sq_sh;    // kGated: this CTA's Σ o² over its columns

  const auto [h, row, quad, row_group, col, token_head] = decode_thread<Tile>(p.heads);
  __nv_bfloat16* out = p.out + token_head * D + col;

  const Span span = block_find_span(p.table, p.num_spans, row, &span_shared);
  if (span.slot < 0) {  // padding or a row of no sequence
    finish_empty_row(out, row_group);
    return;
  }
  float4 s[Tile::kRows];  // rows row_group + kRowGroups·i, columns col .. col+3
  float* state = load_state<Tile, D>(p.state, span.slot, p.heads, h, col, row_group, s);
  // kGated: the decay's weights too (the head's rate, thread d's dt_bias).
  static_assert(D <= Tile::kThreads);
  float rate = 0.0f, dt_bias = 0.0f;
  if constexpr (kGated) {
    rate = expf(p.gated.a_log.load(h));
    if (threadIdx.x < D) dt_bias = p.gated.dt_bias.load(h * D + threadIdx.x);
  }
  pdl_wait();
  pdl_trigger();

  RowInputs<Tile> in;
  const XT* q = p.q + token_head * D;
  const XT* k = p.k + token_head * D;
  float b;
  float4 gate;  // kGated: the output gate of the thread's columns
  if constexpr (kGated) {
    const KdaGatedInputs& gi = p.gated;
    // A decay takes a softplus or a sigmoid and loads of run-time dtype: each element once (thread d),
    // shared behind a barrier, costs less than kRows of them per thread (measured).
    if (threadIdx.x < D)
      decay_sh[threadIdx.x] =
          expf(kda_gate_value(gi.graw.load(token_head * D + threadIdx.x) + dt_bias, rate, gi.lower_bound));
#pragma unroll
    for (int i = 0; i < Tile::kRows; ++i) {
      const int d = row_group + Tile::kRowGroups * i;
      in.q[i] = to_float(q[d]);
      in.k[i] = to_float(k[d]);
    }
    b = logistic(gi.beta_logits.load(token_head));
    const int64_t base = token_head * D + col;
    gate = {gi.out_gate.load(base), gi.out_gate.load(base + 1), gi.out_gate.load(base + 2),
            gi.out_gate.load(base + 3)};
    __syncthreads();
#pragma unroll
    for (int i = 0; i < Tile::kRows; ++i) in.decay[i] = decay_sh[row_group + Tile::kRowGroups * i];
  } else {
    const float* g = p.g + token_head * D;
#pragma unroll
    for (int i = 0; i < Tile::kRows; ++i) {
      const int d = row_group + Tile::kRowGroups * i;
      in.q[i] = to_float(q[d]);
      in.k[i] = to_float(k[d]);
      in.decay[i] = expf(g[d]);
    }
    b = p.beta[token_head];
  }
  const float4 v = load4(p.v + token_head * D + col);

  // The plain kernel writes each state row back as soon as it is updated; the gated one after the
  // cluster's release barrier, which would otherwise wait for those 16 KB of stores.
  float4 o = recur<Tile, D, !kGated>(s, in, v, b, row_group, state, sum_scratch);
  if constexpr (kGated) {
    // The norm weight is loaded here so that its latency hides behind the norm's cluster barrier; loaded
    // before the PDL wait, it held 16 more registers through the whole kernel (4 CTAs per SM instead of 5),
    // which cost more at batch 8 than it saved at batch 1 (measured).
    const float4 norm_w = load4(p.gated.o_norm, col);
    o = gated_norm<Tile, D>(o, gate, norm_w, p.gated.eps, &sum_sq_sh);
    store_state<Tile, D>(state, row_group, s);
  }
  if (row_group == 0) store4_bf16(out, o);
  if constexpr (kGated && Tile::kSplits > 1) cluster_wait();
}

constexpr int kGenericThreads = 128;

// Any K and V (sizes without a tiled instantiation). A CTA per (row of the batch, head); a thread owns the
// value columns tid, tid + 128, ... and walks their K key rows twice: S^T k̂ of the decayed state, then the
// update and S^T q̂. Coalesced across threads, but the state is read twice (the second time mostly from
// L1/L2), which is why the common sizes have the tiled kernel.
template <class XT>
__global__ void __launch_bounds__(kGenericThreads) kda_decode_generic_kernel(KdaDecodeParams<XT> p) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float generic_sh[];  // q, k, exp(g): [3][K]
  __shared__ Span span_shared;
  __shared__ float2 norm_scratch[32];
  const int kd = p.kdim, vd = p.vdim;
  float* q_sh = generic_sh;
  float* k_sh = generic_sh + kd;
  float* decay_sh = generic_sh + 2 * kd;

  const int h = blockIdx.y;
  const int64_t row = blockIdx.z;
  const int tid = threadIdx.x;
  const int64_t token_head = row * p.heads + h;
  __nv_bfloat16* out = p.out + token_head * vd;

  const Span span = block_find_span(p.table, p.num_spans, row, &span_shared);
  if (span.slot < 0) {
    for (int e = tid; e < vd; e += kGenericThreads) out[e] = __float2bfloat16_rn(0.0f);
    return;
  }
  const float* g = p.g + token_head * kd;
  const float2 factors = load_q_k_decay(
      p.q + token_head * kd, p.k + token_head * kd, [&](int d) { return g[d]; }, kd, q_sh, k_sh, decay_sh,
      norm_scratch);
  const float q_factor = factors.x, k_factor = factors.y;
  const float b = p.beta[token_head];

  float* state = p.state + (static_cast<int64_t>(span.slot) * p.heads + h) * kd * vd;  // [K, V]
  for (int e = tid; e < vd; e += kGenericThreads) {
    float kv = 0.0f;
    for (int d = 0; d < kd; ++d)
      kv += state[static_cast<int64_t>(d) * vd + e] * decay_sh[d] * (k_sh[d] * k_factor);
    const float u = b * (to_float(p.v[token_head * vd + e]) - kv);
    float o = 0.0f;
    for (int d = 0; d < kd; ++d) {
      float* sde = state + static_cast<int64_t>(d) * vd + e;
      const float s = *sde * decay_sh[d] + (k_sh[d] * k_factor) * u;
      *sde = s;
      o += s * (q_sh[d] * q_factor);
    }
    out[e] = __float2bfloat16_rn(o);
  }
}

template <int D, class XT, bool kGated>
void launch_kda_decode(const KdaDecodeParams<XT>& p, int64_t rows, cudaStream_t stream) {
  using Tile = DecodeTile<D>;
  const dim3 grid(Tile::kSplits, p.heads, static_cast<unsigned>(rows));
  launch_pdl(kda_decode_kernel<D, XT, kGated>, grid, Tile::kThreads, 0, stream, p,
             kGated ? Tile::kSplits : 1);
  HLM_CHECK_LAUNCH("kda_decode_kernel");
}

template <class XT>
void launch_kda_decode_generic(const KdaDecodeParams<XT>& p, int64_t rows, cudaStream_t stream) {
  const dim3 grid(1, p.heads, static_cast<unsigned>(rows));
  const size_t smem = 3 * sizeof(float) * static_cast<size_t>(p.kdim);
  launch_pdl(kda_decode_generic_kernel<XT>, grid, kGenericThreads, smem, stream, p);
  HLM_CHECK_LAUNCH("kda_decode_generic_kernel");
}

constexpr int64_t kGatedMaxHeadRows = 256;

}  // namespace

Tensor kda_decode(CudaContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                  const Tensor& beta, const SeqBatch& seqs, Tensor& state) {
  const char* op = "kda_decode";
  check_kda_core_args(op, q, k, v, g, beta, seqs, state);
  check_kda_decode_batch(op, q.dim(0), q.dim(2), seqs, state);
  const int64_t rows = q.dim(0), heads = q.dim(1), kd = q.dim(2), vd = v.dim(2);

  Tensor out = ctx.empty({rows, heads, vd}, DType::kBF16);  // [T, H, V]
  if (out.numel() == 0) return out;
  dispatch_float(q.dtype(), op, [&](auto tag) {
    using XT = typename decltype(tag)::type;
    const KdaDecodeParams<XT> p{kda_core_params<XT>(q, k, v, g, beta, seqs, state, out), static_cast<int>(kd),
                                static_cast<int>(vd), KdaGatedInputs{}};
    const bool tiled = kd == vd && dispatch_head_dim(kd, [&](auto dim) {
                         launch_kda_decode<decltype(dim)::value, XT, false>(p, rows, ctx.stream());
                       });
    if (!tiled) launch_kda_decode_generic(p, rows, ctx.stream());
  });
  return out;
}

bool kda_decode_gated(CudaContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& graw,
                      const Tensor& beta_logits, const Tensor& out_gate, const KdaHeadParams& hp,
                      const SeqBatch& seqs, Tensor& state, Tensor& out) {
  const char* op = "kda_decode_gated";
  check_kda_qkv_state(op, q, k, v, seqs, state);
  const int64_t rows = q.dim(0), heads = q.dim(1), kd = q.dim(2);
  // The fused kernel is the tiled one; other head sizes take the separate ops (the caller's fallback).
  if (v.dim(2) != kd || !dispatch_head_dim(kd, [](auto) {})) return false;
  // So do batches of more than kGatedMaxHeadRows (row, head) pairs. Measured on an H200 with 32 heads of
  // K = V = 128: the 48B decode step was faster with the fused kernel at batch 1, 2, 4 and 8 (by 0.3 to
  // 1.6%, same machine, alternating runs), while kernel_bench put the kernel alone at 5.1 µs against 6.9
  // for the separate ops at batch 1, 13.5 against 12.7 at batch 8, and 101 against 80 at batch 64.
  if (rows * heads > kGatedMaxHeadRows) return false;
  expect_cuda(graw, op, "graw", {DType::kBF16, DType::kF32}, 2, "[T, H*K]");
  expect_dim(graw, 0, rows, op, "graw [T, H*K]", "the token count of q [T, H, K]");
  expect_dim(graw, 1, heads * kd, op, "graw [T, H*K]", "H*K of q [T, H, K]");
  expect_cuda(beta_logits, op, "beta_logits", {DType::kBF16, DType::kF32}, 2, "[T, H]");
  expect_dim(beta_logits, 0, rows, op, "beta_logits [T, H]", "the token count of q [T, H, K]");
  expect_dim(beta_logits, 1, heads, op, "beta_logits [T, H]", "the head count of q [T, H, K]");
  expect_cuda(out_gate, op, "out_gate", {DType::kBF16, DType::kF32}, 3, "[T, H, V]");
  expect_same_shape(out_gate, v, op, "out_gate [T, H, V]", "v");
  check_kda_head_params(op, hp, heads, kd);
  check_kda_decode_batch(op, q.dim(0), q.dim(2), seqs, state);

  out = ctx.empty({rows, heads, kd}, DType::kBF16);  // [T, H, V]
  if (out.numel() == 0) return true;
  dispatch_float(q.dtype(), op, [&](auto tag) {
    using XT = typename decltype(tag)::type;
    KdaDecodeParams<XT> p{kda_core_params<XT>(q, k, v, Tensor(), Tensor(), seqs, state, out),
                          static_cast<int>(kd), static_cast<int>(kd), KdaGatedInputs{}};
    p.gated =
        KdaGatedInputs{float_in(graw),       float_in(beta_logits), float_in(out_gate), float_in(hp.a_log),
                       float_in(hp.dt_bias), float_in(hp.o_norm),   hp.lower_bound,     hp.eps};
    dispatch_head_dim(
        kd, [&](auto dim) { launch_kda_decode<decltype(dim)::value, XT, true>(p, rows, ctx.stream()); });
  });
  return true;
}

}  // namespace hlm::cuda
