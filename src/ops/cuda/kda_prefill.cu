// KDA chunked prefill (docs/MODEL.md §5.6), the same function as ops/cpu/kda.cc kda_prefill: chunks of 64
// aligned to each sequence's first new token, the last one partial. Decays are factored through the first row
// a of i's 16-row sub-block, exp(Γ_i − Γ_a)·exp(Γ_a − Γ_j) (across sub-blocks both exponents ≤ 0, so
// nothing overflows whatever the gate; inside one only for channels that decay little across it, the others
// pairwise exp(Γ_i − Γ_j)).
// Γ is summed in double, as in the CPU op, so that the difference of two large cumulative sums keeps its
// precision: softplus gates take Γ to −1000s within a chunk. fp32 math throughout: element-wise work and
// the pairwise decays on CUDA cores, the matrix products on the tf32 tensor cores, those that reach the
// state with every fp32 product taken as three tf32 ones (mma_tf32x3, fp32-class accuracy; the op tests
// hold the state to 1e-5 of the CPU op), those that reach only the bf16 output as one (mma_tf32x1).
//
// Two kernels, split where the math splits (KERNELS.md §4.2, fla's chunk_kda):
//  1. kda_chunk_kernel, persistent CTAs over the items (chunk, head, sequence), fully parallel: everything
//     of a chunk that does not depend on the state entering it. q̂, k̂, Γ, Aqk, Akk, the forward substitutions
//     for U and W, and the decayed operands QG = q̂ ⊙ exp(Γ_i), KG = k̂ ⊙ exp(Γ_last − Γ_i), exp(Γ_last), into
//     an fp32 workspace.
//  2. kda_chain_kernel, grid (V / 32, H, S): the serial part, one CTA per (sequence, head, 32 value
//     columns) carrying its slice of the state in shared memory through the sequence's chunks:
//     Vn = U − W·S, O = QG·S + Aqk·Vn, S = diag(exp(Γ_last))·S + KGᵀ·Vn. Every one of these is separable
//     over value columns, so V splits across CTAs with no exchange.
//
// Cost at K = V = 128 per (token, head). Bytes: q, k, v (bf16) and g (fp32) in, ≈ 1.3 KB; the workspace,
// ≈ 2.3 KB written once and read back by each of the 4 column CTAs of kernel 2 (≈ 7.5 KB of reads, mostly
// L2 hits); the output, 256 B. FLOPs: kernel 1 ≈ 21 K for the Aqk/Akk dot products plus ≈ 0.45 K exponentials
// (per row and anchor; channels too steep to factor add theirs per pair), and ≈ 16 K for the two forward
// substitutions; kernel 2 ≈ 104 K (W·S, QG·S and the state update at 32 K each, Aqk·Vn 8 K): ≈ 37 GFLOP at 32
// heads and 8K tokens, compute and latency bound, not memory bound (kernel 2 at batch 1: 128 CTAs, 128 chunks
// in sequence). Measured on an H200 (kernel_bench --kda-prefill, 8K tokens, batch 1): 1.72-1.75 ms (kernel 1
// 1.01-1.04 and kernel 2 0.66 under ncu), where fla chunk_kda took 1.43 ms (tools/bench_kernels.py, beside
// this kernel before it was persistent at 1.74-1.76 ms; docs/benchmarks.md). Kernel 1's cycles per CTA before
// it was persistent (clock64, ≈ 59 K): input loads and q̂, k̂ 10 K (the part the persistent form overlaps), Γ
// 4 K, the anchored products 21 K (5.6 K of it their operands), the forward substitutions (a dependent chain
// per column) 17 K; a bf16 workspace and segment parallelism across a sequence at batch 1 are the other
// levers (KERNELS.md §4.2).
#include <algorithm>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kda_common.cuh"
#include "ops/cuda/mma.cuh"

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

// Sub-blocks of the chunk's rows for the decays of Aqk and Akk: a pair (i, j ≤ i) factors its decay through
// the first row a of i's sub-block, exp(Γ_i − Γ_a)·exp(Γ_a − Γ_j), so that the factors are computed once per
// row instead of once per pair and the sums over channels become matrix products (the product differs from
// the pairwise exp by a few ulps). Across sub-blocks (j < a) both exponents are ≤ 0: no overflow whatever
// the gate (fla's chunk_kda splits the same way, KERNELS.md §1). Inside i's own sub-block the second is
// ≥ 0, which is safe only while Γ falls little across the sub-block (kSafeSpread); steeper channels keep
// the exact pairwise exp(Γ_i − Γ_j) there.
constexpr int kSub = 16;
constexpr int kSubs = kChunk / kSub;
constexpr double kLog2e = 1.4426950408889634;  // Γ is kept in base 2: every decay is an exp2f
// A channel whose Γ falls by less than this (base 2) across a sub-block takes its decays inside the
// sub-block factored too, exp2(L_i − L_a)·exp2(L_a − L_j) with the second factor ≥ 1: both stay normal
// floats far from overflow. Channels that fall further (softplus gates can take Γ down by 1000s within a
// chunk) keep the exact pairwise form.
constexpr double kSafeSpread = 64.0;
// Rows per register block of the forward substitutions.
constexpr int kSubstRows = 8;

// kda_chunk_kernel's shared memory, in two parts. The anchored phase's scratch, dead from the forward
// substitutions on (when it takes the next item's inputs): Γ [C][D+1] double, for the anchored decays
// k̂_j ⊙ exp(Γ_a − Γ_j) [C][D+4] and q̂_i, k̂_i ⊙ exp(Γ_i − Γ_a) [kSub][D+4] each, the pairwise part of Aqk's
// diagonal blocks [C][kSub + 1], and for the channels that keep pairwise decays a count per sub-block
// [kSubs] int, a flag per (sub-block, channel) [kSubs][D] bytes and the flagged channels' indices packed
// [kSubs][D] bytes. Then q̂ then U [C][D+4], k̂ then W [C][D+4], Akkᵀ [C][C+4] (column j of Akk as a row, so
// that the substitutions read kSubstRows rows' coefficients with float4 loads), β [C]. Rows walked by lanes
// (lanes over rows) are padded by one element so that they fall in distinct banks; rows read as float4 or
// as tf32 mma fragments by ldmatrix by 4.
template <int D>
struct ChunkSmem {
  static constexpr int kPad = D + 1;
  static constexpr int kVecPad = D + 4;
  static constexpr int kRowPad = kVecPad;  // q̂ and k̂ rows, written as float4
  static constexpr size_t kScratchBytes =
      (sizeof(double) * kChunk * kPad +
       sizeof(float) * (kChunk * kVecPad + 2 * kSub * kVecPad + kChunk * (kSub + 1)) + 2 * kSubs * D +
       sizeof(int) * kSubs + 15) /
      16 * 16;
  static constexpr size_t kBytes =
      kScratchBytes + sizeof(float) * (2 * kChunk * kRowPad + kChunk * (kChunk + 4) + kChunk);
  // The next item's q, k [C][D] (input dtype) and g [C][D] fp32, staged in the scratch.
  template <class XT>
  static constexpr size_t kStagedBytes = (2 * sizeof(XT) + sizeof(float)) * kChunk* D;
};

