// MLA on the GPU (docs/MODEL.md §6.2, docs/HELIX.md §3-4, docs/KERNELS.md §5): writing rows of the paged
// latent cache, the partial attention of this rank's queries over its local pages with (max, sum)
// statistics, and the exact LSE merge of partials (across CP ranks, and across the KV splits of one rank).
//
// mla_attention is one kernel for decode and prefill. A CTA owns a block of kRows = 32 query rows (a row is
// one (token, head) pair; the rows of a block belong to one sequence: 32 heads of one token, or 4 tokens of
// 8 heads) and one split of that block's keys. Every key tile it loads from the cache is shared by all 32
// rows, so a decode token of 32 heads reads its K/V bytes once. The math runs on BF16 tensor cores
// (mma.sync m16n8k16, fp32 accumulation): S = Q·Kᵀ, an online softmax in fp32, O += P·V with P rounded to
// bf16 and V the first v_dim columns of the same tile. Decode needs more CTAs than it has row blocks, so
// the keys are split: the number of splits is fixed at launch from host shapes (enough CTAs to fill the
// GPU: 132 splits for one decode token of 32 heads, 1 for a prefill of many tokens), and each split takes
// its share of the block's key tiles from the device kv_len, so a CUDA graph replayed with other lengths
// stays exact. With one split the kernel writes the result; with several it writes per-split partials
// (normalized within the split) that the combine kernel merges exactly, the same merge lse_combine does
// across ranks.
//
// Tiles of 64 keys in a ring of two: one loads while the other is in the math. A ring of four 32-key
// tiles (more bytes in flight per SM) measured slower on an H200 at 64K-1M keys: the split launch is bound
// by instruction issue (mma.sync, the softmax and the O rescale), not by the depth of the copy pipeline
// (docs/benchmarks.md, MLA decode).
#include <algorithm>
#include <cmath>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

constexpr int kRows = 32;              // query rows per CTA: two m16 tiles
constexpr int kWarps = 8;              // S: key groups x slices of D; P·V: 8 column slices of V
constexpr int kThreads = kWarps * 32;  // also 8 threads per row in the softmax
constexpr int kMaxCombineSources = 8192;
static_assert(kThreads == 8 * kRows, "softmax thread mapping");

// Tile shapes. kD: the cache row / query width D rounded up (a multiple of 16 per slice of D in S); kV: the
// value width rounded up (multiple of 128: 8 warps of 16 columns); kKeys keys per tile, a ring of kStages
// tiles (kStages - 1 loading while one is in the math). Columns past D are zero-filled in shared memory;
// value columns past v_dim are computed and dropped.
template <int D_, int V_, int Keys_, int Stages_>
struct MlaShape {
  static constexpr int kD = D_;
  static constexpr int kV = V_;
  static constexpr int kKeys = Keys_;
  static constexpr int kStages = Stages_;
  static constexpr int kLd = kD + 8;  // bf16 row stride of Q and K tiles: +16 B keeps ldmatrix conflict-free
  static constexpr int kKeyGroups = kKeys / 16;       // S: warps side by side over the keys of a tile
  static constexpr int kParts = kWarps / kKeyGroups;  // S: slices of D, summed in the softmax
  static constexpr int kScoreLd = kKeys + 8;          // row stride (floats) of S: conflict-free float2 stores
  static constexpr int kProbLd = kKeys + 8;           // row stride (bf16) of P: conflict-free ldmatrix rows
  static constexpr int kThreadsPerKey = kThreads / kKeys;       // tile copy
  static constexpr int kKeysPerThread = kKeys / 8;              // softmax: 8 threads per row
  static constexpr int kQChunks = kRows * (kD / 8) / kThreads;  // 16-byte chunks of Q per thread
  static_assert(kD % 32 == 0 && kV % 128 == 0 && kV <= kD, "MLA tile shape");
  static_assert(kKeys % 16 == 0 && kWarps % kKeyGroups == 0 && kD % (16 * kParts) == 0 &&
                    kThreads % kKeys == 0 && kKeysPerThread % 4 == 0 && kScoreLd % 4 == 0 && kStages >= 2,
                "MLA key tiling");
  static_assert(kRows * (kD / 8) % kThreads == 0, "Q copy mapping");
  // Dynamic shared memory, in this order: K tiles [kStages][kKeys][kLd] bf16, Q [kRows][kLd] bf16, partial
  // scores [kParts][kRows][kScoreLd] f32, P [kRows][kProbLd] bf16. Every part is a multiple of 16 bytes.
  static constexpr size_t kTileBytes = size_t{kKeys} * kLd * 2;
  static constexpr size_t kQOffset = kStages * kTileBytes;
  static constexpr size_t kScoreOffset = kQOffset + size_t{kRows} * kLd * 2;
  static constexpr size_t kProbOffset = kScoreOffset + kParts * size_t{kRows} * kScoreLd * 4;
  static constexpr size_t kSmemBytes = kProbOffset + size_t{kRows} * kProbLd * 2;
};
using MlaLarge = MlaShape<576, 512, 64, 2>;  // Kimi Linear / K3: D = 512 + 64, v = 512
using MlaSmall = MlaShape<128, 128, 64, 2>;  // the fixtures and anything up to 128 wide

struct MlaParams {
  const void* q;          // [T, H, D] BF16 or F32
  const bf16* cache;      // [pages, P, D]
  const int* page_table;  // [N]
  const int* seqs;        // [S, 4]: token_begin, token_count, page_begin, num_pages
  const int* kv_len;      // [T]
  float* out;             // one split: [T, H, v_dim]; several: partials [splits, T·H, v_dim]
  float* stats;           // one split: [T, H, 2]; several: partials [splits, T·H, 2]
  int64_t cache_pages;
  int tokens, heads, dim, v_dim, page_size, num_seqs, page_table_len, splits;
  float scale;
};

