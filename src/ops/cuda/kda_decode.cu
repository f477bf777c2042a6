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
// needs PDL, and the state loads below already come before any read of an earlier kernel's output (the
// span table is host-written metadata), so it can be added without reordering.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kda_common.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {
namespace {

template <class XT>
struct KdaDecodeParams : KdaCoreParams<XT> {
  int kdim;  // the generic kernel's sizes; the tiled kernel has them as template arguments
  int vdim;
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

// Loads q, k and exp(g) of one (token, head) ([kd] each) into shared memory and returns the l2norm factors
// of q (with its K^-0.5 scale) and of k; the whole block takes part, and the arrays are visible to every
// thread on return. `scratch` holds 32 float2.
template <class XT>
__device__ __forceinline__ float2 load_q_k_decay(const XT* q, const XT* k, const float* g, int kd,
                                                 float* q_sh, float* k_sh, float* decay_sh, float2* scratch) {
  float q_sq = 0.0f, k_sq = 0.0f;
  for (int d = threadIdx.x; d < kd; d += blockDim.x) {
    const float qd = to_float(q[d]), kk = to_float(k[d]);
    q_sh[d] = qd;
    k_sh[d] = kk;
    decay_sh[d] = expf(g[d]);
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

// Grid (kSplits, H, T): a CTA per (row of the batch, head, kCols value columns). Every column of S^T k̂,
// of the update and of S^T q̂ involves only that column of the state, so splitting V needs no exchange
// between CTAs; each CTA recomputes the (cheap) norms of q and k. A thread keeps its kRows × 4 state
// values in registers from load to store; the two sums over key rows (S^T k̂ after the decay, S^T q̂ after
// the update) are a warp butterfly plus one shared-memory step. A row that no span covers gets zeros.
template <int D, class XT>
__global__ void __launch_bounds__(DecodeTile<D>::kThreads) kda_decode_kernel(KdaDecodeParams<XT> p) {
  pdl_wait();
  pdl_trigger();
  using Tile = DecodeTile<D>;
  __shared__ Span span_shared;
  __shared__ float q_sh[D], k_sh[D], decay_sh[D];  // raw q and k (the norm factors apply on use), exp(g)
  __shared__ float2 norm_scratch[32];
  __shared__ float4 kv_scratch[Tile::kWarps * Tile::kQuads], o_scratch[Tile::kWarps * Tile::kQuads];

  const int h = blockIdx.y;
  const int64_t row = blockIdx.z;
  const int tid = threadIdx.x, quad = tid % Tile::kQuads, row_group = tid / Tile::kQuads;
  const int col = blockIdx.x * Tile::kCols + quad * 4;  // the first of this thread's 4 value columns
  const int64_t token_head = row * p.heads + h;         // index of (row, h) in [T, H, ...]
  __nv_bfloat16* out = p.out + token_head * D + col;

  const Span span = block_find_span(p.table, p.num_spans, row, &span_shared);
  if (span.slot < 0) {  // padding or a row of no sequence: zero output, no state
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

  const float2 factors = load_q_k_decay(p.q + token_head * D, p.k + token_head * D, p.g + token_head * D, D,
                                        q_sh, k_sh, decay_sh, norm_scratch);
  const float q_factor = factors.x, k_factor = factors.y;
  const float b = p.beta[token_head];
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

  // S += k̂ uᵀ, written back at once; o = S^T q̂ of the updated state.
  float4 o = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) {
    const int d = row_group + Tile::kRowGroups * i;
    s[i] += u * (k_sh[d] * k_factor);
    *reinterpret_cast<float4*>(state + d * D) = s[i];
    o += s[i] * (q_sh[d] * q_factor);
  }
  o = sum_over_rows<Tile>(o, o_scratch);
  if (row_group == 0) store4_bf16(out, o);
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
  const float2 factors = load_q_k_decay(p.q + token_head * kd, p.k + token_head * kd, p.g + token_head * kd,
                                        kd, q_sh, k_sh, decay_sh, norm_scratch);
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

template <int D, class XT>
void launch_kda_decode(const KdaDecodeParams<XT>& p, int64_t rows, cudaStream_t stream) {
  using Tile = DecodeTile<D>;
  const dim3 grid(Tile::kSplits, p.heads, static_cast<unsigned>(rows));
  launch_pdl(kda_decode_kernel<D, XT>, grid, Tile::kThreads, 0, stream, p);
  HLM_CHECK_LAUNCH("kda_decode_kernel");
}

template <class XT>
void launch_kda_decode_generic(const KdaDecodeParams<XT>& p, int64_t rows, cudaStream_t stream) {
  const dim3 grid(1, p.heads, static_cast<unsigned>(rows));
  const size_t smem = 3 * sizeof(float) * static_cast<size_t>(p.kdim);
  launch_pdl(kda_decode_generic_kernel<XT>, grid, kGenericThreads, smem, stream, p);
  HLM_CHECK_LAUNCH("kda_decode_generic_kernel");
}

}  // namespace

Tensor kda_decode(CudaContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                  const Tensor& beta, const SeqBatch& seqs, Tensor& state) {
  const char* op = "kda_decode";
  check_kda_core_args(op, q, k, v, g, beta, seqs, state);
  for (size_t i = 0; i < seqs.spans.size(); ++i) {
    HLM_CHECK(seqs.spans[i].token_count <= 1,
              "kda_decode: sequence {} has {} new tokens; decode takes at most 1 (use kda_prefill for more)",
              i, seqs.spans[i].token_count);
  }
  const int64_t rows = q.dim(0), heads = q.dim(1), kd = q.dim(2), vd = v.dim(2);
  HLM_CHECK(rows <= 65535, "kda_decode: {} rows in one decode batch; the grid takes at most 65535", rows);
  HLM_CHECK(3 * kd * static_cast<int64_t>(sizeof(float)) <= 48 * 1024,
            "kda_decode: key dimension {} is too large for the kernel's shared memory (at most 4096)", kd);
  HLM_CHECK(reinterpret_cast<uintptr_t>(state.raw()) % 16 == 0,
            "kda_decode: the state must be 16-byte aligned for vector access");

  Tensor out = ctx.empty({rows, heads, vd}, DType::kBF16);  // [T, H, V]
  if (out.numel() == 0) return out;
  dispatch_float(q.dtype(), op, [&](auto tag) {
    using XT = typename decltype(tag)::type;
    const KdaDecodeParams<XT> p{kda_core_params<XT>(q, k, v, g, beta, seqs, state, out), static_cast<int>(kd),
                                static_cast<int>(vd)};
    const bool tiled = kd == vd && dispatch_head_dim(kd, [&](auto dim) {
                         launch_kda_decode<decltype(dim)::value>(p, rows, ctx.stream());
                       });
    if (!tiled) launch_kda_decode_generic(p, rows, ctx.stream());
  });
  return out;
}

}  // namespace hlm::cuda
