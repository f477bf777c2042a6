// MLA attention over the paged latent cache on Hopper tensor cores (wgmma), for decode and prefill: a CTA
// owns a block of query rows (a row is one (token, head) pair; the rows of a block belong to one sequence:
// 32 heads of one token, or 4 tokens of 8 heads) and one split of that block's keys, and returns O / Σ with
// the (max, sum) statistics that lse_combine and the split combine merge exactly. Each warpgroup of the CTA
// takes 32 of the block's rows; a block of 64 rows (two warpgroups) is for sequences with more than 32 rows
// (K3's 96 heads, prefill chunks), whose key tiles are then loaded once for twice the rows: the keys are
// the bytes this op moves, and with 32-row blocks K3's three blocks per token read every key three times.
//
// The products run transposed, so that the 64 keys of a tile are wgmma's M and the block's 32 rows its N:
// Sᵀ[64 keys, 32 rows] = K·Qᵀ (K the cache tile, K-major; Q K-major), then Oᵀ[V, 32] += Vᵀ·Pᵀ with Vᵀ the
// same cache tile read MN-major (its first V columns) and P[32 rows, 64 keys] bf16 in shared memory. A
// decode token of 32 heads thus wastes no MMA rows (the untransposed form pads 32 rows to wgmma's 64), and
// the cache tile is loaded once for both products. The per-row softmax runs over Sᵀ's M, which spans the
// four warps; their maxima meet in shared memory only when a row's softmax reference must move (below), and
// a thread's Sᵀ columns are the same rows as its Oᵀ columns, so the rescale of O needs nothing from others.
//
// Per tile (64 keys): the cp.async ring of two tiles, shared by the warpgroups (each thread copies its
// 16-byte chunks into the swizzled layout, zero-filled past the split's keys and past D, so every value the
// MMAs read is finite), 36 wgmma k-steps for Sᵀ (Kimi: D = 576), the softmax, 32 wgmma for Oᵀ (8 m64 tiles of
// V x 4 k-steps), then the freed buffer takes the tile two ahead. Two warpgroups take turns at the tensor
// cores (turn_wait / turn_pass), so that one group's softmax overlaps the other's product: K3's 96 heads
// over 64K keys took 374-375 µs at batch 8 against 385-389 with both groups issuing at once, 63.5 against
// 65.0-65.2 at batch 1 (kernel_bench --mla on an H200). (Measured there and dropped: Oᵀ's products in
// key-step order, its eight accumulators in turn, and Sᵀ over two accumulators of alternate k-steps, so
// that no product waits on the one before: 32 heads unchanged, 96 heads at batch 8 389-393 and 397 µs
// against 390-391; the chains of accumulations are not what the tiles wait on.) The keys of a row block are
// split across CTAs from host shapes (enough CTAs to fill the GPU); each split takes its share of the block's
// key tiles from the device kv_len, so a CUDA graph replayed with other lengths stays exact (mla.cu has the
// split choice and the combine). The mma.sync kernel this replaced took 50.8 µs for 64K keys of one token of
// 32 heads (35% of the copy bandwidth) and was bound by instruction issue: ldmatrix, the MMAs and a
// shared-memory round trip of S per tile (docs/benchmarks.md, MLA decode).
#include <climits>
#include <cmath>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mla_blocks.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/wgmma.cuh"