// --- warp-level tensor-core primitives (ldsm_x4 and ldsm_x4_trans: mma.cuh) ----------------------------
// d += a·b for a 16x16 (row-major) bf16 tile a and a 16x8 (column-major) bf16 tile b, fp32 accumulators.
// Fragments (g = lane/4, c = 2·(lane%4)): a = {(g, c..c+1), (g+8, c..), (g, c+8..), (g+8, c+8..)},
// b = {(k c..c+1, n g), (k c+8..c+9, n g)}, d = {(g, c), (g, c+1), (g+8, c), (g+8, c+1)}.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Eight consecutive query elements as bf16 (16 bytes).
__device__ __forceinline__ uint4 load8_bf16(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint4 load8_bf16(const float* p) {
  return f32x8_to_bf16(reinterpret_cast<const uint4*>(p)[0], reinterpret_cast<const uint4*>(p)[1]);
}

// --- the batch table ---------------------------------------------------------------------------------------
struct SeqView {
  int token_begin, token_count, page_begin, num_pages;
};

// Sequence s of the device table, clamped to the tensors so that a bad entry cannot reach outside them
// (the host checks its own copy of the list; under graphs the device table is refilled between replays).
__device__ __forceinline__ SeqView read_seq(const MlaParams& p, int s) {
  const int* e = p.seqs + 4 * static_cast<int64_t>(s);
  SeqView v{e[0], e[1], e[2], e[3]};
  if (v.token_begin < 0 || v.token_begin > p.tokens) v.token_count = 0;
  v.token_count = max(0, min(v.token_count, p.tokens - v.token_begin));
  if (v.page_begin < 0 || v.page_begin > p.page_table_len) v.num_pages = 0;
  v.num_pages = max(0, min(v.num_pages, p.page_table_len - v.page_begin));
  return v;
}

// Row blocks are numbered sequence by sequence (sequence s has ceil(token_count·H / kRows) of them). Warp 0
// finds the sequence of block `b` and its index there; a block past the last one (spare) gets seq -1 and the
// total count, for zeroing the rows of tokens outside every sequence. Returned in every lane.
struct BlockOf {
  int seq, local, total;
};
__device__ BlockOf find_block(const MlaParams& p, int b, int lane) {
  int base = 0;
  for (int s0 = 0; s0 < p.num_seqs; s0 += 32) {
    const int s = s0 + lane;
    const int blocks = s < p.num_seqs ? (read_seq(p, s).token_count * p.heads + kRows - 1) / kRows : 0;
    int incl = blocks;  // inclusive scan of the block counts over the lanes
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int first = base + incl - blocks;
    const unsigned mine = __ballot_sync(0xffffffffu, b >= first && b < first + blocks);
    if (mine != 0) {
      const int src = __ffs(mine) - 1;
      return BlockOf{s0 + src, b - __shfl_sync(0xffffffffu, first, src), 0};
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  return BlockOf{-1, 0, base};
}

// A spare CTA (one past the row blocks) writes (-inf, 0) statistics, and with one split zero outputs, for
// the rows of every token no sequence covers (padding of a decode graph, gaps in a batch). Each warp takes
// tokens in turn; with several splits each split's spare CTAs fill that split's partial statistics.
__device__ void zero_uncovered_rows(const MlaParams& p, int spare, int num_spare, int warp, int lane) {
  const int64_t rows = static_cast<int64_t>(p.tokens) * p.heads;
  for (int t = spare * kWarps + warp; t < p.tokens; t += num_spare * kWarps) {
    bool covered = false;
    for (int s0 = 0; s0 < p.num_seqs && !covered; s0 += 32) {
      bool in = false;
      if (s0 + lane < p.num_seqs) {
        const SeqView v = read_seq(p, s0 + lane);
        in = t >= v.token_begin && t < v.token_begin + v.token_count;
      }
      covered = __any_sync(0xffffffffu, in);
    }
    if (covered) continue;
    const int64_t row0 = static_cast<int64_t>(t) * p.heads;
    const int64_t plane = p.splits > 1 ? blockIdx.y * rows : 0;  // this split's partials
    for (int h = lane; h < p.heads; h += 32) {
      p.stats[(plane + row0 + h) * 2] = -INFINITY;
      p.stats[(plane + row0 + h) * 2 + 1] = 0.0f;
    }
    if (p.splits == 1) {
      for (int64_t i = lane; i < static_cast<int64_t>(p.heads) * p.v_dim; i += 32)
        p.out[row0 * p.v_dim + i] = 0.0f;
    }
  }
}

// --- the attention kernel ----------------------------------------------------------------------------------
// Grid (row-block slots, splits), kThreads threads, Shape::kSmemBytes of dynamic shared memory, one CTA per
// SM. Per key tile: (1) kThreadsPerKey threads per key copy its cache row (cp.async, kStages - 1 tiles
// ahead of the math); (2) warp w computes partial scores S[32 rows, keys 16·(w % kKeyGroups) ..+16] over
// slice w / kKeyGroups of D; (3) 8 threads per row sum the slices, scale, mask by the row's kv_len and
// update the row's running (max, sum), writing P (bf16) and the rescale factor; (4) warp w rescales and
// accumulates O[32 rows, its kV/8 columns] += P·V. An m16 tile past the block's last row skips its MMAs.
template <class Shape, class TQ>
__global__ void __launch_bounds__(kThreads, 1) mla_attention_kernel(const MlaParams p) {
  pdl_wait();
  pdl_trigger();
  constexpr int kD = Shape::kD, kLd = Shape::kLd, kKeys = Shape::kKeys, kStages = Shape::kStages;
  constexpr int kScoreLd = Shape::kScoreLd, kProbLd = Shape::kProbLd, kKeysPerThread = Shape::kKeysPerThread;
  constexpr int kWarpCols = Shape::kV / kWarps;  // value columns of one warp
  constexpr int kColTiles = kWarpCols / 8;       // n8 tiles of one warp
  constexpr int kPartD = kD / Shape::kParts;     // the slice of D one warp covers in S
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* k_tiles = reinterpret_cast<bf16*>(smem);                         // [kStages][kKeys][kLd]
  bf16* q_tile = reinterpret_cast<bf16*>(smem + Shape::kQOffset);        // [kRows][kLd]
  float* scores = reinterpret_cast<float*>(smem + Shape::kScoreOffset);  // [kParts][kRows][kScoreLd]
  bf16* probs = reinterpret_cast<bf16*>(smem + Shape::kProbOffset);      // [kRows][kProbLd]
  __shared__ int row_kv[kRows];       // visible keys of each row of the block (0 past its last row)
  __shared__ float row_alpha[kRows];  // rescale of O for the current tile
  __shared__ float row_max[kRows], row_sum[kRows];
  __shared__ BlockOf block;
  __shared__ int kv_max;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c2 = 2 * (lane & 3);  // mma fragment row and column pair
  if (warp == 0) {
    const BlockOf b = find_block(p, blockIdx.x, lane);
    if (lane == 0) block = b;
  }
  __syncthreads();
  if (block.seq < 0) {
    zero_uncovered_rows(p, blockIdx.x - block.total, gridDim.x - block.total, warp, lane);
    return;
  }
  const SeqView seq = read_seq(p, block.seq);
  const int row_begin = seq.token_begin * p.heads + block.local * kRows;  // first flat row t·H + h
  const int num_rows = min(kRows, (seq.token_begin + seq.token_count) * p.heads - row_begin);
  const bool two_tiles = num_rows > 16;  // whether the second m16 tile holds rows
  // Keys its pages hold (capped so that key indices rounded up to whole tiles stay in 32 bits).
  const int64_t seq_keys64 = static_cast<int64_t>(seq.num_pages) * p.page_size;
  const int seq_keys = static_cast<int>(seq_keys64 < INT32_MAX - kKeys ? seq_keys64 : INT32_MAX - kKeys);
  if (warp == 0) {
    int kv = 0;
    if (lane < num_rows) kv = max(0, min(p.kv_len[(row_begin + lane) / p.heads], seq_keys));
    row_kv[lane] = kv;
    kv = __reduce_max_sync(0xffffffffu, kv);
    if (lane == 0) kv_max = kv;
  }
  __syncthreads();

  // This split's key tiles: an even share of the tiles covering the block's longest kv_len. (Measured on
  // an H200: giving each split at least 4 tiles when the keys are few, so that fewer partials are written
  // and combined, made the 4K and 16K batch-1 steps of the 48B model 1.5% slower.)
  const int64_t tiles = (kv_max + kKeys - 1) / kKeys;
  const int tile_begin = static_cast<int>(tiles * blockIdx.y / p.splits);
  const int tile_end = static_cast<int>(tiles * (blockIdx.y + 1) / p.splits);
  const int key_end = min(kv_max, tile_end * kKeys);

  // Tile copy: thread tid copies 16-byte chunks tid % kThreadsPerKey, + kThreadsPerKey, ... of key
  // tid / kThreadsPerKey; keys at or past key_end and columns past D are zero-filled, so every value the
  // MMAs read is finite.
  auto load_tile = [&](int tile, int buf) {
    const int k = tid / Shape::kThreadsPerKey, key = tile * kKeys + k;
    const bf16* src = p.cache;
    bool valid = key < key_end;
    if (valid) {
      const int page = p.page_table[seq.page_begin + key / p.page_size];
      valid = page >= 0 && page < p.cache_pages;
      if (valid) src = p.cache + (static_cast<int64_t>(page) * p.page_size + key % p.page_size) * p.dim;
    }
    bf16* dst = k_tiles + (buf * kKeys + k) * kLd;
    for (int c = tid % Shape::kThreadsPerKey; c < kD / 8; c += Shape::kThreadsPerKey) {
      const bool chunk = valid && c * 8 < p.dim;
      cp_async16(dst + c * 8, chunk ? src + c * 8 : p.cache, chunk);
    }
  };
  // The first kStages - 1 tiles go in flight before Q is read, one commit group per tile (empty past the
  // split's end, so that every thread waits on the same group count below).
  for (int s = 0; s < kStages - 1; ++s) {
    if (tile_begin + s < tile_end) load_tile(tile_begin + s, s);
    cp_async_commit();
  }

  // Q of the block, as bf16, zero past D and past the block's rows: every load issued before any store.
  {
    const TQ* q = static_cast<const TQ*>(p.q);
    uint4 chunk[Shape::kQChunks];
#pragma unroll
    for (int j = 0; j < Shape::kQChunks; ++j) {
      const int c = tid + j * kThreads, r = c / (kD / 8), col = (c % (kD / 8)) * 8;
      chunk[j] = make_uint4(0, 0, 0, 0);
      if (r < num_rows && col < p.dim)
        chunk[j] = load8_bf16(q + static_cast<int64_t>(row_begin + r) * p.dim + col);
    }
#pragma unroll
    for (int j = 0; j < Shape::kQChunks; ++j) {
      const int c = tid + j * kThreads;
      *reinterpret_cast<uint4*>(q_tile + (c / (kD / 8)) * kLd + (c % (kD / 8)) * 8) = chunk[j];
    }
  }

  float o[2][kColTiles][4] = {};               // O[m16 tile][n8 tile of this warp's columns], fragment layout
  float m_run = -INFINITY, l_run = 0.0f;       // softmax state of row tid/8, the same in its 8 threads
  const int srow = tid >> 3, spart = tid & 7;  // softmax: row and key slice of this thread
  const int part = warp / Shape::kKeyGroups, key_group = (warp % Shape::kKeyGroups) * 16;
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int i = tile - tile_begin;
    const bf16* kt = k_tiles + (i % kStages) * kKeys * kLd;  // [kKeys][kLd]
    cp_async_wait<kStages - 2>();                            // this thread's copies of tile i have landed
    // Tile i (and, the first time, Q) visible to all; every warp is done with tile i - 1's buffer and P.
    __syncthreads();
    if (tile + kStages - 1 < tile_end) load_tile(tile + kStages - 1, (i + kStages - 1) % kStages);
    cp_async_commit();

    // (2) partial scores over dims [part·kPartD, (part+1)·kPartD) for keys key_group..+16.
    {
      // Even and odd k-steps accumulate apart (summed at the end): twice the independent MMA chains.
      float s[2][2][2][4] = {};  // [k-step parity][m16 tile][n8 tile][fragment]
#pragma unroll
      for (int kk = 0; kk < kPartD / 16; ++kk) {
        const int d = part * kPartD + kk * 16;
        uint32_t b[4];  // keys +0..7 and +8..15, dims d..d+7 and d+8..d+15
        ldsm_x4(b, kt + (key_group + ((lane >> 4) << 3) + (lane & 7)) * kLd + d + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          if (mt == 1 && !two_tiles) break;
          uint32_t a[4];
          ldsm_x4(a, q_tile + (mt * 16 + (lane & 15)) * kLd + d + (lane >> 4) * 8);
          mma_bf16(s[kk & 1][mt][0], a, b[0], b[1]);
          mma_bf16(s[kk & 1][mt][1], a, b[2], b[3]);
        }
      }
      float* sp = scores + part * kRows * kScoreLd;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const float *even = s[0][mt][nt], *odd = s[1][mt][nt];
          float* at = sp + (mt * 16 + g) * kScoreLd + key_group + nt * 8 + c2;
          *reinterpret_cast<float2*>(at) = make_float2(even[0] + odd[0], even[1] + odd[1]);
          *reinterpret_cast<float2*>(at + 8 * kScoreLd) = make_float2(even[2] + odd[2], even[3] + odd[3]);
        }
      }
    }
    __syncthreads();

    // (3) online softmax of row srow over keys spart·kKeysPerThread ..+kKeysPerThread of the tile.
    {
      const int kv = row_kv[srow], key0 = tile * kKeys + spart * kKeysPerThread;
      float logit[kKeysPerThread] = {};
#pragma unroll
      for (int sl = 0; sl < Shape::kParts; ++sl) {  // 16-byte loads: a quarter-warp reads one 128-byte row
        const float* sp = scores + (sl * kRows + srow) * kScoreLd + spart * kKeysPerThread;
#pragma unroll
        for (int e = 0; e < kKeysPerThread; e += 4) {
          const float4 v = *reinterpret_cast<const float4*>(sp + e);
          logit[e] += v.x, logit[e + 1] += v.y, logit[e + 2] += v.z, logit[e + 3] += v.w;
        }
      }
      float tile_max = -INFINITY;
#pragma unroll
      for (int e = 0; e < kKeysPerThread; ++e) {
        logit[e] *= p.scale;
        if (key0 + e < kv) tile_max = fmaxf(tile_max, logit[e]);
      }
      for (int o8 = 1; o8 < 8; o8 <<= 1)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o8));
      const float m_new = fmaxf(m_run, tile_max);
      // No visible key so far: O and the sum are 0, and exp(-inf - -inf) must not be formed.
      const float alpha = m_run == -INFINITY ? 0.0f : expf(m_run - m_new);
      float pv[kKeysPerThread], sum = 0.0f;
#pragma unroll
      for (int e = 0; e < kKeysPerThread; ++e) {
        pv[e] = key0 + e < kv ? expf(logit[e] - m_new) : 0.0f;
        sum += pv[e];
      }
      uint32_t* dst = reinterpret_cast<uint32_t*>(probs + srow * kProbLd + spart * kKeysPerThread);
#pragma unroll
      for (int e = 0; e < kKeysPerThread; e += 2) dst[e / 2] = pack_bf16x2(pv[e], pv[e + 1]);
      for (int o8 = 1; o8 < 8; o8 <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o8);
      l_run = l_run * alpha + sum;
      m_run = m_new;
      if (spart == 0) row_alpha[srow] = alpha;
    }
    __syncthreads();

    // (4) O = O·alpha + P·V over this warp's value columns.
    const int col0 = warp * kWarpCols;
    // Every tile, even where no row's max moved: skipping multiplies by 1 behind a warp vote measured slower.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const float a_lo = row_alpha[mt * 16 + g], a_hi = row_alpha[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt) {
        o[mt][nt][0] *= a_lo;
        o[mt][nt][1] *= a_lo;
        o[mt][nt][2] *= a_hi;
        o[mt][nt][3] *= a_hi;
      }
    }
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t a[2][4];
      ldsm_x4(a[0], probs + (lane & 15) * kProbLd + kk * 16 + (lane >> 4) * 8);
      if (two_tiles) ldsm_x4(a[1], probs + (16 + (lane & 15)) * kProbLd + kk * 16 + (lane >> 4) * 8);
      for (int np = 0; np < kColTiles / 2; ++np) {
        uint32_t b[4];  // keys kk·16 + 0..7 / 8..15 for columns +0..7, then for columns +8..15
        ldsm_x4_trans(
            b, kt + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kLd + col0 + np * 16 + (lane >> 4) * 8);
        for (int mt = 0; mt < 2; ++mt) {
          if (mt == 1 && !two_tiles) break;
          mma_bf16(o[mt][2 * np], a[mt], b[0], b[1]);
          mma_bf16(o[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  // Epilogue: O / sum, and (max, sum); a row without keys in this split gives 0 and (-inf, 0).
  if (spart == 0) {
    row_max[srow] = m_run;
    row_sum[srow] = l_run;
  }
  __syncthreads();
  const int64_t plane = p.splits > 1 ? blockIdx.y * (static_cast<int64_t>(p.tokens) * p.heads) : 0;
  if (tid < num_rows) {
    p.stats[(plane + row_begin + tid) * 2] = row_max[tid];
    p.stats[(plane + row_begin + tid) * 2 + 1] = row_sum[tid];
  }
  for (int mt = 0; mt < 2; ++mt) {
    for (int hi = 0; hi < 2; ++hi) {
      const int r = mt * 16 + g + 8 * hi;
      // A split's partial without keys has weight 0 in the merge and is never read: not written.
      if (r >= num_rows || (p.splits > 1 && row_sum[r] == 0.0f)) continue;
      const float inv = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
      float* dst = p.out + (plane + row_begin + r) * p.v_dim;
      for (int nt = 0; nt < kColTiles; ++nt) {
        const int col = warp * kWarpCols + nt * 8 + c2;
        if (col < p.v_dim) dst[col] = o[mt][nt][2 * hi] * inv;
        if (col + 1 < p.v_dim) dst[col + 1] = o[mt][nt][2 * hi + 1] * inv;
      }
    }
  }
}

template <class Shape, class TQ>
void launch_mla_attention(const MlaParams& p, dim3 grid, cudaStream_t stream) {
  // Above 48 KB a kernel must opt in to its dynamic shared memory; once per instantiation.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      mla_attention_kernel<Shape, TQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes);
  HLM_CUDA_CHECK(opt_in);
  launch_pdl(mla_attention_kernel<Shape, TQ>, grid, kThreads, Shape::kSmemBytes, stream, p);
  HLM_CHECK_LAUNCH("mla_attention");
}

// --- exact merge of partials (lse_combine, and the splits of mla_attention) --------------------------------
struct CombineParams {
  const float* parts;  // [R, rows, V]
  const float* stats;  // [R, rows, 2]
  float* out;          // [rows, V]
  float* out_stats;    // [rows, 2] (the merged max and sum), or null
  int64_t rows;
  int v_dim, sources;
};

constexpr int kCombineThreads = 256;
constexpr int kCombineGroups = kCombineThreads / 32;  // sources are dealt to 8 warps

// Grid (rows, ceil(V / (32·kVec))). The CTA forms the weights w_i = s_i·exp(m_i − M) / Σ of its row once
// (block reductions, so every CTA of a row gets the same bits), then lane l of warp g sums w_i·part_i for
// its kVec columns over sources g, g+8, ... (so a long source list is read by 8 chains in parallel, each
// load kVec·4 bytes) and the warps are added in shared memory, in warp order. Sources of weight 0 (empty:
// (-inf, 0)) add nothing, whatever their parts hold: their loads are issued with the others (unrolled),
// their values dropped by a select.
template <int kVec>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const CombineParams p) {
  pdl_wait();
  pdl_trigger();
  constexpr int kCols = 32 * kVec;
  extern __shared__ float weight[];  // [sources]
  __shared__ float scratch[32];
  __shared__ float group_sum[kCombineGroups][kCols];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  float m = -INFINITY;
  for (int i = tid; i < p.sources; i += kCombineThreads) m = fmaxf(m, p.stats[(i * p.rows + row) * 2]);
  const float global_max = block_max(m, scratch);
  float denom = 0.0f;
  if (global_max != -INFINITY) {
    for (int i = tid; i < p.sources; i += kCombineThreads) {
      const float mi = p.stats[(i * p.rows + row) * 2], si = p.stats[(i * p.rows + row) * 2 + 1];
      weight[i] = si * expf(mi - global_max);  // 0 for an empty source (-inf, 0)
      denom += weight[i];
    }
  }
  denom = block_sum(denom, scratch);   // its barriers also publish the weights
  const bool empty = !(denom > 0.0f);  // no keys anywhere: output 0
  const int lane = tid & 31, group = tid >> 5;
  const int col = blockIdx.y * kCols + lane * kVec;  // kVec > 1 only when kVec divides V
  float acc[kVec] = {};
  if (!empty && col < p.v_dim) {
#pragma unroll 4
    for (int i = group; i < p.sources; i += kCombineGroups) {
      const float wi = weight[i];
      if (wi == 0.0f) continue;  // a split without keys wrote no partial (uniform: a warp shares i)
      const float* src = p.parts + (i * p.rows + row) * p.v_dim + col;
      float v[kVec];
      if constexpr (kVec == 4) {
        const float4 x = *reinterpret_cast<const float4*>(src);
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
      } else {
        v[0] = *src;
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] += wi / denom * v[e];
    }
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) group_sum[group][lane * kVec + e] = acc[e];
  __syncthreads();
  const int out_col = blockIdx.y * kCols + tid;
  if (tid < kCols && out_col < p.v_dim) {
    float y = 0.0f;
    for (int k = 0; k < kCombineGroups; ++k) y += group_sum[k][tid];
    p.out[row * p.v_dim + out_col] = y;
  }
  if (p.out_stats != nullptr && blockIdx.y == 0 && tid == 0) {
    p.out_stats[row * 2] = empty ? -INFINITY : global_max;
    p.out_stats[row * 2 + 1] = empty ? 0.0f : denom;
  }
}

void launch_combine(const CombineParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.v_dim == 0) return;
  const bool vec4 = p.v_dim % 4 == 0 && reinterpret_cast<uintptr_t>(p.parts) % 16 == 0;
  const size_t smem = p.sources * sizeof(float);
  if (vec4) {
    launch_pdl(combine_kernel<4>, dim3(static_cast<unsigned>(p.rows), blocks_for(p.v_dim, 128)),
               kCombineThreads, smem, stream, p);
  } else {
    launch_pdl(combine_kernel<1>, dim3(static_cast<unsigned>(p.rows), blocks_for(p.v_dim, 32)),
               kCombineThreads, smem, stream, p);
  }
  HLM_CHECK_LAUNCH("lse_combine");
}

// --- cache write -------------------------------------------------------------------------------------------
struct CacheWriteParams {
  const void* entries;  // [T, D] BF16 or F32
  bool entries_bf16;
  const int64_t* slots;  // [T]
  bf16* cache;           // [pages·P, D]
  int64_t rows, width, capacity;
};

// One warp per row; a negative slot (another rank's token) skips the row, and so does a slot past the
// cache (the host cannot see device slots; writing there would corrupt other memory).
__global__ void cache_write_kernel(const CacheWriteParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= p.rows) return;
  const int64_t slot = p.slots[row];
  if (slot < 0 || slot >= p.capacity) return;
  bf16* dst = p.cache + slot * p.width;
  for (int64_t d = threadIdx.x & 31; d < p.width; d += 32) {
    const int64_t i = row * p.width + d;
    dst[d] = p.entries_bf16 ? static_cast<const bf16*>(p.entries)[i]
                            : __float2bfloat16_rn(static_cast<const float*>(p.entries)[i]);
  }
}

