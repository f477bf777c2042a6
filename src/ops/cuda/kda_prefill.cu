// KDA chunked prefill (docs/MODEL.md §5.6), the same function as ops/cpu/kda.cc kda_prefill: chunks of 64
// aligned to each sequence's first new token, the last one partial. Decays inside a 16-row sub-block are
// pairwise exp(Γ_i − Γ_j) with i ≥ j; across sub-blocks they are factored through the later sub-block's
// first row a, exp(Γ_i − Γ_a)·exp(Γ_a − Γ_j), both exponents ≤ 0, so nothing overflows whatever the gate.
// Γ is summed in double, as in the CPU op, so that the difference of two large cumulative sums keeps its
// precision: softplus gates take Γ to −1000s within a chunk. fp32 math throughout, on CUDA cores.
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
// L2 hits); the output, 256 B. FLOPs: kernel 1 ≈ 21 K for the Aqk/Akk dot products plus ≈ 1.7 K expf
// (pairwise inside sub-blocks, per row across them), and ≈ 16 K for the two forward substitutions;
// kernel 2 ≈ 104 K (W·S, QG·S and the state update at 32 K each, Aqk·Vn 8 K). All on fp32 CUDA cores from
// shared memory, so this is ALU/shared-memory bound, not memory bound: at 32 heads and 8K tokens ≈ 37
// GFLOP (kernel 2 at batch 1: 128 CTAs, 1.7 MFLOP per CTA per chunk, 128 chunks in sequence). Measured on
// an H200 (kernel_bench --kda-prefill, 8K tokens, batch 1): 2.70 ms, kernel 1 1.40 and kernel 2 1.27,
// where fla chunk_kda took 1.75 ms in the same job of tools/bench_kernels.py. Reaching the 1.2×-fla target
// needs tensor cores for the three [64 × 128 × 32] products of kernel 2 and for the anchored Aqk/Akk
// (KERNELS.md §1, §4.2) without losing fp32 accuracy, a bf16 workspace, and segment parallelism across a
// sequence at batch 1; this version is the exact fp32 form they are checked against.
#include <algorithm>

#include "ops/cuda/async_copy.cuh"
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
// The chain's: one register tile of each kind per thread at most (ChainTile).
constexpr int kChainThreads = 512;

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

// Sub-blocks of the chunk's rows for the decays of Aqk and Akk: a pair inside one sub-block takes its
// exact pairwise exp(Γ_i − Γ_j); a pair across sub-blocks factors it through the first row a of i's
// sub-block, exp(Γ_i − Γ_a)·exp(Γ_a − Γ_j), both exponents ≤ 0 (no overflow whatever the gate; the
// product differs from the pairwise exp by a few ulps), so that the factors are computed once per row
// instead of once per pair. (fla's chunk_kda splits the same way, KERNELS.md §1.)
constexpr int kSub = 16;
constexpr int kSubs = kChunk / kSub;
// Rows per register block of the forward substitutions.
constexpr int kSubstRows = 8;

// kda_chunk_kernel's shared memory: Γ [C][D+1] double, q̂ then U [C][D+1], k̂ then W [C][D+1],
// Akkᵀ [C][C+4] (column j of Akk as a row, so that the substitutions read kSubstRows rows' coefficients
// with float4 loads), β [C], and for the cross-sub-block decays k̂_j ⊙ exp(Γ_a − Γ_j) [C − kSub][D+1] and
// q̂_i, k̂_i ⊙ exp(Γ_i − Γ_a) [kSub][D+4] each. Rows walked by lanes (lanes over rows) are padded by one
// element so that they fall in distinct banks; rows read as float4 broadcasts by 4.
template <int D>
struct ChunkSmem {
  static constexpr int kPad = D + 1;
  static constexpr int kVecPad = D + 4;
  static constexpr size_t kBytes =
      sizeof(double) * kChunk * kPad + sizeof(float) * (2 * kChunk * kPad + kChunk * (kChunk + 4) + kChunk +
                                                        (kChunk - kSub) * kPad + 2 * kSub * kVecPad);
};