// Persistent: as many CTAs as fit the GPU at once (one per SM at K = 128, by shared memory), kThreads / 32
// warps each, taking the items (sequence, head, chunk of 64 tokens) blockIdx.x, + gridDim.x, ... With one CTA
// per SM nothing hid a chunk's input loads (ncu/clock64 on an H200: 10 K of its 59 K cycles), so a CTA copies
// the next item's q, k, g and β into shared memory (cp.async) while it runs the current one's forward
// substitutions, and loads its v (used only late) into registers at the start. Per item:
//  - q, k, g from the staged copies into registers, then q̂, k̂: a warp per token row
//    (4 adjacent key channels a lane, loaded as one vector; warp-sum of squares). Γ: g staged by all threads,
//    then a thread per key channel and segment of 8 rows summing in double, the earlier segments' totals
//    added after.
//  - the channels too steep to factor inside a sub-block: listed per sub-block by a warp each, then their
//    pairwise terms for every pair (i, j ≤ i) of a sub-block, a lane per pair (none with mild gates).
//  - Aqk, Akk, one anchor (sub-block) at a time: the decayed rows k̂_j ⊙ exp(Γ_a − Γ_j) (j < a, and the
//    sub-block's own rows for the channels not kept pairwise) and q̂_i, k̂_i ⊙ exp(Γ_i − Γ_a) (i in the
//    sub-block) by all threads, then their products on the tensor cores, a warp per (Aqk or Akk, 8 columns
//    j): three tf32 products per fp32 one for Akk (mma_tf32x3: fp32-class accuracy, as Akk reaches the
//    state), one for Aqk (which reaches only the bf16 output).
//  - the per-element operands QG, KG, exp(Γ_last) and the right sides β v and β k̂ ⊙ exp(Γ): a thread per
//    element.
//  - the forward substitutions through the unit lower triangular (I + Akk): a thread per column of U or W
//    (2D columns), kSubstRows rows at a time in registers: their terms of the earlier blocks' rows share
//    each load of x_j (kSubstRows independent FMA chains instead of one), then the terms inside the block
//    from the registers. Every row's terms are subtracted in j order, as in the CPU op. (Measured on an
//    H200 and dropped: four lanes per column, each taking the rows j of one residue mod 4 and the sums
//    added by shuffles, so that all 32 warps work: the kernel took 1.42 against 1.04 ms at 8K tokens,
//    batch 1, under ncu.)
template <int D, class XT, int kThreads>
__global__ void __launch_bounds__(kThreads) kda_chunk_kernel(KdaPrefillParams<XT> p, int chunks, int items) {
  constexpr int kWarps = kThreads / 32;
  using Smem = ChunkSmem<D>;
  constexpr int kPad = Smem::kPad, kRowPad = Smem::kRowPad, kVecPad = Smem::kVecPad;
  constexpr int kAkkPad = kChunk + 4;
  extern __shared__ double chunk_smem[];
  double* gamma = chunk_smem;                                   // [C][kPad] Γ_i · log2(e)
  float* kb = reinterpret_cast<float*>(gamma + kChunk * kPad);  // [C][kVecPad] k̂_j ⊙ exp(Γ_a − Γ_j)
  float* qa = kb + kChunk * kVecPad;    // [kSub][kVecPad] q̂_i ⊙ exp(Γ_i − Γ_a)
  float* ka = qa + kSub * kVecPad;      // [kSub][kVecPad] k̂_i ⊙ exp(Γ_i − Γ_a)
  float* diag_q = ka + kSub * kVecPad;  // [C][kSub + 1] Aqk's pairwise part, j − a
  int* steep_count = reinterpret_cast<int*>(diag_q + kChunk * (kSub + 1));          // [kSubs]
  unsigned char* pairwise = reinterpret_cast<unsigned char*>(steep_count + kSubs);  // [kSubs][D] flags
  unsigned char* steep_list = pairwise + kSubs * D;  // [kSubs][D] the flagged channels, packed
  float* qs = reinterpret_cast<float*>(reinterpret_cast<char*>(chunk_smem) + Smem::kScratchBytes);  // q̂, U
  float* ks = qs + kChunk * kRowPad;                 // [C][kRowPad] k̂, then W
  float* akk_t = ks + kChunk * kRowPad;              // [C][kAkkPad] Akkᵀ, i > j only
  float* beta = akk_t + kChunk * kAkkPad;            // [C]
  XT* q_staged = reinterpret_cast<XT*>(chunk_smem);  // [C][D] the item's q, k, g, staged in the scratch
  XT* k_staged = q_staged + kChunk * D;
  float* g_staged = reinterpret_cast<float*>(k_staged + kChunk * D);
  static_assert(Smem::template kStagedBytes<XT> <= Smem::kScratchBytes && D * sizeof(XT) % 16 == 0);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane / 4, t = lane % 4;
  // Item i: chunk i % chunks of head (i / chunks) % H of span i / (chunks · H); m = 0 when it has no rows
  // (padding, or a sequence shorter than the chunk).
  struct Item {
    int h, m;
    int64_t row0;
  };
  auto item_at = [&](int i) {
    const int chunk = i % chunks, h = (i / chunks) % p.heads;
    const Span span = load_span(p.table, i / (chunks * p.heads));
    const int count = min(span.count, p.max_tokens), c0 = chunk * kChunk;
    const int m = span.slot < 0 || count <= c0 ? 0 : min(kChunk, count - c0);
    return Item{h, m, static_cast<int64_t>(span.begin) + c0};
  };
  auto next_item = [&](int i) {
    for (i += gridDim.x; i < items; i += gridDim.x) {
      if (item_at(i).m > 0) break;
    }
    return i;
  };
  // Index in [T, H, ...] of the item's row i, or of its last row for i past its end.
  auto row_head = [&](const Item& it, int i) { return (it.row0 + min(i, it.m - 1)) * p.heads + it.h; };
  // The item's q, k, g rows and β into shared memory (rows past its end zero-filled), as one commit group.
  auto stage_inputs = [&](const Item& it) {
    constexpr int kXtPer = 16 / sizeof(XT), kXtPieces = D / kXtPer;  // 16-byte pieces of a q or k row
#pragma unroll
    for (int n = 0; n < (kChunk * kXtPieces + kThreads - 1) / kThreads; ++n) {
      const int x = tid + n * kThreads, i = x / kXtPieces, c = x % kXtPieces * kXtPer;
      if (kChunk * kXtPieces % kThreads != 0 && i >= kChunk) break;
      const int64_t at = row_head(it, i) * D + c;
      cp_async16(q_staged + i * D + c, p.q + at, i < it.m);
      cp_async16(k_staged + i * D + c, p.k + at, i < it.m);
    }
#pragma unroll
    for (int n = 0; n < (kChunk * D / 4 + kThreads - 1) / kThreads; ++n) {
      const int x = tid + n * kThreads, i = x / (D / 4), c = x % (D / 4) * 4;
      if (kChunk * D / 4 % kThreads != 0 && i >= kChunk) break;
      cp_async16(g_staged + i * D + c, p.g + row_head(it, i) * D + c, i < it.m);
    }
    if (tid < kChunk) cp_async4(beta + tid, p.beta + row_head(it, tid), tid < it.m);
    cp_async_commit();
  };

  int item = blockIdx.x;
  if (item < items && item_at(item).m == 0) item = next_item(item);
  if (item >= items) return;
  stage_inputs(item_at(item));
  for (;;) {
    const Item it = item_at(item);
    const int m = it.m, h = it.h;
    const int64_t row0 = it.row0;
    // Index of (row i of the chunk, head h) in [T, H, ...].
    auto token_head = [&](int i) { return (row0 + i) * p.heads + h; };

    // v, for the right sides of the substitutions, is loaded first and stays in registers until then. Rows
    // past the chunk's end read its last row instead (never used): an unconditional load, where a
    // conditional one compiled to a branch around each load and its conversion, which waited for it (ncu: a
    // round trip per load).
    constexpr int kPerThread = (kChunk * D + kThreads - 1) / kThreads;
    constexpr int kRowsPerWarp = (kChunk + kWarps - 1) / kWarps, kPerLane = 4;  // 4 adjacent channels a lane
    static_assert(kPerThread * kThreads == kChunk * D);
    XT v_in[kPerThread];
    float g_in[kPerThread];
#pragma unroll
    for (int n = 0; n < kPerThread; ++n) {
      const int e = tid + n * kThreads;
      const int64_t at = token_head(min(e / D, m - 1)) * D + e % D;
      v_in[n] = p.v[at];
    }
    cp_async_wait<0>();
    __syncthreads();  // the staged q, k, g and β have landed; the previous item's substitutions are done
#pragma unroll
    for (int n = 0; n < kPerThread; ++n) g_in[n] = g_staged[tid + n * kThreads];
    static_assert(D % kPerLane == 0 && D / kPerLane <= 32);
    float q_in[kRowsPerWarp][kPerLane] = {}, k_in[kRowsPerWarp][kPerLane] = {};  // rows warp + r·kWarps
    const int lane_d = kPerLane * lane;                                          // channels lane_d ..
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int i = min(warp + r * kWarps, m - 1);
      if (lane_d < D) {
        load_floats(q_staged + i * D + lane_d, q_in[r]);
        load_floats(k_staged + i * D + lane_d, k_in[r]);
      }
    }
    __syncthreads();  // every staged input read before the scratch is rewritten

    const float q_scale = 1.0f / sqrtf(static_cast<float>(D));
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int i = warp + r * kWarps;
      if (i >= m) break;  // warp-uniform
      float q_sq = 0.0f, k_sq = 0.0f;
#pragma unroll
      for (int n = 0; n < kPerLane; ++n) {
        q_sq += q_in[r][n] * q_in[r][n];
        k_sq += k_in[r][n] * k_in[r][n];
      }
      const float q_factor = l2_factor(warp_sum(q_sq), q_scale);
      const float k_factor = l2_factor(warp_sum(k_sq), 1.0f);
      if (lane_d < D) {
        *reinterpret_cast<float4*>(qs + i * kRowPad + lane_d) = make_float4(
            q_in[r][0] * q_factor, q_in[r][1] * q_factor, q_in[r][2] * q_factor, q_in[r][3] * q_factor);
        *reinterpret_cast<float4*>(ks + i * kRowPad + lane_d) = make_float4(
            k_in[r][0] * k_factor, k_in[r][1] * k_factor, k_in[r][2] * k_factor, k_in[r][3] * k_factor);
      }
    }
    // Γ_i = Σ_{r ≤ i} g_r in double, a thread per (channel, segment of kGammaRows rows): the segment's own
    // running sums, then the totals of the segments before it added (an exact-enough reordering: each sum
    // of at most 64 floats is exact to ~2^-47 in double). Γ is kept times log2(e), so that every decay is an
    // exp2f: fewer instructions than expf's range reduction, as many ulps.
