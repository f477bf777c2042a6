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
#include <cooperative_groups.h>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kda_common.cuh"
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

// How kda_decode_kernel<D> splits one head's [D, D] state: each CTA takes all D key rows of kCols value
// columns; inside it a thread owns one float4 of columns on kRows key rows strided by kRowGroups.
template <int D>
struct DecodeTile {
  static constexpr int kCols = D < 32 ? D : 32;  // value columns per CTA (one 128-byte segment per row)
  static constexpr int kSplits = D / kCols;      // CTAs per (token, head): 4 at D = 128
  static constexpr int kQuads = kCols / 4;       // threads along a row, a float4 each
  static constexpr int kRowGroups = 16;          // threads along the key rows
  static constexpr int kThreads = kQuads * kRowGroups;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRows = D / kRowGroups;  // key rows per thread: 8 float4 = 32 registers at D = 128
  static_assert(D % kCols == 0 && kCols % 4 == 0 && kThreads % 32 == 0 && D % kRowGroups == 0);
};

__device__ __forceinline__ float4 operator*(float4 a, float s) {
  return {a.x * s, a.y * s, a.z * s, a.w * s};
}
__device__ __forceinline__ float4& operator+=(float4& a, float4 b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
  return a;
}

// Sum of a float4 over the kRowGroups threads that share a column quad; every thread gets its quad's sum.
// Those threads are lanes kQuads apart within a warp (butterfly), then one partial per warp in `scratch`
// ([kWarps][kQuads]).
template <class Tile>
__device__ __forceinline__ float4 sum_over_rows(float4 v, float4* scratch) {
#pragma unroll
  for (int offset = Tile::kQuads; offset < 32; offset <<= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
    v.z += __shfl_xor_sync(0xffffffffu, v.z, offset);
    v.w += __shfl_xor_sync(0xffffffffu, v.w, offset);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane < Tile::kQuads) scratch[warp * Tile::kQuads + lane] = v;
  __syncthreads();
  float4 total = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int w = 0; w < Tile::kWarps; ++w) total += scratch[w * Tile::kQuads + lane % Tile::kQuads];
  return total;
}

