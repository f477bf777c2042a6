// KDA chunked prefill (docs/MODEL.md §5.6), the same function as ops/cpu/kda.cc kda_prefill: chunks of 64
// aligned to each sequence's first new token, the last one partial, every decay pairwise exp(Γ_i − Γ_j)
// with i ≥ j (Γ is summed in double, as in the CPU op, so that the difference of two large cumulative sums
// keeps its precision: softplus gates take Γ to −1000s within a chunk). fp32 math throughout, on CUDA cores.
//
// Two kernels, split where the math splits (KERNELS.md §4.2, fla's chunk_kda):
//  1. kda_chunk_kernel, grid (chunks, H, S), fully parallel: everything of a chunk that does not depend on
//     the state entering it. q̂, k̂, Γ, Aqk, Akk, the forward substitutions for U and W, and the decayed
//     operands QG = q̂ ⊙ exp(Γ_i), KG = k̂ ⊙ exp(Γ_last − Γ_i), exp(Γ_last), into an fp32 workspace.
//  2. kda_chain_kernel, grid (V / 32, H, S): the serial part, one CTA per (sequence, head, 32 value
//     columns) carrying its slice of the state in shared memory through the sequence's chunks:
//     Vn = U − W·S, O = QG·S + Aqk·Vn, S = diag(exp(Γ_last))·S + KGᵀ·Vn. Every one of these is separable
//     over value columns, so V splits across CTAs with no exchange.
//
// Cost at K = V = 128 per (token, head). Bytes: q, k, v (bf16) and g (fp32) in, ≈ 1.3 KB; the workspace,
// ≈ 2.3 KB written once and read back by each of the 4 column CTAs of kernel 2 (≈ 7.5 KB of reads, mostly
// L2 hits); the output, 256 B. FLOPs: kernel 1 ≈ 21 K for the pairwise-decayed Aqk/Akk dot products plus
// K·C/2 ≈ 4 K expf (the exact pairwise decays), and ≈ 16 K for the two forward substitutions; kernel 2
// ≈ 104 K (W·S, QG·S and the state update at 32 K each, Aqk·Vn 8 K). All on fp32 CUDA cores from shared
// memory, so this is ALU/shared-memory bound, not memory bound: at 32 heads and 8K tokens ≈ 37 GFLOP,
// with kernel 2 the long pole at batch 1 (128 CTAs, 1.7 MFLOP per CTA per chunk, 128 chunks in sequence;
// estimated 1.5–2.5 ms for the whole prefill; measured on an H200: 5.1 ms, where fla chunk_kda took 1.54 ms
// in an earlier job of tools/bench_kernels.py). Reaching the 1.2×-fla target
// needs tensor cores for the three [64 × 128 × 32] products of kernel 2 and for Aqk/Akk with sub-chunk
// anchors (bounded gate) or exact diagonal blocks (softplus gate) (KERNELS.md §1, §4.2), a bf16 workspace,
// and segment parallelism across a sequence at batch 1; this version is the exact fp32 form they are
// checked against.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kda_common.cuh"