#pragma unroll
    for (int n = 0; n < kPerThread; ++n) {
      const int e = tid + n * kThreads;
      if (e < m * D) gamma[(e / D) * kPad + e % D] = g_in[n];
    }
    __syncthreads();
    constexpr int kGammaSegs = kThreads / D < 8 ? kThreads / D : 8, kGammaRows = kChunk / kGammaSegs;
    static_assert(kGammaSegs >= 1 && kChunk % kGammaSegs == 0);
    const int gamma_d = tid % D, gamma_seg = tid / D;
    const int gamma_row0 = gamma_seg * kGammaRows, gamma_row1 = min(gamma_row0 + kGammaRows, m);
    const bool gamma_thread = gamma_seg < kGammaSegs && gamma_row0 < m;  // every earlier segment is full
    if (gamma_thread) {
      double sum = 0.0;
      for (int i = gamma_row0; i < gamma_row1; ++i) {
        sum += gamma[i * kPad + gamma_d];
        gamma[i * kPad + gamma_d] = sum;
      }
    }
    __syncthreads();
    double offset = 0.0;
    if (gamma_thread) {
      for (int seg = 0; seg < gamma_seg; ++seg)
        offset += gamma[((seg + 1) * kGammaRows - 1) * kPad + gamma_d];
    }
    __syncthreads();  // every total read before any segment changes
    if (gamma_thread) {
      for (int i = gamma_row0; i < gamma_row1; ++i)
        gamma[i * kPad + gamma_d] = (gamma[i * kPad + gamma_d] + offset) * kLog2e;
    }
    __syncthreads();

    // Which (sub-block, channel) keep pairwise decays: Γ falls by kSafeSpread or more across the sub-block.
    // A warp per sub-block packs them into a list, so that the pairwise loop below costs in proportion to
    // how many there are.
    static_assert(D <= 256, "channel indices are kept in bytes");
    for (int block = warp; block < kSubs; block += kWarps) {
      const int a0 = block * kSub;
      int count = 0;
      for (int d0 = 0; d0 < D; d0 += 32) {
        const int d = d0 + lane;
        const bool steep = d < D && a0 < m &&
                           gamma[a0 * kPad + d] - gamma[(min(a0 + kSub, m) - 1) * kPad + d] >= kSafeSpread;
        const unsigned flagged = __ballot_sync(0xffffffffu, steep);
        if (d < D) pairwise[block * D + d] = steep;
        if (steep) steep_list[block * D + count + __popc(flagged & ((1u << lane) - 1))] = d;
        count += __popc(flagged);
      }
      if (lane == 0) steep_count[block] = count;
    }
    __syncthreads();

    // Aqk[i][j] = Σ_d q̂_i k̂_j exp(Γ_i − Γ_j) (j ≤ i), Akk[i][j] = β_i Σ_d k̂_i k̂_j exp(Γ_i − Γ_j) (j < i).
    // Inside a sub-block, the channels that keep pairwise decays (usually none): the kSubs triangles of
    // kTriangle pairs (j ≤ i) laid end to end, a lane per pair, so that no lane idles above a diagonal. Lanes
    // of pairs past the chunk's end compute and drop.
    constexpr int kTriangle = kSub * (kSub + 1) / 2;
    for (int pair = warp * 32 + lane; pair - lane < kSubs * kTriangle; pair += kThreads) {
      const int block = min(pair / kTriangle, kSubs - 1), q = pair - block * kTriangle;
      int il = static_cast<int>((sqrtf(8.0f * q + 1.0f) - 1.0f) * 0.5f);  // q = il (il + 1) / 2 + jl
      il += (il + 1) * (il + 2) / 2 <= q;
      il -= il * (il + 1) / 2 > q;
      const int i = block * kSub + il, j = block * kSub + q - il * (il + 1) / 2;
      const double *gamma_i = gamma + i * kPad, *gamma_j = gamma + j * kPad;
      const float *q_i = qs + i * kRowPad, *k_i = ks + i * kRowPad, *k_j = ks + j * kRowPad;
      const unsigned char* steep = steep_list + block * D;
      const int steep_channels = steep_count[block];
      float dot_q = 0.0f, dot_k = 0.0f;
#pragma unroll 4
      for (int x = 0; x < steep_channels; ++x) {
        const int d = steep[x];
        const float k_decayed = k_j[d] * exp2f(static_cast<float>(gamma_i[d] - gamma_j[d]));
        dot_q += q_i[d] * k_decayed;
        dot_k += k_i[d] * k_decayed;
      }
      if (pair < kSubs * kTriangle && i < m) {
        diag_q[i * (kSub + 1) + j - block * kSub] = dot_q;
        if (j < i) akk_t[j * kAkkPad + i] = beta[i] * dot_k;
      }
    }
    __syncthreads();
    // Anchored at each sub-block's first row a: rows i of the sub-block against all rows j < a and, for the
    // channels not kept pairwise, against the sub-block's own rows j ≤ i (the factor exp(Γ_a − Γ_j) ≥ 1
    // there).
    for (int a = 0; a < m; a += kSub) {
      const unsigned char* steep = pairwise + (a / kSub) * D;
      // A thread per channel d and every kRowStep-th row, so that Γ_a and the channel's flag are read once;
      // rows past the chunk's end take garbage here, and are dropped below.
      constexpr int kRowStep = kThreads / D;
      static_assert(kThreads % D == 0);
      const int d = tid % D;
      const double gamma_a = gamma[a * kPad + d];
      for (int r = tid / D; r < a; r += kRowStep) {
        kb[r * kVecPad + d] = ks[r * kRowPad + d] * exp2f(static_cast<float>(gamma_a - gamma[r * kPad + d]));
      }
      const bool factored = !steep[d];
      for (int r = a + tid / D; r < a + kSub; r += kRowStep) {
        const double gamma_r = gamma[r * kPad + d];
        const float k_r = ks[r * kRowPad + d];
        kb[r * kVecPad + d] = factored ? k_r * exp2f(static_cast<float>(gamma_a - gamma_r)) : 0.0f;
        const float f = exp2f(static_cast<float>(gamma_r - gamma_a));
        qa[(r - a) * kVecPad + d] = qs[r * kRowPad + d] * f;
        ka[(r - a) * kVecPad + d] = k_r * f;
      }
      __syncthreads();
      // [kSub, D]·[D, a + kSub] products on the tensor cores (mma_tf32x3, fp32-class), a warp per (Aqk or
      // Akk, 8 columns j); in the diagonal block only j ≤ i (Aqk) or j < i (Akk) are kept, added to their
      // pairwise part.
      const int col_tiles = (a + kSub) / 8;
      for (int task = warp; task < 2 * col_tiles; task += kWarps) {
        const bool is_q = task < col_tiles;
        const int j0 = 8 * (task % col_tiles);
        const float* a_rows = is_q ? qa : ka;
        float c[4] = {}, corr[4] = {};  // rows a + g (+ 8), columns j0 + 2t (+ 1)
        // Fragments by ldmatrix: A from [kSub][kVecPad], B from kb as [n = j][k = d], two k-steps per load.
        const unsigned a_addr = smem_addr(a_rows + ldsm_tf32_a_offset(lane, kVecPad));
        const unsigned b_addr = smem_addr(kb + j0 * kVecPad + ldsm_tf32_b1_offset(lane, kVecPad));
#pragma unroll 2
        for (int k0 = 0; k0 < D; k0 += 16) {
          uint32_t bq[4];
          ldsm_x4(bq, b_addr + 4 * k0);
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            float af[4];
            ldsm_tf32_a(af, a_addr + 4 * (k0 + 8 * s));
            const float bf[2] = {__uint_as_float(bq[2 * s]), __uint_as_float(bq[2 * s + 1])};
            if (is_q) {  // Aqk reaches only the bf16 output: one tf32 pass
              mma_tf32x1(c, af, {round_tf32(bf[0]), round_tf32(bf[1])});
            } else {
              mma_tf32x3(c, corr, split_tf32(af), split_tf32(bf));
            }
          }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = a + g + 8 * (e / 2), j = j0 + 2 * t + e % 2;
          if (i >= m || j > i || (j == i && !is_q)) continue;
          const float dot = c[e] + corr[e];
          if (is_q) {
            p.aqk[token_head(i) * kChunk + j] = j < a ? dot : dot + diag_q[i * (kSub + 1) + j - a];
          } else {
            akk_t[j * kAkkPad + i] = j < a ? beta[i] * dot : akk_t[j * kAkkPad + i] + beta[i] * dot;
          }
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
      const float from_start = exp2f(static_cast<float>(gamma_i));  // exp(Γ_i)
      const int64_t at = token_head(i) * D + d;
      p.qg[at] = qs[i * kRowPad + d] * from_start;
      p.kg[at] = ks[i * kRowPad + d] * exp2f(static_cast<float>(gamma[(m - 1) * kPad + d] - gamma_i));
      if (i == m - 1) p.decay[token_head(0) * D + d] = from_start;
      qs[i * kRowPad + d] = beta[i] * to_float(v_in[n]);
      ks[i * kRowPad + d] = beta[i] * ks[i * kRowPad + d] * from_start;
    }
    __syncthreads();
    // The scratch and β are free: the next item's inputs come in while the substitutions run.
    const int next = next_item(item);
    if (next < items) stage_inputs(item_at(next));

    // U[i] = β_i v_i − Σ_{j<i} Akk[i][j] U[j] and W[i] = β_i k̂_i ⊙ exp(Γ_i) − Σ_{j<i} Akk[i][j] W[j], in
    // place. Rows past the chunk's end compute garbage (their coefficients were never written) and are
    // dropped; they only feed later rows of their own block, which are past the end too.
    static_assert(kChunk % kSubstRows == 0 && kSubstRows == 8);
    for (int col = tid; col < 2 * D; col += kThreads) {
      float* x = col < D ? qs : ks;
      float* dst = col < D ? p.u : p.w;
      const int e = col % D;
      for (int i0 = 0; i0 < m; i0 += kSubstRows) {
        float acc[kSubstRows];
#pragma unroll
        for (int r = 0; r < kSubstRows; ++r) acc[r] = x[(i0 + r) * kRowPad + e];
        for (int j = 0; j < i0; ++j) {
          const float xj = x[j * kRowPad + e];
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
            x[(i0 + r) * kRowPad + e] = acc[r];
            dst[token_head(i0 + r) * D + e] = acc[r];
          }
        }
      }
    }
    if (next >= items) break;
    item = next;
  }
}