// Grid (chunks, H, S): a CTA per (sequence, head, chunk of 64 tokens), kThreads / 32 warps.
//  - q̂, k̂: a warp per token row (lanes over key channels, warp-sum of squares). Γ: g staged by all
//    threads, then a thread per key channel summing down the rows in double.
//  - Aqk, Akk inside a sub-block: a lane per pair (i, j ≤ i), each a full dot product over the key channels
//    with its own expf(Γ_i − Γ_j) per channel.
//  - Aqk, Akk across sub-blocks, one anchor (sub-block) at a time: the decayed rows k̂_j ⊙ exp(Γ_a − Γ_j)
//    (j < a) and q̂_i, k̂_i ⊙ exp(Γ_i − Γ_a) (i in the sub-block) by all threads, then a warp per (row i,
//    32 of the j), the row's operands as float4 broadcasts.
//  - the per-element operands QG, KG, exp(Γ_last) and the right sides β v and β k̂ ⊙ exp(Γ): a thread per
//    element.
//  - the forward substitutions through the unit lower triangular (I + Akk): a thread per column of U or W
//    (2D columns), kSubstRows rows at a time in registers: their terms of the earlier blocks' rows share
//    each load of x_j (kSubstRows independent FMA chains instead of one), then the terms inside the block
//    from the registers. Every row's terms are subtracted in j order, as in the CPU op.
template <int D, class XT, int kThreads>
__global__ void __launch_bounds__(kThreads) kda_chunk_kernel(KdaPrefillParams<XT> p) {
  constexpr int kWarps = kThreads / 32;
  using Smem = ChunkSmem<D>;
  constexpr int kPad = Smem::kPad, kVecPad = Smem::kVecPad;
  constexpr int kAkkPad = kChunk + 4;
  extern __shared__ double chunk_smem[];
  double* gamma = chunk_smem;                                   // [C][kPad] Γ_i
  float* qs = reinterpret_cast<float*>(gamma + kChunk * kPad);  // [C][kPad] q̂, then U
  float* ks = qs + kChunk * kPad;                               // [C][kPad] k̂, then W
  float* akk_t = ks + kChunk * kPad;                            // [C][kAkkPad] Akkᵀ, i > j only
  float* beta = akk_t + kChunk * kAkkPad;                       // [C]
  float* kb = beta + kChunk;                // [C − kSub][kPad] k̂_j ⊙ exp(Γ_a − Γ_j)
  float* qa = kb + (kChunk - kSub) * kPad;  // [kSub][kVecPad] q̂_i ⊙ exp(Γ_i − Γ_a)
  float* ka = qa + kSub * kVecPad;          // [kSub][kVecPad] k̂_i ⊙ exp(Γ_i − Γ_a)

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

  // v for the right sides below, loaded now so that its latency hides behind Aqk and Akk.
  constexpr int kPerThread = (kChunk * D + kThreads - 1) / kThreads;
  float v_in[kPerThread];
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int e = tid + n * kThreads;
    v_in[n] = e < m * D ? to_float(p.v[token_head(e / D) * D + e % D]) : 0.0f;
  }

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
  for (int e = tid; e < m * D; e += kThreads)
    gamma[(e / D) * kPad + e % D] = p.g[token_head(e / D) * D + e % D];
  __syncthreads();
  for (int d = tid; d < D; d += kThreads) {
    double sum = 0.0;
    for (int i = 0; i < m; ++i) {
      sum += gamma[i * kPad + d];
      gamma[i * kPad + d] = sum;
    }
  }
  __syncthreads();

  // Aqk[i][j] = Σ_d q̂_i k̂_j exp(Γ_i − Γ_j) (j ≤ i), Akk[i][j] = β_i Σ_d k̂_i k̂_j exp(Γ_i − Γ_j) (j < i).
  // Inside a sub-block, pairwise: the kSubs triangles of kTriangle pairs (j ≤ i) laid end to end, a lane
  // per pair, so that no lane idles above a diagonal. Lanes of pairs past the chunk's end compute and drop.
  constexpr int kTriangle = kSub * (kSub + 1) / 2;
  for (int pair = warp * 32 + lane; pair - lane < kSubs * kTriangle; pair += kThreads) {
    const int block = min(pair / kTriangle, kSubs - 1), q = pair - block * kTriangle;
    int il = static_cast<int>((sqrtf(8.0f * q + 1.0f) - 1.0f) * 0.5f);  // q = il (il + 1) / 2 + jl
    il += (il + 1) * (il + 2) / 2 <= q;
    il -= il * (il + 1) / 2 > q;
    const int i = block * kSub + il, j = block * kSub + q - il * (il + 1) / 2;
    float dot_q = 0.0f, dot_k = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; ++d) {
      const float k_decayed =
          ks[j * kPad + d] * expf(static_cast<float>(gamma[i * kPad + d] - gamma[j * kPad + d]));
      dot_q += qs[i * kPad + d] * k_decayed;
      dot_k += ks[i * kPad + d] * k_decayed;
    }
    if (pair < kSubs * kTriangle && i < m) {
      p.aqk[token_head(i) * kChunk + j] = dot_q;
      if (j < i) akk_t[j * kAkkPad + i] = beta[i] * dot_k;
    }
  }
  // Across sub-blocks, anchored at each sub-block's first row a.
  for (int a = kSub; a < m; a += kSub) {
    for (int e = tid; e < (a + kSub) * D; e += kThreads) {
      const int r = e / D, d = e % D;
      if (r < a) {
        kb[r * kPad + d] =
            ks[r * kPad + d] * expf(static_cast<float>(gamma[a * kPad + d] - gamma[r * kPad + d]));
      } else {  // rows past the chunk's end take garbage here, and are dropped below
        const float f = expf(static_cast<float>(gamma[r * kPad + d] - gamma[a * kPad + d]));
        qa[(r - a) * kVecPad + d] = qs[r * kPad + d] * f;
        ka[(r - a) * kVecPad + d] = ks[r * kPad + d] * f;
      }
    }
    __syncthreads();
    const int groups = (a + 31) / 32;
    for (int task = warp; task < kSub * groups; task += kWarps) {
      const int i = a + task / groups, j = task % groups * 32 + lane;
      const float* q_row = qa + (i - a) * kVecPad;
      const float* k_row = ka + (i - a) * kVecPad;
      const float* b_row = kb + min(j, a - 1) * kPad;
      float dot_q = 0.0f, dot_k = 0.0f;
#pragma unroll 2
      for (int d = 0; d < D; d += 4) {
        const float4 qv = *reinterpret_cast<const float4*>(q_row + d);
        const float4 kv = *reinterpret_cast<const float4*>(k_row + d);
        const float b[4] = {b_row[d], b_row[d + 1], b_row[d + 2], b_row[d + 3]};
        dot_q += qv.x * b[0];
        dot_k += kv.x * b[0];
        dot_q += qv.y * b[1];
        dot_k += kv.y * b[1];
        dot_q += qv.z * b[2];
        dot_k += kv.z * b[2];
        dot_q += qv.w * b[3];
        dot_k += kv.w * b[3];
      }
      if (i < m && j < a) {
        p.aqk[token_head(i) * kChunk + j] = dot_q;
        akk_t[j * kAkkPad + i] = beta[i] * dot_k;
      }
    }
    __syncthreads();  // before the next anchor's rows overwrite kb, qa and ka
  }
  __syncthreads();

  // Operands decayed to the chunk's start or end, and the right sides of the two triangular systems
  // (β_i v_i into qs, β_i k̂_i ⊙ exp(Γ_i) into ks). Element (i, d) is read and rewritten by one thread.
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int e = tid + n * kThreads;
    if (e >= m * D) break;
    const int i = e / D, d = e % D;
    const double gamma_i = gamma[i * kPad + d];
    const float from_start = expf(static_cast<float>(gamma_i));  // exp(Γ_i)
    const int64_t at = token_head(i) * D + d;
    p.qg[at] = qs[i * kPad + d] * from_start;
    p.kg[at] = ks[i * kPad + d] * expf(static_cast<float>(gamma[(m - 1) * kPad + d] - gamma_i));
    if (i == m - 1) p.decay[token_head(0) * D + d] = from_start;
    qs[i * kPad + d] = beta[i] * v_in[n];
    ks[i * kPad + d] = beta[i] * ks[i * kPad + d] * from_start;
  }
  __syncthreads();

  // U[i] = β_i v_i − Σ_{j<i} Akk[i][j] U[j] and W[i] = β_i k̂_i ⊙ exp(Γ_i) − Σ_{j<i} Akk[i][j] W[j], in place.
  // Rows past the chunk's end compute garbage (their coefficients were never written) and are dropped;
  // they only feed later rows of their own block, which are past the end too.
  static_assert(kChunk % kSubstRows == 0 && kSubstRows == 8);
  for (int col = tid; col < 2 * D; col += kThreads) {
    float* x = col < D ? qs : ks;
    float* dst = col < D ? p.u : p.w;
    const int e = col % D;
    for (int i0 = 0; i0 < m; i0 += kSubstRows) {
      float acc[kSubstRows];
#pragma unroll
      for (int r = 0; r < kSubstRows; ++r) acc[r] = x[(i0 + r) * kPad + e];
      for (int j = 0; j < i0; ++j) {
        const float xj = x[j * kPad + e];
        const float4 c0 = *reinterpret_cast<const float4*>(akk_t + j * kAkkPad + i0);
        const float4 c1 = *reinterpret_cast<const float4*>(akk_t + j * kAkkPad + i0 + 4);
        acc[0] -= c0.x * xj;
        acc[1] -= c0.y * xj;
        acc[2] -= c0.z * xj;
        acc[3] -= c0.w * xj;
        acc[4] -= c1.x * xj;
        acc[5] -= c1.y * xj;
        acc[6] -= c1.z * xj;
        acc[7] -= c1.w * xj;
      }
#pragma unroll
      for (int r = 0; r < kSubstRows; ++r) {
#pragma unroll
        for (int jr = 0; jr < r; ++jr) acc[r] -= akk_t[(i0 + jr) * kAkkPad + i0 + r] * acc[jr];
        if (i0 + r < m) {
          x[(i0 + r) * kPad + e] = acc[r];
          dst[token_head(i0 + r) * D + e] = acc[r];
        }
      }
    }
  }
}