namespace hlm::cuda {

namespace {

constexpr int kGroupWarps = 4;  // a warpgroup: kMlaRows rows of the block
constexpr int kGroupThreads = kGroupWarps * 32;
constexpr int kKeys = 64;  // keys per tile: the M of Sᵀ
constexpr int kStages = 2;
constexpr float kLog2e = 1.4426950408889634f;

// kD: the cache row / query width D rounded up to whole 64-column swizzle blocks (zero-filled past D); kV:
// the value width rounded up to whole m64 tiles of Oᵀ (columns past v_dim computed and dropped).
template <int D_, int V_>
struct MlaShape {
  static constexpr int kD = D_;
  static constexpr int kV = V_;
  static constexpr int kBlocks = kD / 64;  // swizzle blocks of a K tile and of Q
  static constexpr int kVTiles = kV / 64;  // m64 tiles of Oᵀ
  static_assert(kD % 64 == 0 && kV % 64 == 0 && kV <= kD, "MLA tile shape");
  static constexpr uint32_t kTileBytes = kKeys * kD * 2;
  static_assert(kTileBytes % 1024 == 0 && (kMlaRows * kD * 2) % 1024 == 0, "swizzle blocks stay aligned");
};

// Dynamic shared memory of a CTA of kGroups warpgroups (kRows = 32·kGroups block rows), each part on a
// 1024-byte boundary: K tiles [kStages][kBlocks][kKeys][128 B], Q [kBlocks][kRows][128 B], P [kRows][128 B];
// plus slack to align the base. Two warpgroups at D = 576: 225 KB, inside the 227 KB a CTA may have.
template <class Shape, int kGroups>
struct MlaSmem {
  static constexpr int kRows = kMlaRows * kGroups;
  static constexpr uint32_t kQOffset = kStages * Shape::kTileBytes;
  static constexpr uint32_t kPOffset = kQOffset + kRows * Shape::kD * 2;
  static constexpr size_t kBytes = kPOffset + kRows * kKeys * 2 + 1024;
};
using MlaWide = MlaShape<576, 512>;    // Kimi Linear / K3: D = 512 + 64, v = 512
using MlaNarrow = MlaShape<128, 128>;  // the fixtures and anything up to 128 wide

// Eight consecutive query elements as bf16 (16 bytes).
__device__ __forceinline__ uint4 load8_bf16(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint4 load8_bf16(const float* p) {
  return f32x8_to_bf16(reinterpret_cast<const uint4*>(p)[0], reinterpret_cast<const uint4*>(p)[1]);
}

// A barrier of warpgroup `group` alone (named barrier 1 + group, its 128 threads), so that the groups of a
// CTA wait only for each other at the tile ring: one group's softmax then overlaps the other's products.
// With one group, the CTA's barrier.
template <int kGroups>
__device__ __forceinline__ void group_sync(int group) {
  if constexpr (kGroups == 1) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "n"(kGroupThreads) : "memory");
  }
}
// The same barrier, returning whether `pred` holds in any thread of the group.
template <int kGroups>
__device__ __forceinline__ bool group_sync_or(int group, bool pred) {
  if constexpr (kGroups == 1) {
    return __syncthreads_or(pred);
  } else {
    uint32_t any;
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n barrier.red.or.pred p, %2, %3, p;\n selp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(any)
        : "r"(static_cast<uint32_t>(pred)), "r"(1 + group), "n"(kGroupThreads)
        : "memory");
    return any != 0;
  }
}

// The two warpgroups' turns at the tensor cores (FA3's ping-pong): before issuing a product a group waits
// at its own barrier (3 + group, both groups' 256 threads), and once it has issued it lets the other group
// go, so the products of a tile go S0, S1, PV0, PV1 and each group's softmax runs while the other group's
// product does. Group 1 lets group 0 go first (turn_pass before the loop); group 0 takes the one arrival
// left over after the loop (turn_wait), so no barrier is left half-arrived.
__device__ __forceinline__ void turn_wait(int group) {
  asm volatile("bar.sync %0, %1;" ::"r"(3 + group), "n"(2 * kGroupThreads) : "memory");
}
__device__ __forceinline__ void turn_pass(int group) {
  asm volatile("bar.arrive %0, %1;" ::"r"(3 + (group ^ 1)), "n"(2 * kGroupThreads) : "memory");
}