// How kda_chain_kernel<D> splits a head: kCols value columns per CTA, kChainThreads threads (16 warps). The
// chunk's products run on the tensor cores, m16n8k8 tf32 mma; those that reach the state (W·S, KGᵀ·Vn)
// with each operand split into two tf32 values and multiplied three times (mma_tf32x3), which keeps
// fp32-class accuracy (the op is checked against the fp32 CPU op at 1e-5), those that reach only the bf16
// output (QG·S, Aqk·Vn) once (mma_tf32x1); on CUDA cores with register tiles the chain was bound by
// shared-memory wavefronts (ncu: 85% of cycles), as each FMA came with a quarter of a load. The split costs
// integer instructions per element and use, so the operands used by many warps are stored split: the state
// slice (read by every warp of the first products) and Vn (by every warp of the last two), each as fp32 bits
// of its tf32 big and small parts beside the fp32 state the update starts from. Per warp, 16 x 16 tiles (two
// m16n8 tiles sharing the A fragment):
//  - Vn = U − W·S (warps 0 .. kOutTasks − 1) or O = QG·S (the next kOutTasks), row tile w % kRowTiles,
//    column pair (w / kRowTiles) % kColPairs; the O warps then add Aqk·Vn on the same tile;
//  - the state update on the tiles of [D, kCols], warp, warp + 16, ...
// The fragments of W, QG and Aqk (A) and of the split S and Vn (B) come by ldmatrix (mma.cuh), for which S's
// and Vn's parts are stored transposed ([column][k]); KG's, read transposed, by scalar loads. Rows are padded
// so that no load of a warp meets a bank conflict: by 4 words (an odd multiple of 16 bytes mod 128) for the
// ldmatrix rows, by 8 (mod 32) for the rows that lanes t walk across (the fp32 S, U, and KG).
template <int D>
struct ChainTile {
  static constexpr int kCols = D < 32 ? D : 32;
  static constexpr int kSplits = D / kCols;
  static constexpr int kRowTiles = kChunk / 16, kColPairs = kCols / 16;
  static constexpr int kOutTasks = kRowTiles * kColPairs;  // 16 x 16 tiles of [C, kCols], per product
  static constexpr int kStateTasks = D / 16 * kColPairs;   // 16 x 16 tiles of [D, kCols]
  static constexpr int kRowPad = D + 4;                    // W, QG
  static constexpr int kKgPad = D + 8;                     // KG
  static constexpr int kColPad = kCols + 8;                // S (fp32), U
  static constexpr int kAqkPad = kChunk + 4;
  static constexpr int kStPad = D + 4;       // S's tf32 parts, transposed
  static constexpr int kVnPad = kChunk + 4;  // Vn's tf32 parts, transposed
  static_assert(D % 16 == 0 && D % kCols == 0 && 2 * kOutTasks <= kChainThreads / 32);
  // Shared memory (4-byte words): the state slice as fp32 [D][kColPad] and as tf32 big and small parts
  // transposed [kCols][kStPad] each, W and QG [C][kRowPad], KG [C][kKgPad], U [C][kColPad], Vn as tf32 big
  // and small parts transposed [kCols][kVnPad] each, Aqk [C][kAqkPad], exp(Γ_last) [D].
  static constexpr int kWords = D * kColPad + 2 * kCols * kStPad + 2 * kChunk * kRowPad + kChunk * kKgPad +
                                kChunk * kColPad + 2 * kCols * kVnPad + kChunk * kAqkPad + D;
  static constexpr size_t kSmemBytes = sizeof(float) * kWords;
};