namespace hlm::cuda {
namespace {

constexpr int kChunk = 64;
// Threads per CTA. Both kernels fit one CTA per SM (their shared memory), and they stall mostly on
// shared-memory loads (ncu on an H200: 12.5% occupancy at 256 threads, 32% of issue slots busy), so the
// warps of that one CTA are what hides the latency. Measured on an H200 (kernel_bench --kda-prefill, 32
// heads, K = V = 128, 8K tokens, batch 1; chunk / chain threads): 256 / 256 8.41 ms, 512 / 512 5.57,
// 512 / 1024 5.62, 1024 / 1024 5.13, 1024 / 512 5.11 (64K tokens: 66.1 against 39.9 ms).
constexpr int kChunkThreads = 1024;
// The chain's: at most kCols·D (ChainTile), so that each thread owns at least one state row.
template <int D>
constexpr int kChainThreads = D >= 32 ? 512 : 256;

// q, k, v are [T, H, D] (K = V = D).
template <class XT>
struct KdaPrefillParams : KdaCoreParams<XT> {
  int max_tokens;  // the host spans' largest token_count: the launch covers this many per sequence
  // Workspace, per (row, head) of the batch; written by kda_chunk_kernel, read by kda_chain_kernel.
  float* qg;     // [T, H, D] q̂_i ⊙ exp(Γ_i)
  float* kg;     // [T, H, D] k̂_i ⊙ exp(Γ_last − Γ_i)
  float* w;      // [T, H, D] W
  float* u;      // [T, H, D] U
  float* aqk;    // [T, H, kChunk] row i of the chunk's Aqk, entries j ≤ i
  float* decay;  // [T, H, D] exp(Γ_last), at the chunk's first row only
};

// kda_chunk_kernel's shared memory: Γ [C][D+1] double, q̂ then U [C][D+1], k̂ then W [C][D+1],
// Akk [C][C+1], β [C]. Rows are padded by one element so that walks down a column (lanes over rows) fall
// in distinct banks.
template <int D>
struct ChunkSmem {
  static constexpr int kPad = D + 1;
  static constexpr size_t kBytes =
      sizeof(double) * kChunk * kPad + sizeof(float) * (2 * kChunk * kPad + kChunk * (kChunk + 1) + kChunk);
};

// Grid (chunks, H, S): a CTA per (sequence, head, chunk of 64 tokens), kThreads / 32 warps.
//  - q̂, k̂: a warp per token row (lanes over key channels, warp-sum of squares). Γ: a thread per key
//    channel summing down the rows in double.
//  - Aqk, Akk: a warp per row i, lanes over j ≤ i, each lane a full dot product over the key channels with
//    its own expf(Γ_i − Γ_j) per channel (pairwise, never factored).
//  - the per-element operands QG, KG, exp(Γ_last) and the right sides β v and β k̂ ⊙ exp(Γ): a thread per
//    element.
//  - the forward substitutions through the unit lower triangular (I + Akk): a thread per column of U or W
//    (2D columns), rows in order, each row written to the workspace as soon as it is final.
template <int D, class XT, int kThreads>
__global__ void __launch_bounds__(kThreads) kda_chunk_kernel(KdaPrefillParams<XT> p) {
  constexpr int kWarps = kThreads / 32;
  using Smem = ChunkSmem<D>;
  constexpr int kPad = Smem::kPad;
  constexpr int kAkkPad = kChunk + 1;
  extern __shared__ double chunk_smem[];
  double* gamma = chunk_smem;                                   // [C][kPad] Γ_i
  float* qs = reinterpret_cast<float*>(gamma + kChunk * kPad);  // [C][kPad] q̂, then U
  float* ks = qs + kChunk * kPad;                               // [C][kPad] k̂, then W
  float* akk = ks + kChunk * kPad;                              // [C][kAkkPad] strictly lower
  float* beta = akk + kChunk * kAkkPad;                         // [C]

  const int chunk = blockIdx.x, h = blockIdx.y;
  const Span span = load_span(p.table, blockIdx.z);
  const int count = min(span.count, p.max_tokens);
  const int c0 = chunk * kChunk;
  if (span.slot < 0 || count <= c0) return;  // padding, or a sequence shorter than this chunk
  const int m = min(kChunk, count - c0);     // rows in this chunk
  const int64_t row0 = static_cast<int64_t>(span.begin) + c0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Index of (row i of the chunk, head h) in [T, H, ...].
  auto token_head = [&](int i) { return (row0 + i) * p.heads + h; };

  const float q_scale = 1.0f / sqrtf(static_cast<float>(D));
  for (int i = warp; i < m; i += kWarps) {
    const XT* q = p.q + token_head(i) * D;
    const XT* k = p.k + token_head(i) * D;
    float q_sq = 0.0f, k_sq = 0.0f;
    for (int d = lane; d < D; d += 32) {
      const float qd = to_float(q[d]), kd = to_float(k[d]);
      qs[i * kPad + d] = qd;
      ks[i * kPad + d] = kd;
      q_sq += qd * qd;
      k_sq += kd * kd;
    }
    const float q_factor = l2_factor(warp_sum(q_sq), q_scale);
    const float k_factor = l2_factor(warp_sum(k_sq), 1.0f);
    for (int d = lane; d < D; d += 32) {  // the elements this lane wrote
      qs[i * kPad + d] *= q_factor;
      ks[i * kPad + d] *= k_factor;
    }
    if (lane == 0) beta[i] = p.beta[token_head(i)];
  }
  for (int d = tid; d < D; d += kThreads) {
    double sum = 0.0;
    for (int i = 0; i < m; ++i) {
      sum += p.g[token_head(i) * D + d];
      gamma[i * kPad + d] = sum;
    }
  }
  __syncthreads();

  // Aqk[i][j] = Σ_d q̂_i k̂_j exp(Γ_i − Γ_j) (j ≤ i), Akk[i][j] = β_i Σ_d k̂_i k̂_j exp(Γ_i − Γ_j) (j < i).
  for (int i = warp; i < m; i += kWarps) {
    for (int j = lane; j <= i; j += 32) {
      float dot_q = 0.0f, dot_k = 0.0f;
#pragma unroll 4
      for (int d = 0; d < D; ++d) {
        const float k_decayed =
            ks[j * kPad + d] * expf(static_cast<float>(gamma[i * kPad + d] - gamma[j * kPad + d]));
        dot_q += qs[i * kPad + d] * k_decayed;
        dot_k += ks[i * kPad + d] * k_decayed;
      }
      p.aqk[token_head(i) * kChunk + j] = dot_q;
      if (j < i) akk[i * kAkkPad + j] = beta[i] * dot_k;
    }
  }
  __syncthreads();

  // Operands decayed to the chunk's start or end, and the right sides of the two triangular systems
  // (β_i v_i into qs, β_i k̂_i ⊙ exp(Γ_i) into ks). Element (i, d) is read and rewritten by one thread.
  for (int e = tid; e < m * D; e += kThreads) {
    const int i = e / D, d = e % D;
    const double gamma_i = gamma[i * kPad + d];
    const float from_start = expf(static_cast<float>(gamma_i));  // exp(Γ_i)
    const int64_t at = token_head(i) * D + d;
    p.qg[at] = qs[i * kPad + d] * from_start;
    p.kg[at] = ks[i * kPad + d] * expf(static_cast<float>(gamma[(m - 1) * kPad + d] - gamma_i));
    if (i == m - 1) p.decay[token_head(0) * D + d] = from_start;
    qs[i * kPad + d] = beta[i] * to_float(p.v[at]);
    ks[i * kPad + d] = beta[i] * ks[i * kPad + d] * from_start;
  }
  __syncthreads();

  // U[i] = β_i v_i − Σ_{j<i} Akk[i][j] U[j] and W[i] = β_i k̂_i ⊙ exp(Γ_i) − Σ_{j<i} Akk[i][j] W[j], in place.
  for (int col = tid; col < 2 * D; col += kThreads) {
    float* x = col < D ? qs : ks;
    float* dst = col < D ? p.u : p.w;
    const int e = col % D;
    for (int i = 0; i < m; ++i) {
      float acc = x[i * kPad + e];
      for (int j = 0; j < i; ++j) acc -= akk[i * kAkkPad + j] * x[j * kPad + e];
      x[i * kPad + e] = acc;
      dst[token_head(i) * D + e] = acc;
    }
  }
}

// How kda_chain_kernel<D> splits a head: kCols value columns per CTA; a thread owns one column (lanes over
// columns) and, within the chunk, rows row_group + kRowGroups·r of the chunk (kRowsI of them) and of the
// state (kRowsD of them).
template <int D, int kThreads>
struct ChainTile {
  static constexpr int kCols = D < 32 ? D : 32;
  static constexpr int kSplits = D / kCols;
  static constexpr int kRowGroups = kThreads / kCols;
  static constexpr int kRowsI = kChunk / kRowGroups;
  static constexpr int kRowsD = D / kRowGroups;
  static_assert(D % kCols == 0 && kChunk % kRowGroups == 0 && D % kRowGroups == 0);
  // Shared memory: the state slice [D][kCols], W, QG, KG [C][D], U then Vn [C][kCols], Aqk [C][C],
  // exp(Γ_last) [D].
  static constexpr size_t kSmemBytes =
      sizeof(float) * (D * kCols + 3 * kChunk * D + kChunk * kCols + kChunk * kChunk + D);
};

// Grid (kSplits, H, S): a CTA per (sequence, head, kCols value columns), kThreads / 32 warps, walking the
// sequence's chunks in order with its [D, kCols] slice of the state in shared memory. Per chunk: the chunk's
// workspace rows are staged in shared memory (rows past the chunk's end as zeros); each thread computes Vn
// and the state part of O for its kRowsI rows (one pass over the key channels, the W and QG reads are
// broadcasts within a warp); then the in-chunk part of O and the state update for its kRowsD state rows.
template <int D, class XT, int kThreads>
__global__ void __launch_bounds__(kThreads) kda_chain_kernel(KdaPrefillParams<XT> p) {
  using Tile = ChainTile<D, kThreads>;
  constexpr int kCols = Tile::kCols, kRowGroups = Tile::kRowGroups;
  extern __shared__ float chain_smem[];
  float* st = chain_smem;                      // [D][kCols] the state slice
  float* w_sh = st + D * kCols;                // [C][D]
  float* qg_sh = w_sh + kChunk * D;            // [C][D]
  float* kg_sh = qg_sh + kChunk * D;           // [C][D]
  float* u_sh = kg_sh + kChunk * D;            // [C][kCols] U, then Vn
  float* aqk_sh = u_sh + kChunk * kCols;       // [C][C]
  float* decay_sh = aqk_sh + kChunk * kChunk;  // [D]

  const int h = blockIdx.y;
  const Span span = load_span(p.table, blockIdx.z);
  const int count = min(span.count, p.max_tokens);
  if (span.slot < 0 || count <= 0) return;
  const int tid = threadIdx.x, e = tid % kCols, row_group = tid / kCols;
  const int col0 = blockIdx.x * kCols;
  float* state = p.state + (static_cast<int64_t>(span.slot) * p.heads + h) * D * D;  // [D, D]
  for (int x = tid; x < D * kCols; x += kThreads) st[x] = state[(x / kCols) * D + col0 + x % kCols];

  for (int c0 = 0; c0 < count; c0 += kChunk) {
    const int m = min(kChunk, count - c0);
    const int64_t row0 = static_cast<int64_t>(span.begin) + c0;
    auto token_head = [&](int i) { return (row0 + i) * p.heads + h; };
    for (int x = tid; x < kChunk * D; x += kThreads) {
      const int i = x / D;
      const int64_t at = token_head(i) * D + x % D;
      w_sh[x] = i < m ? p.w[at] : 0.0f;
      qg_sh[x] = i < m ? p.qg[at] : 0.0f;
      kg_sh[x] = i < m ? p.kg[at] : 0.0f;
    }
    for (int x = tid; x < kChunk * kCols; x += kThreads) {
      const int i = x / kCols;
      u_sh[x] = i < m ? p.u[token_head(i) * D + col0 + x % kCols] : 0.0f;
    }
    for (int x = tid; x < kChunk * kChunk; x += kThreads) {
      const int i = x / kChunk, j = x % kChunk;
      aqk_sh[x] = i < m && j <= i ? p.aqk[token_head(i) * kChunk + j] : 0.0f;
    }
    for (int d = tid; d < D; d += kThreads) decay_sh[d] = p.decay[token_head(0) * D + d];
    __syncthreads();

    // Against the state at the chunk's start: Vn = U − W·S (in place of U) and O = QG·S.
    float vn[Tile::kRowsI], o[Tile::kRowsI];
#pragma unroll
    for (int r = 0; r < Tile::kRowsI; ++r) {
      vn[r] = u_sh[(row_group + kRowGroups * r) * kCols + e];
      o[r] = 0.0f;
    }
    for (int d = 0; d < D; ++d) {
      const float s = st[d * kCols + e];
#pragma unroll
      for (int r = 0; r < Tile::kRowsI; ++r) {
        const int i = row_group + kRowGroups * r;
        o[r] += qg_sh[i * D + d] * s;
        vn[r] -= w_sh[i * D + d] * s;
      }
    }
#pragma unroll
    for (int r = 0; r < Tile::kRowsI; ++r) u_sh[(row_group + kRowGroups * r) * kCols + e] = vn[r];
    __syncthreads();  // all of Vn, and every read of the state at the chunk's start, are done

    // Within the chunk: O[i] += Σ_{j≤i} Aqk[i][j] Vn[j].
#pragma unroll
    for (int r = 0; r < Tile::kRowsI; ++r) {
      const int i = row_group + kRowGroups * r;
      if (i < m) {
        float acc = o[r];
        for (int j = 0; j <= i; ++j) acc += aqk_sh[i * kChunk + j] * u_sh[j * kCols + e];
        p.out[token_head(i) * D + col0 + e] = __float2bfloat16_rn(acc);
      }
    }
    // S = diag(exp(Γ_last)) S + Σ_j KG_j Vn_jᵀ; a thread updates only its own state elements.
    float sn[Tile::kRowsD];
#pragma unroll
    for (int r = 0; r < Tile::kRowsD; ++r) {
      const int d = row_group + kRowGroups * r;
      sn[r] = st[d * kCols + e] * decay_sh[d];
    }
    for (int j = 0; j < m; ++j) {
      const float vn_j = u_sh[j * kCols + e];
#pragma unroll
      for (int r = 0; r < Tile::kRowsD; ++r) sn[r] += kg_sh[j * D + row_group + kRowGroups * r] * vn_j;
    }
#pragma unroll
    for (int r = 0; r < Tile::kRowsD; ++r) st[(row_group + kRowGroups * r) * kCols + e] = sn[r];
    __syncthreads();  // before the next chunk restages the buffers and reads the updated state
  }
  for (int x = tid; x < D * kCols; x += kThreads) state[(x / kCols) * D + col0 + x % kCols] = st[x];
}

template <int D, class XT>
void launch_kda_prefill(const KdaPrefillParams<XT>& p, cudaStream_t stream) {
  const unsigned chunks = blocks_for(p.max_tokens, kChunk);
  const size_t chunk_smem = ChunkSmem<D>::kBytes;
  HLM_CUDA_CHECK(cudaFuncSetAttribute(kda_chunk_kernel<D, XT, kChunkThreads>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(chunk_smem)));
  const dim3 chunk_grid(chunks, p.heads, p.num_spans);
  kda_chunk_kernel<D, XT, kChunkThreads><<<chunk_grid, kChunkThreads, chunk_smem, stream>>>(p);
  HLM_CHECK_LAUNCH("kda_chunk_kernel");

  constexpr int kThreads = kChainThreads<D>;
  using Tile = ChainTile<D, kThreads>;
  HLM_CUDA_CHECK(cudaFuncSetAttribute(kda_chain_kernel<D, XT, kThreads>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tile::kSmemBytes)));
  const dim3 chain_grid(Tile::kSplits, p.heads, p.num_spans);
  kda_chain_kernel<D, XT, kThreads><<<chain_grid, kThreads, Tile::kSmemBytes, stream>>>(p);
  HLM_CHECK_LAUNCH("kda_chain_kernel");
}

}  // namespace