// Grid (row-block slots, splits), kGroups warpgroups, MlaSmem's bytes of dynamic shared memory, one CTA per
// SM. Warpgroup wg takes the block's rows [32·wg, 32·wg + 32); its thread (warp w of the group, lane 4g + t)
// holds Sᵀ and Oᵀ entries of keys / value columns 16w + g (+8) and of the group's rows 8j + 2t (+1), j < 4:
// its 8 rows, whose softmax state it keeps. A warpgroup whose rows are all past the block's (the last block
// of a 96-head token) copies its share of the tiles and skips the products.
template <class Shape, class TQ, int kGroups>
__global__ void __launch_bounds__(kGroups* kGroupThreads, 1) mla_attention_kernel(const MlaParams p) {
  using Smem = MlaSmem<Shape, kGroups>;
  constexpr int kBlocks = Shape::kBlocks, kVTiles = Shape::kVTiles, kRows = Smem::kRows;
  constexpr int kThreads = kGroups * kGroupThreads, kWarps = kGroups * kGroupWarps;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  unsigned char* k_tiles = smem;                   // [kStages][kBlocks][kKeys][128 B]
  unsigned char* q_tile = smem + Smem::kQOffset;   // [kBlocks][kRows][128 B]
  unsigned char* p_tile = smem + Smem::kPOffset;   // [kRows][128 B]: P[row][key], bf16
  __shared__ int row_kv[kRows];                    // visible keys of each row (0 past the block's rows)
  __shared__ float warp_max_of[kWarps][kMlaRows];  // each warp's max of its group's rows (rebase, epilogue)
  __shared__ BlockOf block;
  __shared__ int kv_max;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The warpgroup and the warp inside it (constants with one group, which keeps its address arithmetic).
  const int group = kGroups == 1 ? 0 : warp / kGroupWarps, gw = kGroups == 1 ? warp : warp % kGroupWarps;
  const int g = lane >> 2, t2 = 2 * (lane & 3);
  if (warp == 0) {
    const BlockOf b = find_block(p, blockIdx.x, lane);
    if (lane == 0) block = b;
  }
  __syncthreads();
  if (block.seq < 0) {
    pdl_wait();
    pdl_trigger();
    zero_uncovered_rows<kWarps>(p, blockIdx.x - block.total, gridDim.x - block.total, warp, lane);
    return;
  }
  const SeqView seq = read_seq(p, block.seq);
  const int row_begin = seq.token_begin * p.heads + block.local * kRows;  // first flat row t·H + h
  const int num_rows = min(kRows, (seq.token_begin + seq.token_count) * p.heads - row_begin);
  const int group_row0 = group * kMlaRows;                    // the group's first row in the block
  const bool active = kGroups == 1 || group_row0 < num_rows;  // a CTA of one group has rows (block.seq >= 0)
  // Keys its pages hold (capped so that key indices rounded up to whole tiles stay in 32 bits).
  const int64_t seq_keys64 = static_cast<int64_t>(seq.num_pages) * p.page_size;
  const int seq_keys = static_cast<int>(seq_keys64 < INT32_MAX - kKeys ? seq_keys64 : INT32_MAX - kKeys);
  if (warp == 0) {
    int kv_top = 0;
#pragma unroll
    for (int r = lane; r < kRows; r += 32) {
      int kv = 0;
      if (r < num_rows) kv = max(0, min(p.kv_len[(row_begin + r) / p.heads], seq_keys));
      row_kv[r] = kv;
      kv_top = max(kv_top, kv);
    }
    kv_top = __reduce_max_sync(0xffffffffu, kv_top);
    if (lane == 0) kv_max = kv_top;
  }
  __syncthreads();

  // This split's key tiles: an even share of the tiles covering the block's longest kv_len.
  const int64_t tiles = (kv_max + kKeys - 1) / kKeys;
  const int tile_begin = static_cast<int>(tiles * blockIdx.y / p.splits);
  const int tile_end = static_cast<int>(tiles * (blockIdx.y + 1) / p.splits);
  const int key_end = min(kv_max, tile_end * kKeys);

  // Tile copy: thread tid copies 16-byte chunk tid % 8 of the 128-byte block rows of keys tid / 8 +
  // kCopyStride·i, i < kCopyKeys, in every swizzle block, so a warp's copy instruction moves four whole
  // 128-byte rows. The page ids of a tile are read one iteration before its copy is issued, so their latency
  // is hidden.
  constexpr int kCopyStride = kThreads / 8, kCopyKeys = kKeys / kCopyStride;
  static_assert(kKeys % kCopyStride == 0, "tile copy mapping");
  const int copy_chunk = tid & 7, copy_key = tid >> 3;
  const unsigned copy_dst = smem_addr(k_tiles) + sw128_offset(copy_key, copy_chunk * 8, kKeys);
  auto fetch_pages = [&](int tile, int(&page)[kCopyKeys]) {
#pragma unroll
    for (int i = 0; i < kCopyKeys; ++i) {
      const int key = tile * kKeys + copy_key + kCopyStride * i;
      const int slot = p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
      page[i] = key < key_end ? p.page_table[seq.page_begin + slot] : -1;
    }
  };
  auto load_tile = [&](int tile, int buf, const int(&page)[kCopyKeys]) {
#pragma unroll
    for (int i = 0; i < kCopyKeys; ++i) {
      const int key = tile * kKeys + copy_key + kCopyStride * i;
      const int in_page = p.page_shift >= 0 ? key & (p.page_size - 1) : key % p.page_size;
      const bool valid = page[i] >= 0 && page[i] < p.cache_pages;
      const bf16* src = p.cache +
                        (valid ? (static_cast<int64_t>(page[i]) * p.page_size + in_page) * p.dim : 0) +
                        copy_chunk * 8;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        const bool chunk = valid && b * 64 + copy_chunk * 8 < p.dim;
        cp_async16(copy_dst + buf * Shape::kTileBytes + b * kKeys * 128 + i * kCopyStride * 128,
                   chunk ? src + b * 64 : p.cache, chunk);
      }
    }
  };
  // The first kStages tiles go in flight before Q is read, one commit group per tile (empty past the
  // split's end, so that every thread waits on the same group count below). Those wholly below the keys
  // this step may write go out before pdl_wait(), overlapping the kernels ahead (the cache write and the
  // query absorption): the batch table, kv_len and the page table are written by the host before the step,
  // and the step's new rows (mla_cache_write) sit at or past the local keys its first token sees less its
  // own, kv_len[token_begin] - 1. (Measured on an H200 and dropped: the older keys of a tile that holds new
  // rows loaded before the wait too, the rest after it in the same commit group, so that at 4K keys the
  // split holding the newest key does not load its whole tile after the wait: kernel_bench --mla at 64K
  // keys 33.0 against 32.3 µs at batch 1, 152.9 against 150.0 at batch 8, and in the 48B step at 4K, batch
  // 1, the attention ending 11.4 µs after the query absorption against 9.8, --kernel-trace.)
  const int old_keys = max(0, min(p.kv_len[seq.token_begin], seq_keys) - 1);
  int pages[kCopyKeys];
  int early = 0;  // stages issued before the wait
  while (early < kStages && tile_begin + early < tile_end && (tile_begin + early + 1) * kKeys <= old_keys) {
    fetch_pages(tile_begin + early, pages);
    load_tile(tile_begin + early, early, pages);
    cp_async_commit();
    ++early;
  }
  pdl_wait();
  pdl_trigger();
  for (int s = early; s < kStages; ++s) {
    if (tile_begin + s < tile_end) {
      fetch_pages(tile_begin + s, pages);
      load_tile(tile_begin + s, s, pages);
    }
    cp_async_commit();
  }

  // Q of the block as bf16 in the swizzled layout, zero past D and past the block's rows: every load issued
  // before any store.
  {
    constexpr int kChunks = kRows * kBlocks * 8 / kThreads;  // 16-byte chunks per thread
    static_assert(kRows * kBlocks * 8 % kThreads == 0, "Q copy mapping");
    const TQ* q = static_cast<const TQ*>(p.q);
    uint4 chunk[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = tid + j * kThreads, r = (c >> 3) % kRows, col = (c / (8 * kRows)) * 64 + (c & 7) * 8;
      chunk[j] = make_uint4(0, 0, 0, 0);
      if (r < num_rows && col < p.dim)
        chunk[j] = load8_bf16(q + static_cast<int64_t>(row_begin + r) * p.dim + col);
    }
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = tid + j * kThreads, r = (c >> 3) % kRows, col = (c / (8 * kRows)) * 64 + (c & 7) * 8;
      *reinterpret_cast<uint4*>(q_tile + sw128_offset(r, col, kRows)) = chunk[j];
    }
    fence_proxy_async();
  }

  // This thread's rows are group_row0 + 8j + t2 + v, j < 4, v < 2 (index c = 2j + v). Softmax state per row:
  // the running max of its raw scores over this thread's keys (m_own; the row's max is reduced once, at the
  // end), the reference ref (log2 units of the scaled scores) that P and O are relative to, the raw score
  // above which a rebase is due (limit), and this thread's part of the sum. The reference is moved only when
  // a score passes it by more than 2^kRebase, so P <= 2^kRebase and O is rescaled in a few early tiles
  // instead of every tile; the result is the same (O / sum does not depend on the reference, and the sum is
  // brought to the true max at the end).
  constexpr float kRebase = 8.0f;
  const float scale_log2 = p.scale * kLog2e;
  int kv_of[8];
  float m_own[8], ref[8], limit[8], l_part[8];
  int kv_min = INT_MAX;  // the fewest visible keys of the group's rows: tiles below it need no mask
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const int row = group_row0 + (c >> 1) * 8 + t2 + (c & 1);
    kv_of[c] = row_kv[row];
    m_own[c] = ref[c] = limit[c] = -INFINITY;
    l_part[c] = 0.0f;
  }
  for (int r = group_row0; r < min(num_rows, group_row0 + kMlaRows); ++r) kv_min = min(kv_min, row_kv[r]);
  float o[kVTiles][16];  // Oᵀ, one m64 tile of value columns each