// Ops::mla_cache_write in one launch: one CTA per row; a row whose slot is outside the cache (another
// rank's token, or past the end) is skipped whole. The RMSNorm is rms_norm's (rms_inv, rms_normed), the
// rope columns are copied. It replaces the norm, the two copies of the concatenation and cache_write on the
// side stream of an MLA layer, which at decode made that branch, not the query projection beside it, the
// one the attention waited for.
struct MlaCacheWriteParams {
  const void* ckv;  // [T, L + R] BF16 or F32
  const void* w;    // [L] BF16 or F32
  const int64_t* slots;
  bf16* cache;  // [pages·P, L + R]
  int64_t rows, latent, width, capacity;
  float eps;
};

constexpr int kCacheWriteThreads = 128;

template <class XT, class WT>
__global__ void __launch_bounds__(kCacheWriteThreads) mla_cache_write_kernel(const MlaCacheWriteParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t slot = p.slots[row];
  if (slot < 0 || slot >= p.capacity) return;  // the whole CTA: one row
  const XT* x = static_cast<const XT*>(p.ckv) + row * p.width;
  const WT* w = static_cast<const WT*>(p.w);
  float sum_sq = 0.0f;
  for (int64_t d = threadIdx.x; d < p.latent; d += kCacheWriteThreads) {
    const float v = to_float(x[d]);
    sum_sq += v * v;
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float inv = rms_inv(sum_sq, p.latent, p.eps);
  bf16* dst = p.cache + slot * p.width;
  for (int64_t d = threadIdx.x; d < p.latent; d += kCacheWriteThreads) {
    dst[d] = __float2bfloat16_rn(rms_normed(to_float(x[d]), inv, to_float(w[d])));
  }
  for (int64_t d = p.latent + threadIdx.x; d < p.width; d += kCacheWriteThreads) {
    dst[d] = __float2bfloat16_rn(to_float(x[d]));
  }
}

}  // namespace

