// Routed experts on the GPU (docs/MODEL.md §7.2, §7.5): Σ_k w · down_e(act(gate_e x) ⊙ up_e x) over the
// experts this rank holds, in four steps that never need the per-expert counts on the host (so a
// decode step can be captured as a CUDA graph):
//  1. build_work_list_kernel (build_small_work_list_kernel, one warp, up to 32 pairs; from 8,192 pairs three
//     kernels of several CTAs, count_pairs_kernel, segment_pairs_kernel and place_pairs_kernel): the
//     expert-major work list in fixed worst-case buffers: the active local experts in ascending order,
//     each with its segment of (token, slot) pairs t·k + j.
//  2. expert_gemm_kernel<gate, up>: per active expert and 16-row tile of the intermediate, the gate and up
//     rows times the expert's tokens, then act(gate)·up rounded to bf16 into h [T·k, I] (row t·k + j).
//  3. expert_gemm_kernel<down>: per active expert and 16-row tile of the hidden size, down rows times the
//     h rows of the expert's pairs, in fp32 into y [T·k, D].
//  4. combine_kernel: out[t] = Σ_j w[t, j] · y[t·k + j] over the slots with a local expert, in slot
//     order: a fixed order, no atomics, so the result is the same every run.
// Decode-sized batches of BF16 experts and tokens (up to 32 (token, slot) pairs) take two launches instead
// (moe_decode_experts.cu: each CTA one slice of an expert, gate/up then down, and a combine of the slices).
// Prefill-sized batches with BF16 or MXFP4 weights and BF16 x (kTiledMinPairsPerExpert or
// kTiledMinPairsPerMxfp4Expert pairs per local expert, kTiledMinTokens) run steps 2 and 3 as tiled GEMMs
// instead (moe_tiled_gemm.cu), on the same list and into the same h and y. The GEMMs here are
// weight-streaming tensor-core kernels (mma.sync m16n8k16, bf16 in, fp32 accumulate) with the weights as the
// 16-row A side and the expert's tokens as the 8-column B side: each touched expert's weights are read once
// per step whatever the number of tokens routed to it (up to 32 tokens; beyond that the token chunks re-read
// the rows, from L2 when they fit). Dense BF16 or F32 weights (F32 rounded to bf16 as it is loaded) and MXFP4
// codes (dequantized in registers) share the kernel.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/moe_decode_experts.cuh"
#include "ops/cuda/moe_work_list.cuh"
#include "ops/cuda/mxfp4_decode.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

constexpr int kSplitK = 4;            // warps per GEMM CTA (but see expert_gemm_bf16_one_tile_kernel)
constexpr int kListThreads = 1024;    // per work-list CTA
constexpr int kExpertsPerThread = 4;  // local experts each work-list thread scans
constexpr int kMaxLocalExperts = kListThreads * kExpertsPerThread;
// Pairs per CTA of the work list's multi-CTA form, taken from kListMultiCtaPairs pairs on: the one-CTA
// kernel is bound by its shared-memory atomics, two per pair on one SM (an 8K-token chunk of the 48B at
// top-8, 65,536 pairs: 72-78 µs, ncu on an H200).
constexpr int64_t kListPairsPerCta = 4096;
constexpr int64_t kListMultiCtaPairs = 2 * kListPairsPerCta;
constexpr int kCombineThreads = 256;  // at most, per combine CTA (launch_combine)
constexpr int kCombineMaxSlots = 16;  // top_k up to this (K3: 16) takes combine_kernel's unrolled path
// Batches of at least this many pairs per local expert (on average) take the tiled GEMMs
// (moe_tiled_gemm.cu) where they apply. Measured on an H200 (kernel_bench --moe-prefill, the 48B's 256
// experts), tiled on wgmma against the streaming kernels in one run: 256 tokens (8 pairs per expert)
// 1.02-1.03 ms against 1.09, 512 tokens 1.08 against 1.41; at 1,024 and 8,192 tokens 1.08 and 3.1 ms
// against the streaming kernels' 2.46 and 19.1 of an earlier run (docs/benchmarks.md). Below 8 pairs the
// tiles' 128 rows are mostly padding. The count is over all the batch's pairs, of which only the local
// experts' share lands here, so with expert parallelism a small batch would pass it with a pair or two per
// local expert: the tiled GEMMs also need kTiledMinTokens tokens, which keeps decode batches on the streaming
// kernels at any expert split.
constexpr int64_t kTiledMinPairsPerExpert = 8;
constexpr int64_t kTiledMinTokens = 256;
// MXFP4 experts take the tiled GEMMs only from 32 pairs per local expert, where the streaming kernels start
// to pass over an expert's weights more than once. Below that the tiled GEMMs lost where each weight tile
// serves a single pair tile (not profiled; they load MXFP4 weights through registers, one 16-byte load per
// thread and stage ahead, fewer bytes in flight than the streaming kernels). Measured on an H200 (K3's
// [3072, 3584] experts, top 16): kernel_bench --moe-prefill with 224 local experts at 512 tokens (37 pairs
// per expert) 4.77 ms tiled against 5.71 streaming; K3's first 4 layers (896 experts on one GPU) prefilled
// in 512-token chunks (9 pairs per expert) at 8,106 tokens/s tiled against 13,087 streaming.
constexpr int64_t kTiledMinPairsPerMxfp4Expert = 32;

enum class WFormat { kBf16, kF32, kMxfp4 };

// --- work list (WorkList: moe_work_list.cuh) ---------------------------------------------------------------
struct WorkListParams {
  const int32_t* idx;  // [T·k] global expert ids
  int64_t pairs;       // T·k
  int64_t expert_begin;
  int local;  // E_l
  WorkList list;
  // The multi-CTA form only: its CTA count G, and [G, E_l] counts per CTA and expert, then where each
  // CTA's pairs of each expert begin in the entries.
  int ctas;
  int32_t* cta_counts;
};

// Pair i's local expert, or -1 where its expert is not in [expert_begin, expert_begin + E_l).
__device__ __forceinline__ int local_expert(const WorkListParams& p, int64_t i) {
  const int64_t e = static_cast<int64_t>(p.idx[i]) - p.expert_begin;
  return e >= 0 && e < p.local ? static_cast<int>(e) : -1;
}