#pragma unroll
  for (int v = 0; v < kVTiles; ++v) {
#pragma unroll
    for (int e = 0; e < 16; ++e) o[v][e] = 0.0f;
  }
  // The group's rows of Q and P (8-row swizzle atoms, so a 32-row offset keeps the layout).
  const uint64_t q_desc = sw128_desc(q_tile + group_row0 * 128),
                 p_desc = sw128_desc(p_tile + group_row0 * 128);
  // P stores: this thread's keys 16w + g and + 8 of block row `row` (its 16-byte chunks 2w and 2w + 1).
  auto p_offset = [&](int row, int key) { return sw128_offset(row, key, kRows); };

  // Ping-pong where both groups have rows (uniform over the CTA); a group without rows (the last block of
  // a 96-head token) issues no products, so the other runs alone.
  const bool pingpong = kGroups == 2 && num_rows > kMlaRows;
  if (pingpong && group == 1) turn_pass(group);
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int i = tile - tile_begin, buf = i % kStages;
    unsigned char* kt = k_tiles + buf * Shape::kTileBytes;
    cp_async_wait<kStages - 1>();  // this thread's copies of tile i have landed
    fence_proxy_async();
    __syncthreads();  // tile i (and, the first time, Q) visible to every warp's wgmma
    if (tile + kStages < tile_end) fetch_pages(tile + kStages, pages);

    // Sᵀ = K·Qᵀ over the D columns, 16 at a time (raw scores, unscaled).
    if (active) {
      float s[16];
      const uint64_t k_desc = sw128_desc(kt);
      if (pingpong) turn_wait(group);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlocks * 4; ++kk) {
        const uint32_t a_off = (kk >> 2) * kKeys * 128 + (kk & 3) * 32;  // block kk/4, 32 bytes per k-step
        const uint32_t b_off = (kk >> 2) * kRows * 128 + (kk & 3) * 32;
        wgmma_m64n32k16<0>(s, k_desc + (a_off >> 4), q_desc + (b_off >> 4), kk > 0);
      }
      wgmma_commit();
      if (pingpong) turn_pass(group);
      wgmma_wait<0>();
      fence_operands(s);

      // Keys at or past a row's kv_len are -inf (zero-filled cache rows, or another row's longer context);
      // only the tiles that reach past the shortest row need the mask.
      const int key_lo = tile * kKeys + 16 * gw + g;  // this thread's keys: key_lo and key_lo + 8
      bool rebase = false;
      if ((tile + 1) * kKeys > kv_min) {
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const int e = (c >> 1) * 4 + (c & 1);  // s[e]: key_lo, s[e + 2]: key_lo + 8
          s[e] = key_lo < kv_of[c] ? s[e] : -INFINITY;
          s[e + 2] = key_lo + 8 < kv_of[c] ? s[e + 2] : -INFINITY;
        }
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int e = (c >> 1) * 4 + (c & 1);
        const float m = fmaxf(s[e], s[e + 2]);
        m_own[c] = fmaxf(m_own[c], m);
        rebase |= m > limit[c];
      }
      if (group_sync_or<kGroups>(group, rebase)) {
        // A new reference for every row of the group: its max so far over the block's keys (lanes, then the
        // group's warps).
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          float m = m_own[c];
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
          if (g == 0) warp_max_of[warp][(c >> 1) * 8 + t2 + (c & 1)] = m;
        }
        group_sync<kGroups>(group);
        const float(*wmax)[kMlaRows] = warp_max_of + group * kGroupWarps;
        float alpha[8];
        bool moved = false;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const int row = (c >> 1) * 8 + t2 + (c & 1);
          const float m = fmaxf(fmaxf(wmax[0][row], wmax[1][row]), fmaxf(wmax[2][row], wmax[3][row]));
          const float target = m * scale_log2;
          // A row without a visible key keeps -inf (and alpha 1: O and its sum are still 0).
          alpha[c] = target == ref[c] ? 1.0f : exp2_approx(ref[c] - target);
          moved |= target != ref[c];
          ref[c] = target;
          limit[c] = m + kRebase / scale_log2;
          l_part[c] *= alpha[c];
        }
        group_sync<kGroups>(group);  // every warp has read the maxima before a later rebase writes them again
        if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
          for (int v = 0; v < kVTiles; ++v) {
#pragma unroll
            for (int e = 0; e < 16; ++e) o[v][e] *= alpha[(e >> 2) * 2 + (e & 1)];
          }
        }
      }

      // P = 2^(scaled score - ref) as bf16 into P[row][key]; a row without a visible key (ref -inf) gets 0.
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int e = (c >> 1) * 4 + (c & 1), row = group_row0 + (c >> 1) * 8 + t2 + (c & 1);
        const float base = ref[c] == -INFINITY ? 0.0f : ref[c];
        const float p0 = exp2_approx(fmaf(s[e], scale_log2, -base));
        const float p1 = exp2_approx(fmaf(s[e + 2], scale_log2, -base));
        l_part[c] += p0 + p1;
        const int k0 = 16 * gw + g;
        *reinterpret_cast<bf16*>(p_tile + p_offset(row, k0)) = __float2bfloat16(p0);
        *reinterpret_cast<bf16*>(p_tile + p_offset(row, k0 + 8)) = __float2bfloat16(p1);
      }
      fence_proxy_async();
      group_sync<kGroups>(group);  // the group's P visible to its warps' wgmma

      // Oᵀ += Vᵀ·Pᵀ: value columns 64v.. of the tile (MN-major), keys 16 at a time.
      if (pingpong) turn_wait(group);
      wgmma_fence();