void mla_cache_write(CudaContext& ctx, const Tensor& ckv, int64_t latent, const Tensor& norm_w, float eps,
                     const Tensor& slots, Tensor& cache) {
  const char* op = "mla_cache_write";
  expect_cuda(ckv, op, "ckv", {DType::kBF16, DType::kF32}, 2, "[T, L + R]");
  expect_cuda(norm_w, op, "norm_w", {DType::kBF16, DType::kF32}, 1, "[L]");
  expect_cuda(slots, op, "slots", {DType::kI64}, 1, "[T]");
  expect_cuda(cache, op, "cache", {DType::kBF16}, 3, "[pages, P, L + R]");
  HLM_CHECK(latent >= 1 && latent <= ckv.dim(1), "mla_cache_write: latent width {} outside [1, {}] of ckv {}",
            latent, ckv.dim(1), ckv.describe());
  expect_dim(norm_w, 0, latent, op, "norm_w [L]", "the latent width");
  expect_dim(slots, 0, ckv.dim(0), op, "slots [T]", "the row count of ckv [T, L + R]");
  expect_dim(cache, 2, ckv.dim(1), op, "cache [pages, P, L + R]", "the width of ckv [T, L + R]");
  const MlaCacheWriteParams p{ckv.raw(),
                              norm_w.raw(),
                              slots.data<int64_t>(),
                              static_cast<bf16*>(cache.raw()),
                              ckv.dim(0),
                              latent,
                              ckv.dim(1),
                              cache.dim(0) * cache.dim(1),
                              eps};
  if (p.rows == 0) return;
  const auto rows = static_cast<unsigned>(p.rows);
  switch ((ckv.dtype() == DType::kBF16 ? 2 : 0) + (norm_w.dtype() == DType::kBF16 ? 1 : 0)) {
    case 3:
      launch_pdl(mla_cache_write_kernel<bf16, bf16>, rows, kCacheWriteThreads, 0, ctx.stream(), p);
      break;
    case 2:
      launch_pdl(mla_cache_write_kernel<bf16, float>, rows, kCacheWriteThreads, 0, ctx.stream(), p);
      break;
    case 1:
      launch_pdl(mla_cache_write_kernel<float, bf16>, rows, kCacheWriteThreads, 0, ctx.stream(), p);
      break;
    default:
      launch_pdl(mla_cache_write_kernel<float, float>, rows, kCacheWriteThreads, 0, ctx.stream(), p);
      break;
  }
  HLM_CHECK_LAUNCH("mla_cache_write");
}