// Inclusive prefix sums over the CTA of two counters at once (entries, active experts). `warp_sums`
// holds [2][32] ints.
__device__ __forceinline__ void block_inclusive_scan2(int& a, int& b, int* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int va = __shfl_up_sync(0xffffffffu, a, o), vb = __shfl_up_sync(0xffffffffu, b, o);
    if (lane >= o) a += va, b += vb;
  }
  if (lane == 31) warp_sums[warp] = a, warp_sums[32 + warp] = b;
  __syncthreads();
  if (warp == 0) {
    int sa = lane < (blockDim.x >> 5) ? warp_sums[lane] : 0,
        sb = lane < (blockDim.x >> 5) ? warp_sums[32 + lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int va = __shfl_up_sync(0xffffffffu, sa, o), vb = __shfl_up_sync(0xffffffffu, sb, o);
      if (lane >= o) sa += va, sb += vb;
    }
    warp_sums[lane] = sa, warp_sums[32 + lane] = sb;
  }
  __syncthreads();
  if (warp > 0) a += warp_sums[warp - 1], b += warp_sums[32 + warp - 1];
}

// From each thread's counts of its experts tid·4 + q (zero past E_l): the active-slot arrays and
// num_active by one scan over the CTA of the counts and of the active flags, and begin[q], where each of
// the thread's experts' segment begins in the entries. `warp_sums` holds [2][32] ints.
__device__ void write_segments(const WorkListParams& p, const int (&count)[kExpertsPerThread],
                               int (&begin)[kExpertsPerThread], int* warp_sums) {
  const int tid = threadIdx.x;
  int entries = 0, active = 0;
#pragma unroll
  for (int q = 0; q < kExpertsPerThread; ++q) {
    entries += count[q];
    active += count[q] > 0;
  }
  int entry_end = entries, active_end = active;
  block_inclusive_scan2(entry_end, active_end, warp_sums);
  int next_entry = entry_end - entries, next_slot = active_end - active;
#pragma unroll
  for (int q = 0; q < kExpertsPerThread; ++q) {
    if (count[q] > 0) {
      p.list.active_expert[next_slot] = tid * kExpertsPerThread + q;
      p.list.active_begin[next_slot] = next_entry;
      p.list.active_count[next_slot] = count[q];
      ++next_slot;
    }
    begin[q] = next_entry;
    next_entry += count[q];
  }
  if (tid == kListThreads - 1) *p.list.num_active = active_end;
}

// Pairs [begin, end) to their experts' segments through the shared cursors (each expert's next free entry).
__device__ __forceinline__ void place_pairs(const WorkListParams& p, int64_t begin, int64_t end,
                                            int* cursor) {
  for (int64_t i = begin + threadIdx.x; i < end; i += kListThreads) {
    const int e = local_expert(p, i);
    if (e >= 0) p.list.entries[atomicAdd(&cursor[e], 1)] = static_cast<int32_t>(i);
  }
}

// Pairs [begin, end) counted per local expert into the shared counters `count`.
__device__ __forceinline__ void count_pairs(const WorkListParams& p, int64_t begin, int64_t end, int* count) {
  for (int e = threadIdx.x; e < p.local; e += kListThreads) count[e] = 0;
  __syncthreads();
  for (int64_t i = begin + threadIdx.x; i < end; i += kListThreads) {
    const int e = local_expert(p, i);
    if (e >= 0) atomicAdd(&count[e], 1);
  }
  __syncthreads();
}

// One CTA of 1024 threads: per-expert counts in shared memory (atomics), the segments (write_segments),
// then every pair goes to its expert's segment through a shared cursor. Pairs whose id is outside
// [expert_begin, + E_l) are left out. The order inside a segment follows the atomics and can change
// between runs; each pair's result is computed on its own, so the outputs do not depend on it.
__global__ void __launch_bounds__(kListThreads) build_work_list_kernel(WorkListParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ int cursor[kMaxLocalExperts];  // counts, then each segment's next free entry
  __shared__ int warp_sums[64];
  const int tid = threadIdx.x;
  count_pairs(p, 0, p.pairs, cursor);
  int count[kExpertsPerThread], begin[kExpertsPerThread];
#pragma unroll
  for (int q = 0; q < kExpertsPerThread; ++q) {
    const int e = tid * kExpertsPerThread + q;
    count[q] = e < p.local ? cursor[e] : 0;
  }
  write_segments(p, count, begin, warp_sums);
#pragma unroll
  for (int q = 0; q < kExpertsPerThread; ++q) {
    const int e = tid * kExpertsPerThread + q;
    if (e < p.local) cursor[e] = begin[q];  // only this thread reads or writes its experts' counters here
  }
  __syncthreads();
  place_pairs(p, 0, p.pairs, cursor);
}

// The same list from kListMultiCtaPairs pairs on, in three kernels, CTA g of the first and the last taking
// pairs [g·kListPairsPerCta, + kListPairsPerCta). 1: each CTA counts its pairs per expert into its row of
// cta_counts. 2 (one CTA): the experts' totals over the rows give the segments (write_segments), and each
// count is replaced by where that CTA's pairs of that expert begin. 3: each CTA places its pairs from there.
__global__ void __launch_bounds__(kListThreads) count_pairs_kernel(WorkListParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ int count[kMaxLocalExperts];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kListPairsPerCta;
  count_pairs(p, begin, min(begin + kListPairsPerCta, p.pairs), count);
  int32_t* row = p.cta_counts + static_cast<int64_t>(blockIdx.x) * p.local;  // [E_l]
  for (int e = threadIdx.x; e < p.local; e += kListThreads) row[e] = count[e];
}

__global__ void __launch_bounds__(kListThreads) segment_pairs_kernel(WorkListParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ int warp_sums[64];
  const int e0 = threadIdx.x * kExpertsPerThread;
  int count[kExpertsPerThread] = {}, begin[kExpertsPerThread];
  for (int g = 0; g < p.ctas; ++g) {
#pragma unroll
    for (int q = 0; q < kExpertsPerThread; ++q) {
      if (e0 + q < p.local) count[q] += p.cta_counts[static_cast<int64_t>(g) * p.local + e0 + q];
    }
  }
  write_segments(p, count, begin, warp_sums);
  for (int g = 0; g < p.ctas; ++g) {
#pragma unroll
    for (int q = 0; q < kExpertsPerThread; ++q) {
      if (e0 + q < p.local) {
        int32_t& c = p.cta_counts[static_cast<int64_t>(g) * p.local + e0 + q];
        const int n = c;
        c = begin[q];
        begin[q] += n;
      }
    }
  }
}

__global__ void __launch_bounds__(kListThreads) place_pairs_kernel(WorkListParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ int cursor[kMaxLocalExperts];
  const int32_t* row = p.cta_counts + static_cast<int64_t>(blockIdx.x) * p.local;  // [E_l]
  for (int e = threadIdx.x; e < p.local; e += kListThreads) cursor[e] = row[e];
  __syncthreads();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kListPairsPerCta;
  place_pairs(p, begin, min(begin + kListPairsPerCta, p.pairs), cursor);
}