#pragma unroll
      for (int v = 0; v < kVTiles; ++v) {
#pragma unroll
        for (int ks = 0; ks < kKeys / 16; ++ks) {
          const uint32_t a_off = v * kKeys * 128 + ks * 16 * 128, b_off = ks * 32;
          wgmma_m64n32k16<1>(o[v], k_desc + (a_off >> 4), p_desc + (b_off >> 4), true);
        }
      }
      wgmma_commit();
      if (pingpong) turn_pass(group);
      wgmma_wait<0>();
#pragma unroll
      for (int v = 0; v < kVTiles; ++v) fence_operands(o[v]);
    }
    __syncthreads();  // every warp is done with tile i's buffer (and its group with P)
    if (tile + kStages < tile_end) load_tile(tile + kStages, buf, pages);
    cp_async_commit();
  }

  if (pingpong && group == 0) turn_wait(group);

  // Epilogue: each row's max and sum (lanes, then the group's warps; the sum brought from the reference to
  // the max), O / sum, and (max, sum) in natural units; a row without keys in this split gives 0 and
  // (-inf, 0). The partial sums go to P's buffer, free after the last tile's barrier.
  float(*warp_sum)[kMlaRows] = reinterpret_cast<float(*)[kMlaRows]>(p_tile);
  static_assert(kWarps * kMlaRows * sizeof(float) <= kRows * kKeys * 2, "the sums fit P's buffer");
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const int row = (c >> 1) * 8 + t2 + (c & 1);
    float m = m_own[c], l = l_part[c];