// The B fragments of the two m16n8 tiles n0 .. n0 + 15 of a split operand stored transposed ([n][k], its
// big and small parts), k0 .. k0 + 7: one ldmatrix each, from the lane's addresses for that tile and k-step.
__device__ __forceinline__ void load_split_b(Tf32Frag<2> (&b)[2], unsigned big, unsigned small) {
  uint32_t r[4];
  ldsm_x4(r, big);
  b[0].big[0] = r[0], b[0].big[1] = r[1], b[1].big[0] = r[2], b[1].big[1] = r[3];
  ldsm_x4(r, small);
  b[0].small[0] = r[0], b[0].small[1] = r[1], b[1].small[0] = r[2], b[1].small[1] = r[3];
}

// acc + corr += A·B over one k-step of 8 for a warp's 16 x 16 tile, three tf32 products (mma_tf32x3): A's
// fragment given in fp32, B's two fragments loaded split (load_split_b).
__device__ __forceinline__ void mma_tile_step(float (&acc)[2][4], float (&corr)[2][4], const float (&a)[4],
                                              unsigned big, unsigned small) {
  const Tf32Frag<4> af = split_tf32(a);
  Tf32Frag<2> b[2];
  load_split_b(b, big, small);
  mma_tf32x3(acc[0], corr[0], af, b[0]);
  mma_tf32x3(acc[1], corr[1], af, b[1]);
}
// The same on one tf32 pass (mma_tf32x1, B's big part only), for the products that reach only the bf16
// output.
__device__ __forceinline__ void mma_tile_step_x1(float (&acc)[2][4], const float (&a)[4], unsigned big) {
  uint32_t r[4];
  ldsm_x4(r, big);
  mma_tf32x1(acc[0], a, {r[0], r[1]});
  mma_tf32x1(acc[1], a, {r[2], r[3]});
}