// The same list from one warp when the batch has at most 32 (token, slot) pairs (a decode step of up to
// 4 tokens at top-8): lane i holds pair i's local expert. Lanes with the same expert find each other with
// __match_any_sync; an expert's slot is the number of distinct local experts below it and its segment
// begins after the pairs of those experts, both counted over the lanes in one pass; a pair's entry follows
// the lower pairs of its expert, so the order inside a segment is ascending (the 1024-thread kernel's
// barriers and scans took about 3 µs per call at batch 1, measured with ncu on an H200; with this kernel
// the routed experts of a 48B batch-1 step took 39.0 µs against 39.9 in kernel_bench --moe).
__global__ void __launch_bounds__(32) build_small_work_list_kernel(WorkListParams p) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x;
  int64_t e = -1;
  if (lane < p.pairs) {
    e = static_cast<int64_t>(p.idx[lane]) - p.expert_begin;
    if (e < 0 || e >= p.local) e = -1;
  }
  const bool valid = e >= 0;
  const unsigned peers = __match_any_sync(0xffffffffu, static_cast<int>(e));
  const bool first = valid && (peers & ((1u << lane) - 1)) == 0;  // the lowest pair of its expert
  int slot = 0, begin = 0;
  for (int j = 0; j < 32; ++j) {
    const int64_t ej = __shfl_sync(0xffffffffu, e, j);
    const bool fj = __shfl_sync(0xffffffffu, first, j);
    if (ej >= 0 && ej < e) {
      begin += 1;
      slot += fj;
    }
  }
  const unsigned firsts = __ballot_sync(0xffffffffu, first);
  if (first) {
    p.list.active_expert[slot] = static_cast<int32_t>(e);
    p.list.active_begin[slot] = begin;
    p.list.active_count[slot] = __popc(peers);
  }
  if (valid) p.list.entries[begin + __popc(peers & ((1u << lane) - 1))] = lane;
  if (lane == 0) *p.list.num_active = __popc(firsts);
}

__device__ __forceinline__ uint32_t component(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// How a K chunk is split among the lanes. Dense: 64 columns, lane group t takes the 8-column runs at
// 8t and 32 + 8t (the 4 lanes of a row read 64 contiguous bytes per load). MXFP4: 128 columns, group t
// takes the 32 columns at 32t, exactly one scale group, as one 16-byte load of codes, in 4 runs of 8.
// Every run covers two k-steps (4 bf16x2 words). K % 32 == 0, so a run lies wholly inside or outside K.
template <WFormat F>
struct Chunk {
  static constexpr int kCols = F == WFormat::kMxfp4 ? 128 : 64;
  static constexpr int kRuns = F == WFormat::kMxfp4 ? 4 : 2;
  __device__ static int64_t run_col(int64_t chunk, int run, int t) {
    return F == WFormat::kMxfp4 ? chunk * 128 + t * 32 + run * 8 : chunk * 64 + run * 32 + t * 8;
  }
};

// One weight row's share of a chunk for this lane, as loaded (the conversion to bf16 words waits until
// the mma needs them, so all loads of a chunk are in flight together).
template <WFormat F>
struct RowChunk;
template <>
struct RowChunk<WFormat::kBf16> {
  uint4 run[2];
};
template <>
struct RowChunk<WFormat::kF32> {
  uint4 run[2][2];
};
template <>
struct RowChunk<WFormat::kMxfp4> {
  uint4 codes;  // 32 e2m1 codes, column 2i in the low nibble of byte i
  uint32_t scale;
};

// Row `row` of one expert's matrix: dense [M, K] elements, or MXFP4 codes [M, K/2] and scales [M, K/32].
template <WFormat F>
__device__ __forceinline__ void load_row(const void* w, const uint8_t* scale, int64_t row, int64_t cols,
                                         int64_t chunk, int t, RowChunk<F>& out) {
  if constexpr (F == WFormat::kMxfp4) {
    const int64_t col = Chunk<F>::run_col(chunk, 0, t);
    out.codes = make_uint4(0, 0, 0, 0);
    out.scale = 127;
    if (col < cols) {
      out.codes = load_streaming(static_cast<const uint8_t*>(w) + row * (cols / 2) + col / 2);
      out.scale = scale[row * (cols / 32) + col / 32];
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t col = Chunk<F>::run_col(chunk, r, t);
      if constexpr (F == WFormat::kBf16) {
        out.run[r] = col < cols ? load_streaming(static_cast<const bf16*>(w) + row * cols + col)
                                : make_uint4(0, 0, 0, 0);
      } else {
        const float* p = static_cast<const float*>(w) + row * cols + col;
        out.run[r][0] = col < cols ? load_streaming(p) : make_uint4(0, 0, 0, 0);
        out.run[r][1] = col < cols ? load_streaming(p + 4) : make_uint4(0, 0, 0, 0);
      }
    }
  }
}

// The A words of run `run`: w[0], w[1] feed the first k-step, w[2], w[3] the second. `f`: the row's MXFP4
// factors (unused for dense rows).
template <WFormat F, bool kBig>
__device__ __forceinline__ void row_words(const RowChunk<F>& rc, const Mxfp4Factors& f, int run,
                                          uint32_t (&w)[4]) {
  if constexpr (F == WFormat::kMxfp4) {
    e2m1x8_to_bf16<kBig>(component(rc.codes, run), f, w);
  } else {
    uint4 v;
    if constexpr (F == WFormat::kBf16) {
      v = rc.run[run];
    } else {
      v = f32x8_to_bf16(rc.run[run][0], rc.run[run][1]);
    }
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  }
}

// The B words of one run of a token row, in the column order of the A words: natural pairs (0,1) (2,3)
// (4,5) (6,7) for dense weights, (0,4) (1,5) (2,6) (3,7) for MXFP4. A padding column (no row) or a run
// outside K: zeros for dense weights. MXFP4 (issue-bound) always has a row and reads its first columns
// for a run outside K, where the A words are zero: the unguarded load saves a branch per run (the dense
// one-tile kernels have no registers to spare for it).
template <WFormat F, class XT>
__device__ __forceinline__ void b_words(const XT* row, int64_t col, bool inside, uint32_t (&b)[4]) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (F == WFormat::kMxfp4 || (row != nullptr && inside)) {
    const XT* at = row + (F == WFormat::kMxfp4 && !inside ? 0 : col);
    if constexpr (sizeof(XT) == 2) {
      v = __ldg(reinterpret_cast<const uint4*>(at));
    } else {
      v = f32x8_to_bf16(__ldg(reinterpret_cast<const uint4*>(at)),
                        __ldg(reinterpret_cast<const uint4*>(at + 4)));
    }
  }
  if constexpr (F == WFormat::kMxfp4) {
    b[0] = __byte_perm(v.x, v.z, 0x5410);
    b[1] = __byte_perm(v.x, v.z, 0x7632);
    b[2] = __byte_perm(v.y, v.w, 0x5410);
    b[3] = __byte_perm(v.y, v.w, 0x7632);
  } else {
    b[0] = v.x, b[1] = v.y, b[2] = v.z, b[3] = v.w;
  }
}