#pragma unroll
    for (int o8 = 4; o8 < 32; o8 <<= 1) {
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o8));
      l += __shfl_xor_sync(0xffffffffu, l, o8);
    }
    if (g == 0) {
      warp_max_of[warp][row] = m;
      warp_sum[warp][row] = l;
    }
  }
  __syncthreads();
  if (!active) return;
  const float(*wmax)[kMlaRows] = warp_max_of + group * kGroupWarps;
  const float(*wsum)[kMlaRows] = warp_sum + group * kGroupWarps;
  float inv[8];
  bool keep[8];
  const int64_t plane = p.splits > 1 ? blockIdx.y * (static_cast<int64_t>(p.tokens) * p.heads) : 0;
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const int row = (c >> 1) * 8 + t2 + (c & 1), block_row = group_row0 + row;
    const float l = wsum[0][row] + wsum[1][row] + wsum[2][row] + wsum[3][row];
    const float m = fmaxf(fmaxf(wmax[0][row], wmax[1][row]), fmaxf(wmax[2][row], wmax[3][row]));
    inv[c] = l > 0.0f ? 1.0f / l : 0.0f;
    // A split's partial without keys has weight 0 in the merge and is never read: not written.
    keep[c] = block_row < num_rows && !(p.splits > 1 && l == 0.0f);
    if (gw == 0 && g == 0 && block_row < num_rows) {
      float* st = p.stats + (plane + row_begin + block_row) * 2;
      st[0] = m * p.scale;
      st[1] = l > 0.0f ? l * exp2_approx(ref[c] - m * scale_log2) : 0.0f;
    }
  }