// How kda_chain_kernel<D> splits a head: kCols value columns per CTA, kChainThreads threads. The chunk's
// products are register tiles, so that each shared-memory load feeds several FMAs (a thread per column
// and row group, as before, loaded 9 floats per 8 FMAs and was bound by shared-memory issue):
//  - Vn = U − W·S, O = QG·S and O += Aqk·Vn: 2 rows x 2 columns of [C, kCols] per thread, rows 2rp and
//    2rp + 1 (W and QG rows as float4 broadcasts, padded to kRowPad so that the two rows a warp reads sit
//    in different banks), columns 2cp and 2cp + 1 (S and Vn as float2).
//  - the state update: 4 rows x 2 columns of the slice [D, kCols] per thread (KG as float4).
// Every sum keeps the order of the CPU op and of the earlier kernel: over d ascending, then over j.
template <int D>
struct ChainTile {
  static constexpr int kCols = D < 32 ? D : 32;
  static constexpr int kSplits = D / kCols;
  static constexpr int kRowPad = D + 4;
  static constexpr int kColPairs = kCols / 2;
  static constexpr int kOutTiles = kChunk / 2 * kColPairs;  // 2 x 2 tiles of [C, kCols]
  static constexpr int kStateTiles = D / 4 * kColPairs;     // 4 x 2 tiles of [D, kCols]
  static_assert(D % kCols == 0 && D % 4 == 0 && kOutTiles <= kChainThreads && kStateTiles <= kChainThreads);
  // Shared memory (floats): the state slice [D][kCols], W and QG [C][kRowPad], KG [C][D], U and Vn
  // [C][kCols], Aqk [C][C], exp(Γ_last) [D].
  static constexpr int kFloats =
      D * kCols + 2 * kChunk * kRowPad + kChunk * D + 2 * kChunk * kCols + kChunk * kChunk + D;
  static constexpr size_t kSmemBytes = sizeof(float) * kFloats;
};