// --- expert GEMMs ----------------------------------------------------------------------------------------
// Kept small: the GEMMs' code generation follows its size. With 96 bytes of unused pointers added to it
// (nothing else changed) the BF16 one-tile down kernel compiled to 664 instructions instead of 496 and
// the gate/up one to 872 instead of 800; a build that had grown it that way (for the combine below, fused
// into the down GEMM) ran the routed experts 6-32% slower at every batch, including those that never
// took the fused path (see combine_kernel).
struct ExpertGemmParams {
  const void* w;           // [E_l, M, K] dense, or MXFP4 codes [E_l, M, K/2]
  const uint8_t* w_scale;  // MXFP4 scales [E_l, M, K/32]
  const void* w_up;        // gate/up GEMM: the up projection, laid out as w
  const uint8_t* w_up_scale;
  const void* in;  // gate/up: x [T, K] (row t of pair t·k + j); down: h [T·k, K] BF16
  void* out;       // gate/up: h [T·k, M] BF16; down: y [T·k, M] F32
  WorkList list;
  int64_t rows;  // M
  int64_t cols;  // K
  int top_k;
  bool situ;
  float situ_beta, situ_linear_beta;
};

// Grid (M / 16, max_active), kSplit warps. CTA (m, a) takes rows [16m, 16m + 16) of active expert a (or
// exits when a >= num_active), and warp w the K chunks w, w + kSplit, ... (split K, so a 16-row tile has
// kSplit warps of loads in flight). The expert's pairs go in chunks of kTiles·8 columns: each lane loads
// its weight runs once per K chunk and applies them to every 8-column tile of tokens (tiles past the
// chunk's count are skipped). The kSplit partial accumulators meet in shared memory and are summed in
// warp order; the epilogue writes act(gate)·up as bf16 (kGateUp) or the fp32 down projection, one value
// per (pair, row). Shared memory: the partials, kMats·kSplit·kTiles·4·32 floats (16 KB at most).
// Measured on an H200 and dropped (kernel_bench --moe against this kernel, one call): the down GEMM issuing
// its first weight loads before pdl_wait() as well as reading its list there (allowed: gate/up writes
// neither), faster at no batch (48B: the same at 8 tokens, 1-2% slower at 32 and 64; K3 3% slower at 8), its
// early loads competing with gate/up's last CTAs; and each CTA forming its own slot of the list from idx up
// to 32 pairs instead of build_small_work_list_kernel's launch, 39.7 against 38.8 µs at batch 1 (48B) and 130
// against 120 µs (K3), in a build whose loop restructuring also cost the generic kernels 3% at 32 tokens.
template <WFormat F, class XT, int kTiles, bool kGateUp, int kSplit = kSplitK>
__device__ __forceinline__ void expert_gemm(const ExpertGemmParams& p) {
  // The down GEMM's work list was written two launches back (pdl.cuh), so it reads the list and its
  // entries before pdl_wait() and waits only before its first weight and h loads. Measured on an H200
  // against waiting first (kernel_bench --moe, one call, two runs each): the 48B's routed experts 37.5-37.7
  // against 37.9-38.4 µs at batch 1, 604-605 against 612 at 32; K3 665-666 against 667-669 at batch 8.
  if constexpr (kGateUp) {
    pdl_wait();
    pdl_trigger();
  }
  constexpr int kMats = kGateUp ? 2 : 1;
  constexpr int kCols = kTiles * 8;
  // MXFP4 rows bring 16 bytes per lane and chunk, dense rows 32 or 64: two MXFP4 chunks go in flight at once.
  // (Measured on an H200: 2 BF16 chunks for gate/up and 4 for down, at 120-176 registers, made the batch-1
  // and batch-8 steps slower; the lost occupancy costs more than the deeper queue gains.)
  constexpr int kDepth = F == WFormat::kMxfp4 ? 2 : 1;
  __shared__ float partial[kMats][kSplit][kTiles * 4][32];
  const int slot = blockIdx.y;
  if (slot >= *p.list.num_active) return;
  const int64_t expert = p.list.active_expert[slot];
  const int begin = p.list.active_begin[slot], count = p.list.active_count[slot];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 16 + g, row1 = row0 + 8;
  const int64_t chunks = (p.cols + Chunk<F>::kCols - 1) / Chunk<F>::kCols;

  // This expert's matrices (gate, up or down).
  const int64_t codes_per_row = F == WFormat::kMxfp4 ? p.cols / 2 : p.cols;
  const int64_t expert_elems = p.rows * codes_per_row;
  const size_t elem_bytes = F == WFormat::kBf16 ? 2 : F == WFormat::kF32 ? 4 : 1;
  const void* mats[kMats];
  const uint8_t* scales[kMats];
  mats[0] = static_cast<const char*>(p.w) + expert * expert_elems * elem_bytes;
  scales[0] = F == WFormat::kMxfp4 ? p.w_scale + expert * p.rows * (p.cols / 32) : nullptr;
  if constexpr (kGateUp) {
    mats[1] = static_cast<const char*>(p.w_up) + expert * expert_elems * elem_bytes;
    scales[1] = F == WFormat::kMxfp4 ? p.w_up_scale + expert * p.rows * (p.cols / 32) : nullptr;
  }

  for (int base = 0; base < count; base += kCols) {
    const int n = min(count - base, kCols);
    // The B row this lane feeds for column g of each tile: x of the pair's token, or h of the pair. A
    // column past the count has none for dense weights, and the first pair's row for MXFP4 (b_words; its
    // products land in C columns the epilogue skips).
    const XT* brow[kTiles];
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      const int col = nt * 8 + g;
      brow[nt] = nullptr;
      if (col < n || F == WFormat::kMxfp4) {
        const int64_t pair = p.list.entries[begin + base + (col < n ? col : 0)];
        const int64_t in_row = kGateUp ? pair / p.top_k : pair;
        brow[nt] = static_cast<const XT*>(p.in) + in_row * p.cols;
      }
    }
    if constexpr (!kGateUp) {
      if (base == 0) {
        pdl_wait();
        pdl_trigger();
      }
    }
    float acc[kMats][kTiles][4];
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt)
        acc[m][nt][0] = acc[m][nt][1] = acc[m][nt][2] = acc[m][nt][3] = 0.0f;
    }

    // kDepth chunks of this warp are loaded before any is used (a chunk past the end loads nothing).
    for (int64_t c0 = warp; c0 < chunks; c0 += kSplit * kDepth) {
      RowChunk<F> a[kDepth][kMats][2];
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
#pragma unroll
        for (int m = 0; m < kMats; ++m) {
          load_row<F>(mats[m], scales[m], row0, p.cols, c0 + d * kSplit, t, a[d][m][0]);
          load_row<F>(mats[m], scales[m], row1, p.cols, c0 + d * kSplit, t, a[d][m][1]);
        }
      }
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int64_t c = c0 + d * kSplit;
        if (c >= chunks) break;  // uniform across the warp
        // MXFP4: each row's factors once per chunk, and one warp-wide choice of whether any row needs the
        // second factor (scales above 2 are rare); a choice per run and row cost a branch each. Measured
        // on an H200 (kernel_bench --moe, K3 shapes): 139.7 µs at batch 1 against 161.5, 801.6 against
        // 941.7 at batch 8.
        bool big = false;
        if constexpr (F == WFormat::kMxfp4) {
#pragma unroll
          for (int m = 0; m < kMats; ++m) big |= a[d][m][0].scale > 128 || a[d][m][1].scale > 128;
          big = __any_sync(0xffffffffu, big);
        }
        auto multiply_chunk = [&](auto big_scales) {
          constexpr bool kBig = decltype(big_scales)::value;
          Mxfp4Factors fac[kMats][2] = {};
          if constexpr (F == WFormat::kMxfp4) {
#pragma unroll
            for (int m = 0; m < kMats; ++m) {
              fac[m][0] = mxfp4_factors<kBig>(a[d][m][0].scale);
              fac[m][1] = mxfp4_factors<kBig>(a[d][m][1].scale);
            }
          }
#pragma unroll
          for (int r = 0; r < Chunk<F>::kRuns; ++r) {
            const int64_t col = Chunk<F>::run_col(c, r, t);
            uint32_t aw[kMats][2][4];
#pragma unroll
            for (int m = 0; m < kMats; ++m) {
              row_words<F, kBig>(a[d][m][0], fac[m][0], r, aw[m][0]);
              row_words<F, kBig>(a[d][m][1], fac[m][1], r, aw[m][1]);
            }
#pragma unroll
            for (int nt = 0; nt < kTiles; ++nt) {
              if (nt * 8 >= n) continue;  // uniform: the chunk's count is the same for the whole warp
              uint32_t bw[4];
              b_words<F, XT>(brow[nt], col, col < p.cols, bw);
#pragma unroll
              for (int m = 0; m < kMats; ++m) {
                mma_bf16(acc[m][nt], aw[m][0][0], aw[m][1][0], aw[m][0][1], aw[m][1][1], bw[0], bw[1]);
                mma_bf16(acc[m][nt], aw[m][0][2], aw[m][1][2], aw[m][0][3], aw[m][1][3], bw[2], bw[3]);
              }
            }
          }
        };
        if (big) {
          multiply_chunk(std::true_type{});
        } else {
          multiply_chunk(std::false_type{});
        }
      }
    }