#pragma unroll
  for (int v = 0; v < kVTiles; ++v) {
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int c = (e >> 2) * 2 + (e & 1), block_row = group_row0 + (c >> 1) * 8 + t2 + (c & 1);
      const int col = v * 64 + 16 * gw + g + ((e >> 1) & 1) * 8;
      if (keep[c] && col < p.v_dim) p.out[(plane + row_begin + block_row) * p.v_dim + col] = o[v][e] * inv[c];
    }
  }
}

template <class Shape, class TQ, int kGroups>
void launch_groups(const MlaParams& p, dim3 grid, cudaStream_t stream) {
  constexpr size_t kBytes = MlaSmem<Shape, kGroups>::kBytes;
  // Above 48 KB a kernel must opt in to its dynamic shared memory; once per instantiation.
  static const cudaError_t opt_in = cudaFuncSetAttribute(mla_attention_kernel<Shape, TQ, kGroups>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  HLM_CUDA_CHECK(opt_in);
  launch_pdl(mla_attention_kernel<Shape, TQ, kGroups>, grid, kGroups * kGroupThreads, kBytes, stream, p);
  HLM_CHECK_LAUNCH("mla_attention");
}

template <class Shape, class TQ>
void launch_shape(const MlaParams& p, dim3 grid, cudaStream_t stream) {
  if (p.block_rows == 2 * kMlaRows) {
    launch_groups<Shape, TQ, 2>(p, grid, stream);
  } else {
    launch_groups<Shape, TQ, 1>(p, grid, stream);
  }
}

}  // namespace

void launch_mla_attention(const MlaParams& p, dim3 grid, bool bf16_q, bool wide, cudaStream_t stream) {
  HLM_CHECK(p.dim <= (wide ? MlaWide::kD : MlaNarrow::kD) && p.v_dim <= (wide ? MlaWide::kV : MlaNarrow::kV),
            "mla_attention: D = {}, v_dim = {} exceed the kernel's {} / {}", p.dim, p.v_dim,
            wide ? MlaWide::kD : MlaNarrow::kD, wide ? MlaWide::kV : MlaNarrow::kV);
  HLM_CHECK(p.block_rows == kMlaRows || p.block_rows == 2 * kMlaRows,
            "mla_attention: row blocks of {} rows (the kernel takes {} or {})", p.block_rows, kMlaRows,
            2 * kMlaRows);
  switch ((wide ? 2 : 0) + (bf16_q ? 1 : 0)) {
    case 3:
      launch_shape<MlaWide, bf16>(p, grid, stream);
      break;
    case 2:
      launch_shape<MlaWide, float>(p, grid, stream);
      break;
    case 1:
      launch_shape<MlaNarrow, bf16>(p, grid, stream);
      break;
    default:
      launch_shape<MlaNarrow, float>(p, grid, stream);
      break;
  }
}

}  // namespace hlm::cuda