// Calls f(nt, half, row, col) for each pair of accumulator elements a lane holds of a warp's two m16n8
// tiles at rows r0 .. r0 + 15 and columns n0 .. n0 + 15: elements [nt][2 half] and [nt][2 half + 1] sit
// at (row, col) and (row, col + 1).
template <class F>
__device__ __forceinline__ void for_tile_pairs(int r0, int n0, int g, int t, F&& f) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) f(nt, half, r0 + g + 8 * half, n0 + 8 * nt + 2 * t);
  }
}

// Writes an accumulator pair (two m16n8 tiles at rows r0 + g, r0 + g + 8 and columns n0 + 2t, n0 + 8 + 2t)
// split into big and small parts, transposed (element (row, col) at [col][kLd] + row): the [n][k] layout
// that load_split_b reads.
template <int kLd>
__device__ __forceinline__ void store_split_t(uint32_t* big, uint32_t* small, const float (&c)[2][4], int r0,
                                              int n0, int g, int t) {
  for_tile_pairs(r0, n0, g, t, [&](int nt, int half, int row, int col) {
    const Tf32Frag<2> f = split_tf32({c[nt][2 * half], c[nt][2 * half + 1]});
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      big[(col + e) * kLd + row] = f.big[e];
      small[(col + e) * kLd + row] = f.small[e];
    }
  });
}

// Rows [0, kChunk) of a workspace tensor, kWidth floats each, into shared rows of kLd floats: row i from
// src + i·row_stride; rows from m on are zero-filled (no read). Every index but the row stride is known at
// compile time, so a copy costs a few instructions.
template <int kWidth, int kLd>
__device__ __forceinline__ void stage_chunk_rows(float* dst, const float* src, int64_t row_stride, int m,
                                                 int tid) {
  constexpr int kQuads = kWidth / 4, kCopies = kChunk * kQuads;
#pragma unroll
  for (int n = 0; n < (kCopies + kChainThreads - 1) / kChainThreads; ++n) {
    const int x = tid + n * kChainThreads;
    if (kCopies % kChainThreads != 0 && x >= kCopies) break;
    const int i = x / kQuads, q = x % kQuads;
    cp_async16(dst + i * kLd + 4 * q, i < m ? src + i * row_stride + 4 * q : src, i < m);
  }
}

// acc += corr over a warp's pair of m16n8 accumulator tiles (mma_tf32x3's two halves).
__device__ __forceinline__ void add_tiles(float (&acc)[2][4], const float (&corr)[2][4]) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] += corr[nt][e];
  }
}