#pragma unroll
    for (int m = 0; m < kMats; ++m) {
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[m][warp][nt * 4 + i][lane] = acc[m][nt][i];
      }
    }
    __syncthreads();
    for (int item = warp; item < kTiles * 4; item += kSplit) {
      const int col = (item >> 2) * 8 + 2 * t + (item & 1);  // C element i = item & 3 of tile item >> 2
      if (col >= n) continue;
      const int64_t row = static_cast<int64_t>(blockIdx.x) * 16 + g + ((item & 2) ? 8 : 0);
      float v[kMats];
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        v[m] = partial[m][0][item][lane];
#pragma unroll
        for (int w = 1; w < kSplit; ++w) v[m] += partial[m][w][item][lane];
      }
      const int64_t pair = p.list.entries[begin + base + col];
      if constexpr (kGateUp) {
        static_cast<bf16*>(p.out)[pair * p.rows + row] =
            __float2bfloat16_rn(glu_value(v[0], v[kMats - 1], p.situ, p.situ_beta, p.situ_linear_beta));
      } else {
        static_cast<float*>(p.out)[pair * p.rows + row] = v[0];
      }
    }
    __syncthreads();  // the partials are rewritten by the next token chunk
  }
}

template <WFormat F, class XT, int kTiles, bool kGateUp>
__global__ void __launch_bounds__(kSplitK * 32) expert_gemm_kernel(ExpertGemmParams p) {
  expert_gemm<F, XT, kTiles, kGateUp>(p);
}

// MXFP4 weights at up to 8 tokens: at least 5 CTAs per SM (gate/up 94 registers instead of 122, down 72;
// no spills). The decode is latency-bound with few warps (ncu on an H200: 3.9 active warps per scheduler,
// 41% of cycles with none eligible). Measured there (kernel_bench --moe, K3 shapes, one call): 137.0 µs
// at batch 1 against 139.7 unbounded, 770.7 against 801.6 at batch 8. (6 CTAs: 137.0 / 768.4, but the
// gate/up GEMM spills.)
template <class XT, bool kGateUp>
__global__ void __launch_bounds__(kSplitK * 32, 5) expert_gemm_mxfp4_one_tile_kernel(ExpertGemmParams p) {
  expert_gemm<WFormat::kMxfp4, XT, 1, kGateUp>(p);
}

// BF16 weights at up to 8 tokens. Down: 4 warps and at least 7 CTAs per SM (54 registers, no spills);
// measured with ncu on an H200 at batch 8, with the same bound on an earlier form of this kernel, the down
// GEMM took 70 µs per call against 78 µs without it. (A minimum block count on every variant changes the
// others' register allocation too, and the larger tiles were slower with it.) Gate/up: 8 warps, at least 4
// CTAs per SM (64 registers): at batch 1 the 8 experts' 512 CTAs are all an SM gets (about 4), and twice
// the warps put twice the weight loads in flight. Measured on an H200 (kernel_bench --moe, one call):
// the routed experts at batch 1 took 40.1 µs against 42.8 with 4 warps, at batch 8 211.6 against 211.9;
// the 48B step at batch 1 2.865 and 2.872 ms against 2.969 and 2.942. (Also measured and dropped there:
// 4 warps with 2 chunks in flight, 8 warps with 2, 16 warps with 1, 8 warps for the down GEMM: batch 1
// 42.9 / 45.5 / 41.5 / 44.3 µs; and a per-warp cp.async ring of 2 to 6 stages in shared memory for every
// format, whose best form took 39.9 µs at batch 1 but 222 at batch 8, and left MXFP4 at 40%.)
template <class XT, bool kGateUp>
__global__ void __launch_bounds__(kGateUp ? 256 : 128, kGateUp ? 4 : 7)
    expert_gemm_bf16_one_tile_kernel(ExpertGemmParams p) {
  expert_gemm<WFormat::kBf16, XT, 1, kGateUp, kGateUp ? 8 : 4>(p);
}