// Grid (kSplits, H, S): a CTA per (sequence, head, kCols value columns), walking the sequence's chunks in
// order with its [D, kCols] slice of the state in shared memory. The chunk's workspace rows come in with
// cp.async in two groups, each issued as soon as its buffers are free, so that the loads of chunk c + 1
// overlap the math of chunk c: group A (W, QG, U), read by the first products, goes out once they are
// done; group B (KG, Aqk, exp(Γ_last)), read by the in-chunk part and the state update, once those are.
// Rows past the chunk's end are zero-filled. Per chunk:
//  1. Vn = U − W·S and O = QG·S against the state at the chunk's start (Vn to shared memory, O kept).
//  2. O[i] += Σ_{j≤i} Aqk[i][j] Vn[j], written out.
//  3. S = diag(exp(Γ_last)) S + Σ_j KG_jᵀ Vn_j; a thread updates only its own state elements.
template <int D, class XT>
__global__ void __launch_bounds__(kChainThreads) kda_chain_kernel(KdaPrefillParams<XT> p) {
  using Tile = ChainTile<D>;
  constexpr int kCols = Tile::kCols, kRowPad = Tile::kRowPad, kColPairs = Tile::kColPairs;
  extern __shared__ __align__(16) float chain_smem[];
  float* st = chain_smem;                      // [D][kCols] the state slice
  float* w_sh = st + D * kCols;                // [C][kRowPad]
  float* qg_sh = w_sh + kChunk * kRowPad;      // [C][kRowPad]
  float* kg_sh = qg_sh + kChunk * kRowPad;     // [C][D]
  float* u_sh = kg_sh + kChunk * D;            // [C][kCols]
  float* vn_sh = u_sh + kChunk * kCols;        // [C][kCols]
  float* aqk_sh = vn_sh + kChunk * kCols;      // [C][C], entries j ≤ i
  float* decay_sh = aqk_sh + kChunk * kChunk;  // [D]

  const int h = blockIdx.y;
  const Span span = load_span(p.table, blockIdx.z);
  const int count = min(span.count, p.max_tokens);
  if (span.slot < 0 || count <= 0) return;
  const int tid = threadIdx.x;
  const int col0 = blockIdx.x * kCols;
  float* state = p.state + (static_cast<int64_t>(span.slot) * p.heads + h) * D * D;  // [D, D]
  for (int x = tid; x < D * kCols; x += kChainThreads) st[x] = state[(x / kCols) * D + col0 + x % kCols];

  // Index of (row i of the chunk starting at token c0, head h) in [T, H, ...].
  auto token_head = [&](int c0, int i) { return (static_cast<int64_t>(span.begin) + c0 + i) * p.heads + h; };
  // Rows [0, C) of a [T, H, width] workspace tensor from column `col` into shared rows of `ld` floats.
  auto stage_rows = [&](float* dst, int ld, const float* src, int width, int src_ld, int col, int c0) {
    const int m = min(kChunk, count - c0), quads = width / 4;
    for (int x = tid; x < kChunk * quads; x += kChainThreads) {
      const int i = x / quads, q = x % quads;
      const bool valid = i < m;
      cp_async16(dst + i * ld + 4 * q, valid ? src + token_head(c0, i) * src_ld + col + 4 * q : src, valid);
    }
  };
  auto stage_a = [&](int c0) {
    if (c0 < count) {
      stage_rows(w_sh, kRowPad, p.w, D, D, 0, c0);
      stage_rows(qg_sh, kRowPad, p.qg, D, D, 0, c0);
      stage_rows(u_sh, kCols, p.u, kCols, D, col0, c0);
    }
    cp_async_commit();
  };
  auto stage_b = [&](int c0) {
    if (c0 < count) {
      stage_rows(kg_sh, D, p.kg, D, D, 0, c0);
      stage_rows(aqk_sh, kChunk, p.aqk, kChunk, kChunk, 0, c0);
      for (int x = tid; x < D / 4; x += kChainThreads)
        cp_async16(decay_sh + 4 * x, p.decay + token_head(c0, 0) * D + 4 * x, true);
    }
    cp_async_commit();
  };
  stage_a(0);
  stage_b(0);

  const int cp = tid % kColPairs, col = 2 * cp;
  const bool has_out = tid < Tile::kOutTiles, has_state = tid < Tile::kStateTiles;
  const int i0 = 2 * (tid / kColPairs);  // rows i0, i0 + 1 of the output tile
  const int d0 = 4 * (tid / kColPairs);  // rows d0 .. d0 + 3 of the state tile
  for (int c0 = 0; c0 < count; c0 += kChunk) {
    const int m = min(kChunk, count - c0);
    cp_async_wait<1>();  // group A of this chunk (group B may still be in flight)
    __syncthreads();     // ... for every thread's copies, and the state updated by the previous chunk

    float2 o[2] = {make_float2(0.0f, 0.0f), make_float2(0.0f, 0.0f)};
    if (has_out) {
      float2 vn[2];
      const float* w_row = w_sh + i0 * kRowPad;
      const float* qg_row = qg_sh + i0 * kRowPad;
#pragma unroll
      for (int r = 0; r < 2; ++r) vn[r] = *reinterpret_cast<const float2*>(u_sh + (i0 + r) * kCols + col);
#pragma unroll 2
      for (int d = 0; d < D; d += 4) {
        float2 s[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) s[k] = *reinterpret_cast<const float2*>(st + (d + k) * kCols + col);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float4 wq = *reinterpret_cast<const float4*>(w_row + r * kRowPad + d);
          const float4 qq = *reinterpret_cast<const float4*>(qg_row + r * kRowPad + d);
          const float wv[4] = {wq.x, wq.y, wq.z, wq.w}, qv[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            o[r].x += qv[k] * s[k].x;
            o[r].y += qv[k] * s[k].y;
            vn[r].x -= wv[k] * s[k].x;
            vn[r].y -= wv[k] * s[k].y;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) *reinterpret_cast<float2*>(vn_sh + (i0 + r) * kCols + col) = vn[r];
    }
    __syncthreads();  // all of Vn; W, QG and U are free
    stage_a(c0 + kChunk);
    cp_async_wait<1>();  // group B of this chunk
    __syncthreads();

    if (has_out && i0 < m) {
      const float* a0 = aqk_sh + i0 * kChunk;
      const float* a1 = a0 + kChunk;
      for (int j = 0; j <= i0; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(vn_sh + j * kCols + col);
        o[0].x += a0[j] * v.x;
        o[0].y += a0[j] * v.y;
        o[1].x += a1[j] * v.x;
        o[1].y += a1[j] * v.y;
      }
      const float2 v = *reinterpret_cast<const float2*>(vn_sh + (i0 + 1) * kCols + col);
      o[1].x += a1[i0 + 1] * v.x;
      o[1].y += a1[i0 + 1] * v.y;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (i0 + r < m) {
          *reinterpret_cast<__nv_bfloat162*>(p.out + token_head(c0, i0 + r) * D + col0 + col) =
              __floats2bfloat162_rn(o[r].x, o[r].y);
        }
      }
    }
    if (has_state) {
      float2 sn[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float2 s = *reinterpret_cast<const float2*>(st + (d0 + r) * kCols + col);
        sn[r] = make_float2(s.x * decay_sh[d0 + r], s.y * decay_sh[d0 + r]);
      }
      for (int j = 0; j < m; ++j) {
        const float4 kq = *reinterpret_cast<const float4*>(kg_sh + j * D + d0);
        const float2 v = *reinterpret_cast<const float2*>(vn_sh + j * kCols + col);
        const float kv[4] = {kq.x, kq.y, kq.z, kq.w};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          sn[r].x += kv[r] * v.x;
          sn[r].y += kv[r] * v.y;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) *reinterpret_cast<float2*>(st + (d0 + r) * kCols + col) = sn[r];
    }
    __syncthreads();  // KG, Aqk and exp(Γ_last) are free
    stage_b(c0 + kChunk);
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int x = tid; x < D * kCols; x += kChainThreads) state[(x / kCols) * D + col0 + x % kCols] = st[x];
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

  using Tile = ChainTile<D>;
  HLM_CUDA_CHECK(cudaFuncSetAttribute(kda_chain_kernel<D, XT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tile::kSmemBytes)));
  const dim3 chain_grid(Tile::kSplits, p.heads, p.num_spans);
  kda_chain_kernel<D, XT><<<chain_grid, kChainThreads, Tile::kSmemBytes, stream>>>(p);
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