// Grid (kSplits, H, S): a CTA per (sequence, head, kCols value columns), walking the sequence's chunks in
// order with its [D, kCols] slice of the state in shared memory. The chunk's workspace rows come in with
// cp.async in two groups, each issued as soon as its buffers are free, so that the loads of chunk c + 1
// overlap the math of chunk c: group A (W, QG, U), read by the first products, goes out once they are
// done; group B (KG, Aqk, exp(Γ_last)), read by the in-chunk part and the state update, once those are.
// (Measured on an H200 and dropped: each chunk also asking L2 for the workspace rows of the chunk two ahead,
// a cp.async.bulk.prefetch.L2 per row: the chain took 0.83 against 0.67 ms at 8K tokens, batch 1, under
// ncu.) Rows past the chunk's end are zero-filled, so they add nothing to any product. Per chunk:
//  1. Vn = U − W·S and O = QG·S against the state at the chunk's start (Vn to shared memory, O kept).
//     (Measured on an H200 and dropped: W·S's last k-steps on the tile's O warp, so that the two warps'
//     tensor work is even: 1.74-1.75 against 1.73 ms for the op at 8K tokens, batch 1.)
//  2. O[i] += Σ_{j≤i} Aqk[i][j] Vn[j], written out (Aqk's entries above the diagonal are never written
//     by kda_chunk_kernel and are replaced by zeros as they are loaded).
//  3. S = diag(exp(Γ_last)) S + KGᵀ·Vn; a warp updates only its own tiles of the state.
template <int D, class XT>
__global__ void __launch_bounds__(kChainThreads) kda_chain_kernel(KdaPrefillParams<XT> p) {
  using Tile = ChainTile<D>;
  constexpr int kCols = Tile::kCols, kRowPad = Tile::kRowPad, kKgPad = Tile::kKgPad, kColPad = Tile::kColPad,
                kAqkPad = Tile::kAqkPad, kStPad = Tile::kStPad, kVnPad = Tile::kVnPad,
                kWarps = kChainThreads / 32;
  extern __shared__ __align__(16) float chain_smem[];
  float* st = chain_smem;                                             // [D][kColPad] the state slice
  uint32_t* st_big = reinterpret_cast<uint32_t*>(st + D * kColPad);   // [kCols][kStPad] its tf32 parts, Sᵀ
  uint32_t* st_small = st_big + kCols * kStPad;                       // [kCols][kStPad]
  float* w_sh = reinterpret_cast<float*>(st_small + kCols * kStPad);  // [C][kRowPad]
  float* qg_sh = w_sh + kChunk * kRowPad;                             // [C][kRowPad]
  float* kg_sh = qg_sh + kChunk * kRowPad;                            // [C][kKgPad]
  float* u_sh = kg_sh + kChunk * kKgPad;                              // [C][kColPad]
  uint32_t* vn_big =
      reinterpret_cast<uint32_t*>(u_sh + kChunk * kColPad);             // [kCols][kVnPad] Vnᵀ's tf32 parts
  uint32_t* vn_small = vn_big + kCols * kVnPad;                         // [kCols][kVnPad]
  float* aqk_sh = reinterpret_cast<float*>(vn_small + kCols * kVnPad);  // [C][kAqkPad], entries j ≤ i
  float* decay_sh = aqk_sh + kChunk * kAqkPad;                          // [D]

  const int h = blockIdx.y;
  const Span span = load_span(p.table, blockIdx.z);
  const int count = min(span.count, p.max_tokens);
  if (span.slot < 0 || count <= 0) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int col0 = blockIdx.x * kCols;
  float* state = p.state + (static_cast<int64_t>(span.slot) * p.heads + h) * D * D;  // [D, D]
  for (int x = tid; x < D * kCols; x += kChainThreads) {
    const int d = x / kCols, col = x % kCols;
    const float s = state[d * D + col0 + col];
    const Tf32Frag<1> f = split_tf32({s});
    st[d * kColPad + col] = s;
    st_big[col * kStPad + d] = f.big[0];
    st_small[col * kStPad + d] = f.small[0];
  }

  // Index of (row i of the chunk starting at token c0, head h) in [T, H, ...].
  auto token_head = [&](int c0, int i) { return (static_cast<int64_t>(span.begin) + c0 + i) * p.heads + h; };
  const int64_t row_stride = static_cast<int64_t>(p.heads) * D;  // floats between tokens of [T, H, D]
  auto stage_a = [&](int c0) {
    if (c0 < count) {
      const int m = min(kChunk, count - c0);
      const int64_t at = token_head(c0, 0) * D;
      stage_chunk_rows<D, kRowPad>(w_sh, p.w + at, row_stride, m, tid);
      stage_chunk_rows<D, kRowPad>(qg_sh, p.qg + at, row_stride, m, tid);
      stage_chunk_rows<kCols, kColPad>(u_sh, p.u + at + col0, row_stride, m, tid);
    }
    cp_async_commit();
  };
  auto stage_b = [&](int c0) {
    if (c0 < count) {
      const int m = min(kChunk, count - c0);
      stage_chunk_rows<D, kKgPad>(kg_sh, p.kg + token_head(c0, 0) * D, row_stride, m, tid);
      stage_chunk_rows<kChunk, kAqkPad>(aqk_sh, p.aqk + token_head(c0, 0) * kChunk,
                                        static_cast<int64_t>(p.heads) * kChunk, m, tid);
      if (tid < D / 4) cp_async16(decay_sh + 4 * tid, p.decay + token_head(c0, 0) * D + 4 * tid, true);
    }
    cp_async_commit();
  };
  stage_a(0);
  stage_b(0);

  // The warp's tile of the first products: rows r0 .. r0 + 15, columns n0 .. n0 + 15 of W·S (is_w) or QG·S.
  const bool has_out = warp < 2 * Tile::kOutTasks, is_w = warp < Tile::kOutTasks;
  const int r0 = 16 * (warp % Tile::kRowTiles), n0 = 16 * (warp / Tile::kRowTiles % Tile::kColPairs);
  // The lane's ldmatrix addresses (bytes) at k = 0: its A rows of the tile (W or QG, and Aqk) and its B
  // rows of Sᵀ and Vnᵀ for the tile's columns; a k-step adds 4·k0.
  const unsigned a_first =
      smem_addr((is_w ? w_sh : qg_sh) + r0 * kRowPad + ldsm_tf32_a_offset(lane, kRowPad));
  const unsigned a_aqk = smem_addr(aqk_sh + r0 * kAqkPad + ldsm_tf32_a_offset(lane, kAqkPad));
  const int st_lane = ldsm_tf32_b2_offset(lane, kStPad), vn_lane = ldsm_tf32_b2_offset(lane, kVnPad);
  const unsigned b_st_big = smem_addr(st_big + n0 * kStPad + st_lane);
  const unsigned b_st_small = smem_addr(st_small + n0 * kStPad + st_lane);
  const unsigned b_vn_big = smem_addr(vn_big + n0 * kVnPad + vn_lane);
  for (int c0 = 0; c0 < count; c0 += kChunk) {
    const int m = min(kChunk, count - c0);
    cp_async_wait<1>();  // group A of this chunk (group B may still be in flight)
    __syncthreads();     // ... for every thread's copies, and the state updated by the previous chunk

    float acc[2][4] = {};  // W·S or O: tile nt at rows r0 + g (+ 8), columns n0 + 8 nt + 2t (+ 1)
    if (has_out) {
      if (is_w) {  // Vn = U − W·S, exact: it feeds the state
        float corr[2][4] = {};
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 8) {
          float a[4];
          ldsm_tf32_a(a, a_first + 4 * k0);
          mma_tile_step(acc, corr, a, b_st_big + 4 * k0, b_st_small + 4 * k0);
        }
        add_tiles(acc, corr);
        for_tile_pairs(r0, n0, g, t, [&](int nt, int half, int row, int col) {
          const float2 u = *reinterpret_cast<const float2*>(u_sh + row * kColPad + col);
          acc[nt][2 * half] = u.x - acc[nt][2 * half];
          acc[nt][2 * half + 1] = u.y - acc[nt][2 * half + 1];
        });
        store_split_t<kVnPad>(vn_big, vn_small, acc, r0, n0, g, t);
      } else {  // O = QG·S, one pass: it reaches only the output
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 8) {
          float a[4];
          ldsm_tf32_a(a, a_first + 4 * k0);
          mma_tile_step_x1(acc, a, b_st_big + 4 * k0);
        }
      }
    }
    __syncthreads();  // all of Vn; W, QG and U are free
    stage_a(c0 + kChunk);
    cp_async_wait<1>();  // group B of this chunk
    __syncthreads();

    if (has_out && !is_w && r0 < m) {
      for (int k0 = 0; k0 < r0 + 16; k0 += 8) {
        float a[4];
        ldsm_tf32_a(a, a_aqk + 4 * k0);
        if (k0 >= r0) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {  // rows r0 + g (+ 8 for e odd), columns k0 + t (+ 4 for e ≥ 2)
            if (k0 + t + 4 * (e / 2) > r0 + g + 8 * (e % 2)) a[e] = 0.0f;
          }
        }
        mma_tile_step_x1(acc, a, b_vn_big + 4 * k0);
      }
      for_tile_pairs(r0, n0, g, t, [&](int nt, int half, int i, int col) {
        if (i < m) {
          *reinterpret_cast<__nv_bfloat162*>(p.out + token_head(c0, i) * D + col0 + col) =
              __floats2bfloat162_rn(acc[nt][2 * half], acc[nt][2 * half + 1]);
        }
      });
    }
    for (int task = warp; task < Tile::kStateTasks; task += kWarps) {
      const int d0 = 16 * (task / Tile::kColPairs), s0 = 16 * (task % Tile::kColPairs);
      const unsigned b_big = smem_addr(vn_big + s0 * kVnPad + vn_lane);
      const unsigned b_small = smem_addr(vn_small + s0 * kVnPad + vn_lane);
      float c[2][4], corr[2][4] = {};  // state tile nt at rows d0 + g (+ 8), columns s0 + 8 nt + 2t (+ 1)
      for_tile_pairs(d0, s0, g, t, [&](int nt, int half, int d, int col) {
        const float2 s = *reinterpret_cast<const float2*>(st + d * kColPad + col);
        c[nt][2 * half] = s.x * decay_sh[d];
        c[nt][2 * half + 1] = s.y * decay_sh[d];
      });
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 8) {  // rows past the chunk's end are zeros
        float a[4];
        load_tf32_a(a, kg_sh + k0 * kKgPad + d0, 1, kKgPad, g, t);  // KGᵀ: element (d, j) is KG[j][d]
        mma_tile_step(c, corr, a, b_big + 4 * k0, b_small + 4 * k0);
      }
      add_tiles(c, corr);
      for_tile_pairs(d0, s0, g, t, [&](int nt, int half, int d, int col) {
        *reinterpret_cast<float2*>(st + d * kColPad + col) =
            make_float2(c[nt][2 * half], c[nt][2 * half + 1]);
      });
      store_split_t<kStPad>(st_big, st_small, c, d0, s0, g, t);
    }
    __syncthreads();  // KG, Aqk and exp(Γ_last) are free
    stage_b(c0 + kChunk);
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int x = tid; x < D * kCols; x += kChainThreads)
    state[(x / kCols) * D + col0 + x % kCols] = st[(x / kCols) * kColPad + x % kCols];
}