// Token tiles per CTA pass: the largest a batch of T tokens can need per expert (T pairs, unless a token
// lists an expert twice), at most 4 (32 tokens).
template <WFormat F, class XT, bool kGateUp>
void launch_expert_gemm(const ExpertGemmParams& p, int64_t tokens, int64_t max_active, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows / 16), static_cast<unsigned>(max_active));
  if (tokens <= 8 && F == WFormat::kBf16) {
    launch_pdl(expert_gemm_bf16_one_tile_kernel<XT, kGateUp>, grid, kGateUp ? 256 : 128, 0, stream, p);
  } else if (tokens <= 8 && F == WFormat::kMxfp4) {
    launch_pdl(expert_gemm_mxfp4_one_tile_kernel<XT, kGateUp>, grid, kSplitK * 32, 0, stream, p);
  } else if (tokens <= 8) {
    launch_pdl(expert_gemm_kernel<F, XT, 1, kGateUp>, grid, kSplitK * 32, 0, stream, p);
  } else if (tokens <= 16) {
    launch_pdl(expert_gemm_kernel<F, XT, 2, kGateUp>, grid, kSplitK * 32, 0, stream, p);
  } else {
    launch_pdl(expert_gemm_kernel<F, XT, 4, kGateUp>, grid, kSplitK * 32, 0, stream, p);
  }
  HLM_CHECK_LAUNCH(kGateUp ? "expert_gemm_kernel (gate, up)" : "expert_gemm_kernel (down)");
}

// --- combine ---------------------------------------------------------------------------------------------
// Measured on an H200 and dropped: the combine done by the down GEMM's last CTA per 16-row tile (counted
// with an atomic per tile, __threadfence before and after), which saves this launch. kernel_bench --moe
// (48B) against this kernel, one call each: staged through 10 KB of shared memory, 39.1 → 50.8 µs at batch
// 1 and 211 → 295 at 8; a warp per (token, float4) at batch 1 only, 39.1 → 46.2 and 211 → 279 (the
// batch-8 path unchanged but for the params struct, above); the 48B batch-1 step 2.81 → 3.04 ms.
struct CombineParams {
  const float* y;        // [T·k, D]
  const int32_t* idx;    // [T, k]
  const float* weights;  // [T, k]
  float* out;            // [T, D]
  int64_t hidden;
  int64_t expert_begin;
  int top_k;
  int local;
  const void* addend;  // [T, D] added to the sum (moe_experts_add), BF16 or F32; nullptr: none
  bool addend_bf16;
};

// Grid (T, blocks of a token's D / 4 float4 columns): one float4 of one token per thread, summing the
// token's local slots in slot order, then adding the addend, if any (the fp32 add that add_inplace would
// do next). A token with no local expert gets zeros (plus the addend). The routing (idx, weights) and the
// addend are loaded before pdl_wait(): the router wrote them, and the side work that made the addend was
// joined before the work list, all kernels that completed before the down GEMM ahead of this one started
// (pdl.cuh); only the expert rows y come after the wait. Measured on an H200 against loading everything
// after the wait (kernel_bench --moe, one call, two runs each): the 48B's routed experts 37.9-38.3 against
// 39.2-39.4 µs at batch 1, 209-210 against 210-211 at batch 8; the MoE layer 58.3 against 59.5 µs
// (--layer-split).
// kSlots (the top_k rounded up to 8 or 16): all slots' loads go out before any is added (a loop over a
// run-time top_k waited for each slot's expert id, then its row, in turn); the sum is still taken in slot
// order. A weight is loaded whatever its slot's expert, so that it does not wait for the id. Sized by the
// top_k: with 16 slots for top-8 the kernel held 118 registers, two CTAs per SM, and an 8K-token prefill
// chunk's combine took 342 µs (2 TB/s; ncu on an H200); with 8, 64 registers and 158 µs.
template <int kSlots>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(CombineParams p) {
  const int64_t t = blockIdx.x;
  const int64_t d4 = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const bool inside = d4 * 4 < p.hidden;
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (p.addend != nullptr && inside) a = load_addend4(p.addend, p.addend_bf16, t, p.hidden, d4);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  auto add_slot = [&](float w, float4 v) {
    acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
  };
  if constexpr (kSlots > 0) {
    bool here[kSlots];
    float w[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int64_t pair = t * p.top_k + j;
      const int64_t e = j < p.top_k ? static_cast<int64_t>(p.idx[pair]) - p.expert_begin : -1;
      const float wj = j < p.top_k ? p.weights[pair] : 0.0f;
      here[j] = e >= 0 && e < p.local;
      w[j] = here[j] ? wj : 0.0f;
    }
    pdl_wait();
    pdl_trigger();
    if (!inside) return;
    float4 v[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      if (here[j]) v[j] = reinterpret_cast<const float4*>(p.y + (t * p.top_k + j) * p.hidden)[d4];
    }
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      if (here[j]) add_slot(w[j], v[j]);
    }
  } else {
    pdl_wait();
    pdl_trigger();
    if (!inside) return;
    for (int j = 0; j < p.top_k; ++j) {
      const int64_t pair = t * p.top_k + j;
      const int64_t e = static_cast<int64_t>(p.idx[pair]) - p.expert_begin;
      if (e >= 0 && e < p.local)
        add_slot(p.weights[pair], reinterpret_cast<const float4*>(p.y + pair * p.hidden)[d4]);
    }
  }
  acc.x += a.x, acc.y += a.y, acc.z += a.z, acc.w += a.w;
  reinterpret_cast<float4*>(p.out + t * p.hidden)[d4] = acc;
}

// The combine's launch: a token's D / 4 float4 columns in as few CTAs as take them at kCombineThreads
// each, split evenly (2,304 columns: 3 CTAs of 192 threads, where 256-thread CTAs left a third of the
// last one idle).
void launch_combine(const CombineParams& cp, int64_t rows, cudaStream_t stream) {
  const int64_t cols = blocks_for(cp.hidden, 4);
  const unsigned blocks = blocks_for(cols, kCombineThreads),
                 threads = 32 * blocks_for(blocks_for(cols, blocks), 32);
  const dim3 grid(static_cast<unsigned>(rows), blocks);
  if (cp.top_k <= 8) {
    launch_pdl(combine_kernel<8>, grid, threads, 0, stream, cp);
  } else if (cp.top_k <= kCombineMaxSlots) {
    launch_pdl(combine_kernel<kCombineMaxSlots>, grid, threads, 0, stream, cp);
  } else {
    launch_pdl(combine_kernel<0>, grid, threads, 0, stream, cp);
  }
  HLM_CHECK_LAUNCH("combine_kernel");
}