void cache_write(CudaContext& ctx, const Tensor& entries, const Tensor& slots, Tensor& cache) {
  const char* op = "cache_write";
  expect_cuda(entries, op, "entries", {DType::kBF16, DType::kF32}, 2, "[T, D]");
  expect_cuda(slots, op, "slots", {DType::kI64}, 1, "[T]");
  expect_cuda(cache, op, "cache", {DType::kBF16}, 3, "[pages, P, D]");
  expect_dim(slots, 0, entries.dim(0), op, "slots [T]", "the row count of entries [T, D]");
  expect_dim(cache, 2, entries.dim(1), op, "cache [pages, P, D]", "the width of entries [T, D]");
  CacheWriteParams p{entries.raw(),
                     entries.dtype() == DType::kBF16,
                     slots.data<int64_t>(),
                     static_cast<bf16*>(cache.raw()),
                     entries.dim(0),
                     entries.dim(1),
                     cache.dim(0) * cache.dim(1)};
  if (p.rows == 0) return;
  constexpr int kRowsPerBlock = 8;
  launch_pdl(cache_write_kernel, blocks_for(p.rows, kRowsPerBlock), kRowsPerBlock * 32, 0, ctx.stream(), p);
  HLM_CHECK_LAUNCH("cache_write");
}

void mla_attention(CudaContext& ctx, const Tensor& q, const Tensor& cache, const Tensor& page_table,
                   const MlaBatch& seqs, const Tensor& kv_len, float scale, int64_t v_dim, Tensor& out,
                   Tensor& stats) {
  const char* op = "mla_attention";
  expect_cuda(q, op, "q", {DType::kBF16, DType::kF32}, 3, "[T, H, D]");
  expect_cuda(cache, op, "cache", {DType::kBF16}, 3, "[pages, P, D]");
  expect_cuda(page_table, op, "page_table", {DType::kI32}, 1, "[N]");
  expect_cuda(kv_len, op, "kv_len", {DType::kI32}, 1, "[T]");
  const int64_t tokens = q.dim(0), heads = q.dim(1), dim = q.dim(2);
  const int64_t num_seqs = static_cast<int64_t>(seqs.seqs.size());
  expect_dim(cache, 2, dim, op, "cache [pages, P, D]", "the query width of q [T, H, D]");
  expect_dim(kv_len, 0, tokens, op, "kv_len [T]", "the query count of q [T, H, D]");
  HLM_CHECK(v_dim >= 1 && v_dim <= dim, "mla_attention: v_dim {} must be in [1, {}] (the cache row width)",
            v_dim, dim);
  HLM_CHECK(dim % 8 == 0, "mla_attention: the row width D = {} must be a multiple of 8 (16-byte cache rows)",
            dim);
  HLM_CHECK(cache.dim(1) >= 1, "mla_attention: the cache {} has empty pages", cache.describe());
  HLM_CHECK(
      reinterpret_cast<uintptr_t>(q.raw()) % 16 == 0 && reinterpret_cast<uintptr_t>(cache.raw()) % 16 == 0,
      "mla_attention: q and the cache must start on 16-byte boundaries");
  HLM_CHECK(tokens * heads <= (int64_t{1} << 30) && cache.dim(0) * cache.dim(1) <= INT32_MAX &&
                page_table.dim(0) <= INT32_MAX,
            "mla_attention: {} query rows of {} heads or a cache of {} slots exceed the 32-bit indexing",
            tokens, heads, cache.dim(0) * cache.dim(1));
  const bool small = dim <= MlaSmall::kD && v_dim <= MlaSmall::kV;
  HLM_CHECK(small || (dim <= MlaLarge::kD && v_dim <= MlaLarge::kV),
            "mla_attention: D = {}, v_dim = {} is not supported (D <= {} and v_dim <= {}, or D <= {} and "
            "v_dim <= {})",
            dim, v_dim, MlaSmall::kD, MlaSmall::kV, MlaLarge::kD, MlaLarge::kV);
  for (int64_t i = 0; i < num_seqs; ++i) {
    const MlaSeq& s = seqs.seqs[i];
    HLM_CHECK(s.token_begin >= 0 && s.token_count >= 0 && s.token_begin + s.token_count <= tokens,
              "mla_attention: sequence {} covers query rows [{}, {}), outside the {} rows of q", i,
              s.token_begin, s.token_begin + s.token_count, tokens);
    HLM_CHECK(s.page_begin >= 0 && s.num_pages >= 0 && s.page_begin + s.num_pages <= page_table.dim(0),
              "mla_attention: sequence {} lists page_table entries [{}, {}), outside the {} entries", i,
              s.page_begin, s.page_begin + s.num_pages, page_table.dim(0));
  }
  if (num_seqs > 0) {
    expect_cuda(seqs.table, op, "the batch table", {DType::kI32}, 2, "[S, 4]");
    expect_dim(seqs.table, 0, num_seqs, op, "the batch table [S, 4]", "the number of sequences");
    expect_dim(seqs.table, 1, 4, op, "the batch table [S, 4]",
               "token_begin, token_count, page_begin, num_pages");
  }
  prepare_output(ctx, out, {tokens, heads, v_dim}, DType::kF32, op, "out");
  prepare_output(ctx, stats, {tokens, heads, 2}, DType::kF32, op, "stats");
  if (tokens == 0) return;

  // Row-block slots: an upper bound on Σ_s ceil(count_s·H / kRows) from host shapes only (a sequence's
  // blocks cover at most ceil(H / kRows) per token, and Σ_s ceil(x_s) < Σ_s x_s + S). Whenever a token is
  // outside every sequence the bound leaves at least one spare slot to zero it. Splits fill the SMs.
  const int64_t per_token = (heads + kRows - 1) / kRows;
  const int64_t slots = std::min(tokens * per_token, num_seqs + (tokens * heads + kRows - 1) / kRows);
  const int64_t splits = std::max<int64_t>(1, ctx.sm_count() / slots);
  HLM_CHECK(slots <= INT32_MAX, "mla_attention: {} row blocks exceed the grid", slots);

  MlaParams p{};
  p.q = q.raw();
  p.cache = static_cast<const bf16*>(cache.raw());
  p.page_table = page_table.data<int32_t>();
  p.seqs = num_seqs > 0 ? seqs.table.data<int32_t>() : nullptr;
  p.kv_len = kv_len.data<int32_t>();
  p.cache_pages = cache.dim(0);
  p.tokens = static_cast<int>(tokens);
  p.heads = static_cast<int>(heads);
  p.dim = static_cast<int>(dim);
  p.v_dim = static_cast<int>(v_dim);
  p.page_size = static_cast<int>(cache.dim(1));
  p.num_seqs = static_cast<int>(num_seqs);
  p.page_table_len = static_cast<int>(page_table.dim(0));
  p.splits = static_cast<int>(splits);
  p.scale = scale;
  Tensor part_out, part_stats;  // [splits, T·H, v_dim], [splits, T·H, 2]
  if (splits > 1) {
    part_out = ctx.empty({splits, tokens * heads, v_dim}, DType::kF32);
    part_stats = ctx.empty({splits, tokens * heads, 2}, DType::kF32);
    p.out = part_out.data<float>();
    p.stats = part_stats.data<float>();
  } else {
    p.out = out.data<float>();
    p.stats = stats.data<float>();
  }
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(splits));
  const bool bf16_q = q.dtype() == DType::kBF16;
  switch ((small ? 2 : 0) + (bf16_q ? 1 : 0)) {
    case 0:
      launch_mla_attention<MlaLarge, float>(p, grid, ctx.stream());
      break;
    case 1:
      launch_mla_attention<MlaLarge, bf16>(p, grid, ctx.stream());
      break;
    case 2:
      launch_mla_attention<MlaSmall, float>(p, grid, ctx.stream());
      break;
    default:
      launch_mla_attention<MlaSmall, bf16>(p, grid, ctx.stream());
      break;
  }
  if (splits > 1) {
    launch_combine(CombineParams{p.out, p.stats, out.data<float>(), stats.data<float>(), tokens * heads,
                                 p.v_dim, p.splits},
                   ctx.stream());
  }
}