// Loads q, k and the decays exp(log_decay(d)) of one (token, head) ([kd] each) into shared memory and
// returns the l2norm factors of q (with its K^-0.5 scale) and of k; the whole block takes part, and the
// arrays are visible to every thread on return. `scratch` holds 32 float2.
template <class XT, class LogDecay>
__device__ __forceinline__ float2 load_q_k_decay(const XT* q, const XT* k, LogDecay log_decay, int kd,
                                                 float* q_sh, float* k_sh, float* decay_sh, float2* scratch) {
  float q_sq = 0.0f, k_sq = 0.0f;
  for (int d = threadIdx.x; d < kd; d += blockDim.x) {
    const float qd = to_float(q[d]), kk = to_float(k[d]);
    q_sh[d] = qd;
    k_sh[d] = kk;
    decay_sh[d] = expf(log_decay(d));
    q_sq += qd * qd;
    k_sq += kk * kk;
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

template <class XT>
__device__ __forceinline__ float4 load4(const XT* p) {
  return {to_float(p[0]), to_float(p[1]), to_float(p[2]), to_float(p[3])};
}
__device__ __forceinline__ void store4_bf16(__nv_bfloat16* p, float4 v) {
  reinterpret_cast<__nv_bfloat162*>(p)[0] = __floats2bfloat162_rn(v.x, v.y);
  reinterpret_cast<__nv_bfloat162*>(p)[1] = __floats2bfloat162_rn(v.z, v.w);
}

// Cluster barrier halves (PTX barrier.cluster). The release arrive orders this CTA's earlier writes (its
// partial sum in shared memory) before the peers' acquire wait; the relaxed arrive orders nothing, which
// is all the final barrier needs: the peers' reads of this CTA's shared memory have completed (their
// values are in use) when they arrive.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The gated RMSNorm of one head's output (kda_decode_gated): the thread's 4 columns of o, normalized over
// all D columns of the head, which the kSplits CTAs of the cluster hold between them. Every thread of the
// cluster calls it; the row_group 0 threads (warp 0's first kQuads lanes, one per column quad) hold o.
// With a cluster it returns after arriving at the final barrier; the caller waits there (cluster_wait)
// before it exits, so no CTA frees the shared memory a peer still reads.
template <class Tile, int D>
__device__ __forceinline__ float4 gated_norm(float4 o, const KdaGatedInputs& in, int64_t token_head, int col,
                                             float* sum_sq_sh) {
  if (threadIdx.x < 32) {
    const float sq = threadIdx.x < Tile::kQuads ? o.x * o.x + o.y * o.y + o.z * o.z + o.w * o.w : 0.0f;
    const float total = warp_sum(sq);
    if (threadIdx.x == 0) *sum_sq_sh = total;
  }
  float sum_sq = 0.0f;
  if constexpr (Tile::kSplits > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster_arrive_release();
    cluster_wait();
#pragma unroll
    for (int r = 0; r < Tile::kSplits; ++r) sum_sq += *cluster.map_shared_rank(sum_sq_sh, r);
    cluster_arrive_relaxed();
  } else {
    __syncthreads();
    sum_sq = *sum_sq_sh;
  }
  const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(D) + in.eps);
  const int64_t base = token_head * D + col;
  float y[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    // Weight before gate, no (1 + w), sigmoid gate (docs/MODEL.md §5.7), as gated_rms_norm.
    y[c] = in.o_norm.load(col + c) * (y[c] * inv) * logistic(in.out_gate.load(base + c));
  }
  return {y[0], y[1], y[2], y[3]};
}

// Grid (kSplits, H, T): a CTA per (row of the batch, head, kCols value columns). Every column of S^T k̂,
// of the update and of S^T q̂ involves only that column of the state, so splitting V needs no exchange
// between CTAs; each CTA recomputes the (cheap) norms of q and k. A thread keeps its kRows × 4 state
// values in registers from load to store; the two sums over key rows (S^T k̂ after the decay, S^T q̂ after
// the update) are a warp butterfly plus one shared-memory step. A row that no span covers gets zeros.
// kGated: kda_decode_gated (the file comment), launched in clusters of kSplits CTAs along x.
// PDL: the span lookup and the state loads come before pdl_wait(). The span table is host-written
// metadata, and the state is written only by this layer's own decode or prefill kernel of an earlier step
// (or reset between steps), never by the kernel just before this one; every earlier kernel has completed
// once this grid runs (pdl.cuh). So the 16 KB of state per CTA stream in while the short conv finishes.
template <int D, class XT, bool kGated>
__global__ void __launch_bounds__(DecodeTile<D>::kThreads) kda_decode_kernel(KdaDecodeParams<XT> p) {
  using Tile = DecodeTile<D>;
  __shared__ Span span_shared;
  __shared__ float q_sh[D], k_sh[D], decay_sh[D];  // raw q and k (the norm factors apply on use), exp(g)
  __shared__ float2 norm_scratch[32];
  __shared__ float4 kv_scratch[Tile::kWarps * Tile::kQuads], o_scratch[Tile::kWarps * Tile::kQuads];
  __shared__ float sum_sq_sh;  // kGated: this CTA's Σ o² over its columns

  const int h = blockIdx.y;
  const int64_t row = blockIdx.z;
  const int tid = threadIdx.x, quad = tid % Tile::kQuads, row_group = tid / Tile::kQuads;
  const int col = blockIdx.x * Tile::kCols + quad * 4;  // the first of this thread's 4 value columns
  const int64_t token_head = row * p.heads + h;         // index of (row, h) in [T, H, ...]
  __nv_bfloat16* out = p.out + token_head * D + col;

  const Span span = block_find_span(p.table, p.num_spans, row, &span_shared);
  if (span.slot < 0) {  // padding or a row of no sequence: zero output, no state
    pdl_wait();
    pdl_trigger();
    if (row_group == 0) store4_bf16(out, {0.0f, 0.0f, 0.0f, 0.0f});
    return;
  }

  float* state =
      p.state + (static_cast<int64_t>(span.slot) * p.heads + h) * D * D + col;  // [D] rows, stride D
  float4 s[Tile::kRows];  // rows row_group + kRowGroups·i, columns col .. col+3
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) {
    s[i] = *reinterpret_cast<const float4*>(state + (row_group + Tile::kRowGroups * i) * D);
  }
  pdl_wait();
  pdl_trigger();

  float2 factors;
  float b;
  if constexpr (kGated) {
    const KdaGatedInputs& in = p.gated;
    const float rate = expf(in.a_log.load(h));
    factors = load_q_k_decay(
        p.q + token_head * D, p.k + token_head * D,
        [&](int d) {
          return kda_gate_value(in.graw.load(token_head * D + d) + in.dt_bias.load(h * D + d), rate,
                                in.lower_bound);
        },
        D, q_sh, k_sh, decay_sh, norm_scratch);
    b = logistic(in.beta_logits.load(token_head));
  } else {
    const float* g = p.g + token_head * D;
    factors = load_q_k_decay(
        p.q + token_head * D, p.k + token_head * D, [&](int d) { return g[d]; }, D, q_sh, k_sh, decay_sh,
        norm_scratch);
    b = p.beta[token_head];
  }
  const float q_factor = factors.x, k_factor = factors.y;
  const float4 v = load4(p.v + token_head * D + col);

  // Decay first, then kv = S^T k̂ of the decayed state.
  float4 kv = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) {
    const int d = row_group + Tile::kRowGroups * i;
    s[i] = s[i] * decay_sh[d];
    kv += s[i] * (k_sh[d] * k_factor);
  }
  kv = sum_over_rows<Tile>(kv, kv_scratch);
  const float4 u = {b * (v.x - kv.x), b * (v.y - kv.y), b * (v.z - kv.z), b * (v.w - kv.w)};

  // S += k̂ uᵀ; o = S^T q̂ of the updated state. The plain kernel writes each state row back at once; the
  // gated one after the cluster's release barrier, which would otherwise wait for those 16 KB of stores.
  float4 o = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) {
    const int d = row_group + Tile::kRowGroups * i;
    s[i] += u * (k_sh[d] * k_factor);
    if constexpr (!kGated) *reinterpret_cast<float4*>(state + d * D) = s[i];
    o += s[i] * (q_sh[d] * q_factor);
  }
  o = sum_over_rows<Tile>(o, o_scratch);
  if constexpr (kGated) {
    o = gated_norm<Tile, D>(o, p.gated, token_head, col, &sum_sq_sh);
#pragma unroll
    for (int i = 0; i < Tile::kRows; ++i)
      *reinterpret_cast<float4*>(state + (row_group + Tile::kRowGroups * i) * D) = s[i];
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

// Checks kda_decode's arguments beyond the core's: one token per sequence, the grid and alignment limits.
void check_decode_args(const char* op, const Tensor& q, const SeqBatch& seqs, const Tensor& state) {
  for (size_t i = 0; i < seqs.spans.size(); ++i) {
    HLM_CHECK(seqs.spans[i].token_count <= 1,
              "{}: sequence {} has {} new tokens; decode takes at most 1 (use kda_prefill for more)", op, i,
              seqs.spans[i].token_count);
  }
  const int64_t rows = q.dim(0), kd = q.dim(2);
  HLM_CHECK(rows <= 65535, "{}: {} rows in one decode batch; the grid takes at most 65535", op, rows);
  HLM_CHECK(3 * kd * static_cast<int64_t>(sizeof(float)) <= 48 * 1024,
            "{}: key dimension {} is too large for the kernel's shared memory (at most 4096)", op, kd);
  HLM_CHECK(reinterpret_cast<uintptr_t>(state.raw()) % 16 == 0,
            "{}: the state must be 16-byte aligned for vector access", op);
}

}  // namespace

Tensor kda_decode(CudaContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                  const Tensor& beta, const SeqBatch& seqs, Tensor& state) {
  const char* op = "kda_decode";
  check_kda_core_args(op, q, k, v, g, beta, seqs, state);
  check_decode_args(op, q, seqs, state);
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
  expect_cuda(hp.a_log, op, "a_log", {DType::kF32, DType::kBF16}, 1, "[H]");
  expect_dim(hp.a_log, 0, heads, op, "a_log [H]", "the head count of q [T, H, K]");
  expect_cuda(hp.dt_bias, op, "dt_bias", {DType::kF32, DType::kBF16}, 1, "[H*K]");
  expect_dim(hp.dt_bias, 0, heads * kd, op, "dt_bias [H*K]", "H*K of q [T, H, K]");
  expect_cuda(hp.o_norm, op, "o_norm", {DType::kF32, DType::kBF16}, 1, "[V]");
  expect_dim(hp.o_norm, 0, kd, op, "o_norm [V]", "the head dimension of v [T, H, V]");
  HLM_CHECK(hp.lower_bound <= 0.0f, "{}: lower_bound must be 0 (softplus gate) or negative, got {}", op,
            hp.lower_bound);
  check_decode_args(op, q, seqs, state);

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