// MXFP4 codes [E_l, rows, cols/2] and scales [E_l, rows, cols/32] of one matrix.
void check_mxfp4(const Tensor& codes, const Tensor& scale, int64_t local, int64_t rows, int64_t cols,
                 const char* name) {
  const char* op = "moe_experts";
  expect_cuda(codes, op, name, {DType::kU8}, 3, "[E_l, rows, cols/2] (MXFP4 codes)");
  expect_cuda(scale, op, name, {DType::kU8}, 3, "[E_l, rows, cols/32] (MXFP4 scales)");
  HLM_CHECK(codes.dim(0) == local && scale.dim(0) == local && codes.dim(1) == rows && scale.dim(1) == rows &&
                codes.dim(2) * 2 == cols && scale.dim(2) * 32 == cols,
            "moe_experts: MXFP4 {} codes {} and scales {} do not hold {} experts of [{}, {}]", name,
            codes.describe(), scale.describe(), local, rows, cols);
}

// Steps 2 and 3 with the weight-streaming GEMMs: h = act(gate x)·up x, then y = down h, per pair.
void launch_streaming_experts(WFormat format, const Tensor& x, const ExpertWeights& ew, const WorkList& list,
                              Tensor& h, Tensor& y, int64_t top_k, const ActivationParams& act,
                              int64_t max_active, cudaStream_t stream) {
  const bool mxfp4 = format == WFormat::kMxfp4;
  const bool x_bf16 = x.dtype() == DType::kBF16;
  const int64_t rows = x.dim(0), hidden = x.dim(1), inter = ew.gate.dim(1);
  ExpertGemmParams gate_up{};
  gate_up.w = ew.gate.raw();
  gate_up.w_up = ew.up.raw();
  gate_up.w_scale = mxfp4 ? ew.gate_scale.data<uint8_t>() : nullptr;
  gate_up.w_up_scale = mxfp4 ? ew.up_scale.data<uint8_t>() : nullptr;
  gate_up.in = x.raw();
  gate_up.out = h.raw();
  gate_up.list = list;
  gate_up.rows = inter;
  gate_up.cols = hidden;
  gate_up.top_k = static_cast<int>(top_k);
  gate_up.situ = act.kind == Activation::kSitu;
  gate_up.situ_beta = act.situ_beta;
  gate_up.situ_linear_beta = act.situ_linear_beta;
  ExpertGemmParams down = gate_up;
  down.w = ew.down.raw();
  down.w_up = nullptr;
  down.w_scale = mxfp4 ? ew.down_scale.data<uint8_t>() : nullptr;
  down.w_up_scale = nullptr;
  down.in = h.raw();
  down.out = y.raw();
  down.rows = hidden;
  down.cols = inter;

  switch (format) {
    case WFormat::kBf16:
      x_bf16 ? launch_expert_gemm<WFormat::kBf16, bf16, true>(gate_up, rows, max_active, stream)
             : launch_expert_gemm<WFormat::kBf16, float, true>(gate_up, rows, max_active, stream);
      launch_expert_gemm<WFormat::kBf16, bf16, false>(down, rows, max_active, stream);
      break;
    case WFormat::kF32:
      x_bf16 ? launch_expert_gemm<WFormat::kF32, bf16, true>(gate_up, rows, max_active, stream)
             : launch_expert_gemm<WFormat::kF32, float, true>(gate_up, rows, max_active, stream);
      launch_expert_gemm<WFormat::kF32, bf16, false>(down, rows, max_active, stream);
      break;
    case WFormat::kMxfp4:
      x_bf16 ? launch_expert_gemm<WFormat::kMxfp4, bf16, true>(gate_up, rows, max_active, stream)
             : launch_expert_gemm<WFormat::kMxfp4, float, true>(gate_up, rows, max_active, stream);
      launch_expert_gemm<WFormat::kMxfp4, bf16, false>(down, rows, max_active, stream);
      break;
  }
}

}  // namespace