template <int D, class XT>
void launch_kda_prefill(const KdaPrefillParams<XT>& p, int sm_count, cudaStream_t stream) {
  const int chunks = static_cast<int>(blocks_for(p.max_tokens, kChunk));
  const int64_t items = static_cast<int64_t>(chunks) * p.heads * p.num_spans;
  HLM_CHECK(items <= INT32_MAX, "kda_prefill: {} chunks x {} heads x {} sequences overflow the work items",
            chunks, p.heads, p.num_spans);
  const size_t chunk_smem = ChunkSmem<D>::kBytes;
  auto* chunk_kernel = kda_chunk_kernel<D, XT, kChunkThreads>;
  HLM_CUDA_CHECK(cudaFuncSetAttribute(chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(chunk_smem)));
  int per_sm = 0;
  HLM_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chunk_kernel, kChunkThreads, chunk_smem));
  HLM_CHECK(per_sm > 0, "kda_prefill: the chunk kernel does not fit an SM ({} bytes of shared memory)",
            chunk_smem);
  const int64_t ctas = std::min<int64_t>(items, static_cast<int64_t>(per_sm) * sm_count);
  chunk_kernel<<<static_cast<unsigned>(ctas), kChunkThreads, chunk_smem, stream>>>(p, chunks,
                                                                                   static_cast<int>(items));
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
  // The chunk kernel copies rows of q, k and g to shared memory in 16-byte pieces.
  HLM_CHECK(aligned16(q.raw()) && aligned16(k.raw()) && aligned16(g.raw()),
            "kda_prefill: q, k and g must be 16-byte aligned; their addresses are {}, {} and {} bytes past a "
            "multiple of 16",
            reinterpret_cast<uintptr_t>(q.raw()) % 16, reinterpret_cast<uintptr_t>(k.raw()) % 16,
            reinterpret_cast<uintptr_t>(g.raw()) % 16);
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
    dispatch_head_dim(
        dim, [&](auto d) { launch_kda_prefill<decltype(d)::value>(p, ctx.sm_count(), ctx.stream()); });
  });
  return out;
}

}  // namespace hlm::cuda