Tensor lse_combine(CudaContext& ctx, const Tensor& parts, const Tensor& stats) {
  const char* op = "lse_combine";
  expect_cuda(parts, op, "parts", {DType::kF32}, 4, "[R, T, H, V]");
  expect_cuda(stats, op, "stats", {DType::kF32}, 4, "[R, T, H, 2]");
  for (int i = 0; i < 3; ++i) {
    expect_dim(stats, i, parts.dim(i), op, "stats [R, T, H, 2]", "the same dimension of parts [R, T, H, V]");
  }
  expect_dim(stats, 3, 2, op, "stats [R, T, H, 2]", "the (max, sum) pair");
  const int64_t sources = parts.dim(0), rows = parts.dim(1) * parts.dim(2), v_dim = parts.dim(3);
  HLM_CHECK(sources <= kMaxCombineSources && v_dim <= int64_t{65535} * 32,
            "lse_combine: {} sources of width {} (at most {} sources of width {})", sources, v_dim,
            kMaxCombineSources, 65535 * 32);
  if (sources == 0) return ctx.zeros({parts.dim(1), parts.dim(2), v_dim}, DType::kF32);
  Tensor y = ctx.empty({parts.dim(1), parts.dim(2), v_dim}, DType::kF32);  // [T, H, V]
  launch_combine(CombineParams{parts.data<float>(), stats.data<float>(), y.data<float>(), nullptr, rows,
                               static_cast<int>(v_dim), static_cast<int>(sources)},
                 ctx.stream());
  return y;
}

}  // namespace hlm::cuda