Tensor kda_prefill(CudaContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                   const Tensor& beta, const SeqBatch& seqs, Tensor& state) {
  const char* op = "kda_prefill";
  check_kda_core_args(op, q, k, v, g, beta, seqs, state);
  const int64_t rows = q.dim(0), heads = q.dim(1), dim = q.dim(2);
  HLM_CHECK(
      v.dim(2) == dim && (dim == 16 || dim == 32 || dim == 64 || dim == 128),
      "kda_prefill: key and value head dimensions {} and {} are not supported; the kernels take K = V in "
      "{{16, 32, 64, 128}}",
      dim, v.dim(2));
  int64_t max_tokens = 0;
  for (const SeqSpan& s : seqs.spans) max_tokens = std::max(max_tokens, s.token_count);

  // The output comes first so that it is the first block of a step's arena (what the tests poison).
  Tensor out = ctx.empty({rows, heads, dim}, DType::kBF16);  // [T, H, V]
  if (out.numel() == 0) return out;
  // Rows outside every span are zero; the chain kernel writes every row inside one.
  HLM_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.nbytes(), ctx.stream()));
  if (max_tokens == 0) return out;

  Tensor qg = ctx.empty({rows, heads, dim}, DType::kF32);
  Tensor kg = ctx.empty({rows, heads, dim}, DType::kF32);
  Tensor w = ctx.empty({rows, heads, dim}, DType::kF32);
  Tensor u = ctx.empty({rows, heads, dim}, DType::kF32);
  Tensor aqk = ctx.empty({rows, heads, kChunk}, DType::kF32);
  Tensor decay = ctx.empty({rows, heads, dim}, DType::kF32);
  dispatch_float(q.dtype(), op, [&](auto tag) {
    using XT = typename decltype(tag)::type;
    const KdaPrefillParams<XT> p{kda_core_params<XT>(q, k, v, g, beta, seqs, state, out),
                                 static_cast<int>(max_tokens),
                                 qg.data<float>(),
                                 kg.data<float>(),
                                 w.data<float>(),
                                 u.data<float>(),
                                 aqk.data<float>(),
                                 decay.data<float>()};
    dispatch_head_dim(dim, [&](auto d) { launch_kda_prefill<decltype(d)::value>(p, ctx.stream()); });
  });
  return out;
}

}  // namespace hlm::cuda