Tensor moe_experts(CudaContext& ctx, const Tensor& x, const Tensor& idx, const Tensor& weights,
                   const ExpertWeights& ew, int64_t expert_begin, const ActivationParams& act,
                   const Tensor* addend) {
  const char* op = "moe_experts";
  expect_cuda(x, op, "x", {DType::kBF16, DType::kF32}, 2, "[T, D]");
  expect_cuda(idx, op, "idx", {DType::kI32}, 2, "[T, k]");
  expect_cuda(weights, op, "weights", {DType::kF32}, 2, "[T, k]");
  expect_dim(idx, 0, x.dim(0), op, "idx [T, k]", "the token count of x [T, D]");
  expect_same_shape(idx, weights, op, "idx", "weights");
  const int64_t rows = x.dim(0), hidden = x.dim(1), top_k = idx.dim(1);
  const bool mxfp4 = ew.mxfp4();
  HLM_CHECK(ew.gate.defined() && ew.up.defined() && ew.down.defined() && ew.gate.rank() == 3,
            "moe_experts: the experts need gate, up and down weights [E_l, rows, cols]");
  const int64_t local = ew.gate.dim(0), inter = ew.gate.dim(1);
  WFormat format = WFormat::kMxfp4;
  if (mxfp4) {
    HLM_CHECK(ew.up_scale.defined() && ew.down_scale.defined(),
              "moe_experts: MXFP4 experts need scales for gate, up and down");
    check_mxfp4(ew.gate, ew.gate_scale, local, inter, hidden, "gate");
    check_mxfp4(ew.up, ew.up_scale, local, inter, hidden, "up");
    check_mxfp4(ew.down, ew.down_scale, local, hidden, inter, "down");
  } else {
    expect_cuda(ew.gate, op, "gate", {DType::kBF16, DType::kF32}, 3, "[E_l, I, D]");
    expect_cuda(ew.up, op, "up", {ew.gate.dtype()}, 3, "[E_l, I, D] of gate's dtype");
    expect_cuda(ew.down, op, "down", {ew.gate.dtype()}, 3, "[E_l, D, I] of gate's dtype");
    expect_same_shape(ew.gate, ew.up, op, "gate", "up");
    expect_dim(ew.gate, 2, hidden, op, "gate [E_l, I, D]", "the hidden size of x [T, D]");
    expect_dim(ew.down, 0, local, op, "down [E_l, D, I]", "the local expert count of gate [E_l, I, D]");
    expect_dim(ew.down, 1, hidden, op, "down [E_l, D, I]", "the hidden size of x [T, D]");
    expect_dim(ew.down, 2, inter, op, "down [E_l, D, I]", "the intermediate size of gate [E_l, I, D]");
    format = ew.gate.dtype() == DType::kBF16 ? WFormat::kBf16 : WFormat::kF32;
  }
  HLM_CHECK(expert_begin >= 0, "moe_experts: expert_begin must be >= 0, got {}", expert_begin);
  // 16-row tiles, K runs of 8 to 32 columns (an MXFP4 scale group), 16-byte loads.
  HLM_CHECK(hidden % 32 == 0 && inter % 32 == 0,
            "moe_experts: the CUDA experts need hidden ({}) and intermediate ({}) sizes divisible by 32",
            hidden, inter);
  HLM_CHECK(
      aligned16(x.raw()) && aligned16(ew.gate.raw()) && aligned16(ew.up.raw()) && aligned16(ew.down.raw()),
      "moe_experts: x and the expert weights must be 16-byte aligned");
  HLM_CHECK(local <= kMaxLocalExperts,
            "moe_experts: the CUDA work list takes at most {} local experts, got {}", kMaxLocalExperts,
            local);
  HLM_CHECK(rows * top_k <= INT32_MAX, "moe_experts: {} tokens x {} experts overflow the 32-bit work list",
            rows, top_k);

  if (addend != nullptr) {
    expect_cuda(*addend, op, "addend", {DType::kBF16, DType::kF32}, 2, "[T, D]");
    expect_dim(*addend, 0, rows, op, "addend [T, D]", "the token count of x [T, D]");
    expect_dim(*addend, 1, hidden, op, "addend [T, D]", "the hidden size of x [T, D]");
    HLM_CHECK(aligned16(addend->raw()), "moe_experts: the addend must be 16-byte aligned");
  }

  Tensor out = ctx.empty({rows, hidden}, DType::kF32);  // [T, D]
  if (rows == 0) return out;
  if (local == 0 || top_k == 0) {
    HLM_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.nbytes(), ctx.stream()));
    if (addend != nullptr) add_inplace(ctx, out, *addend);
    return out;
  }
  const int64_t pairs = rows * top_k;
  const int64_t max_active = std::min(local, pairs);
  const bool x_bf16 = x.dtype() == DType::kBF16;
  if (format == WFormat::kBf16 && x_bf16 && decode_experts_fit(rows, top_k, hidden, inter)) {
    Tensor y = ctx.empty({inter / decode_experts_slice(inter), pairs, hidden}, DType::kF32);  // [S, T·k, D]
    const DecodeExpertsParams dp{ew.gate.raw(),
                                 ew.up.raw(),
                                 ew.down.raw(),
                                 x.raw(),
                                 idx.data<int32_t>(),
                                 weights.data<float>(),
                                 y.data<float>(),
                                 out.data<float>(),
                                 addend != nullptr ? addend->raw() : nullptr,
                                 addend != nullptr && addend->dtype() == DType::kBF16,
                                 rows,
                                 hidden,
                                 inter,
                                 expert_begin,
                                 static_cast<int>(local),
                                 static_cast<int>(top_k),
                                 act.kind == Activation::kSitu,
                                 act.situ_beta,
                                 act.situ_linear_beta};
    launch_decode_experts(dp, ctx.stream());
    return out;
  }
  const int64_t tiled_min_pairs =
      format == WFormat::kMxfp4 ? kTiledMinPairsPerMxfp4Expert : kTiledMinPairsPerExpert;
  const bool tiled = format != WFormat::kF32 && x_bf16 && tiled_experts_fit(hidden, inter) &&
                     pairs >= tiled_min_pairs * local && rows >= kTiledMinTokens;
  const int64_t list_ints = 1 + 3 * max_active + pairs;
  const int64_t list_ctas = pairs >= kListMultiCtaPairs ? blocks_for(pairs, kListPairsPerCta) : 0;
  const int64_t table_ints = tiled ? tile_table_ints(pairs, max_active) : 0;
  Tensor meta = ctx.empty({list_ints + table_ints + list_ctas * local}, DType::kI32);
  int32_t* m = meta.data<int32_t>();
  const WorkList list{m, m + 1, m + 1 + max_active, m + 1 + 2 * max_active, m + 1 + 3 * max_active};
  const WorkListParams lp{idx.data<int32_t>(),       pairs, expert_begin,
                          static_cast<int>(local),   list,  static_cast<int>(list_ctas),
                          m + list_ints + table_ints};
  if (pairs <= 32) {
    launch_pdl(build_small_work_list_kernel, 1, 32, 0, ctx.stream(), lp);
  } else if (list_ctas == 0) {
    launch_pdl(build_work_list_kernel, 1, kListThreads, 0, ctx.stream(), lp);
  } else {
    const auto ctas = static_cast<unsigned>(list_ctas);
    launch_pdl(count_pairs_kernel, ctas, kListThreads, 0, ctx.stream(), lp);
    launch_pdl(segment_pairs_kernel, 1, kListThreads, 0, ctx.stream(), lp);
    launch_pdl(place_pairs_kernel, ctas, kListThreads, 0, ctx.stream(), lp);
  }
  HLM_CHECK_LAUNCH("build_work_list_kernel");

  Tensor h = ctx.empty({pairs, inter}, DType::kBF16);  // [T·k, I] act(gate)·up per pair
  Tensor y = ctx.empty({pairs, hidden}, DType::kF32);  // [T·k, D] expert output per pair
  cudaStream_t stream = ctx.stream();
  if (tiled) {
    const bool mxfp4 = format == WFormat::kMxfp4;
    const TiledExpertsParams tp{ew.gate.raw(),
                                ew.up.raw(),
                                ew.down.raw(),
                                mxfp4 ? ew.gate_scale.data<uint8_t>() : nullptr,
                                mxfp4 ? ew.up_scale.data<uint8_t>() : nullptr,
                                mxfp4 ? ew.down_scale.data<uint8_t>() : nullptr,
                                x.raw(),
                                h.raw(),
                                y.raw(),
                                list,
                                pairs,
                                max_active,
                                hidden,
                                inter,
                                static_cast<int>(top_k),
                                act.kind == Activation::kSitu,
                                act.situ_beta,
                                act.situ_linear_beta};
    launch_tiled_experts(tp, m + list_ints, stream);
  } else {
    launch_streaming_experts(format, x, ew, list, h, y, top_k, act, max_active, stream);
  }

  const CombineParams cp{y.data<float>(),
                         idx.data<int32_t>(),
                         weights.data<float>(),
                         out.data<float>(),
                         hidden,
                         expert_begin,
                         static_cast<int>(top_k),
                         static_cast<int>(local),
                         addend != nullptr ? addend->raw() : nullptr,
                         addend != nullptr && addend->dtype() == DType::kBF16};
  launch_combine(cp, rows, stream);
  return out;
}

}  // namespace hlm::cuda
