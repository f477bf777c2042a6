// Routed experts for prefill-sized batches: the expert GEMMs as tiled tensor-core GEMMs over the
// expert-major work list (moe_work_list.cuh), for BF16 or MXFP4 weights. moe_experts.cu's weight-streaming
// kernels take at most 32 tokens per pass over an expert's rows, so an 8K-token prefill (about 256 pairs per
// expert of the 48B model) re-read every expert's weights 8 times and ran at 1.7 TB/s (58% of the
// prefill under ncu on an H200, docs/benchmarks.md); here each CTA keeps a 128-pair tile of the expert's
// token rows against a 128-row tile of its weights, so the math, not the weight stream, sets the pace.
//
// Decomposition: a one-CTA kernel numbers the tiles (the active experts' pair counts are known only on the
// device): tile g belongs to slot tile_slot[g] and covers its pairs from (g − first_tile[slot])·128. Grid
// (weight-row tiles, an upper bound of the pair tiles); a CTA past the count exits. Two warpgroups, each
// 64 pairs x 128 weight rows on Hopper's wgmma (m64n128k16, bf16 in, fp32 accumulate, both operands from
// shared memory in the 128-byte swizzle of wgmma.cuh); K in 64-column stages, a ring of three filled by
// cp.async (the pair rows gathered through a per-row source offset), two stages in flight while one is in
// the math; two CTAs per SM. Measured on an H200 (kernel_bench --moe-prefill, 48B experts, the whole
// routed-expert op): 8,192 tokens 3.07-3.08 ms (302 TFLOP/s) against 4.21 for the same tiling on mma.sync
// (8 warps of 64 x 32, ldmatrix fragments), 2,048 tokens 1.20 against 1.65-1.67. Earlier, on mma.sync:
// 64-column stages 4.14-4.17 ms in rings of 2 or 3, 32-column stages 4.48-4.52 ms in rings of 3 or 4.
// Gate/up: the 128 rows are 64 gate rows and the same 64 up rows, so a thread's accumulators hold gate
// and up of the same (pair, row) 32 registers apart, and it writes act(gate)·up as bf16 to h. Down: y rows in
// fp32. The combine (moe_experts.cu) then sums each token's slots in slot order, as for decode.
// MXFP4 weights (K3) are decoded to bf16 by the threads into the same swizzled stage layout (below), so
// the MMAs are the BF16 path's: K3's experts at 8,192 tokens and 224 local experts took 27.6 ms against 72.8
// for the streaming kernels (kernel_bench --moe-prefill, H200; 313 against 119 TFLOP/s).
#include <type_traits>

#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/moe_work_list.cuh"
#include "ops/cuda/mxfp4_decode.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/wgmma.cuh"

namespace hlm::cuda {

namespace {

constexpr int kTileM = 128;    // pairs per tile
constexpr int kTileN = 128;    // weight rows per tile (gate/up: 64 gate rows, then the same 64 up rows)
constexpr int kTileK = 64;     // columns per stage: one 128-byte swizzle block (wgmma.cuh) per row
constexpr int kStages = 3;     // ring of stages in shared memory
constexpr int kThreads = 256;  // 2 warpgroups, 64 pairs each
constexpr size_t kOperandBytes = size_t{kTileM} * kTileK * sizeof(bf16);  // 16 KB, a multiple of 1024
constexpr size_t kStageBytes = 2 * kOperandBytes;  // A (pair rows), then B (weight rows), both swizzled
constexpr size_t kSmemBytes = kStages * kStageBytes + 1024;  // 99,328 with the alignment slack: 2 CTAs per SM
constexpr int kChunksPerThread = kTileM * (kTileK / 8) / kThreads;  // 16-byte copies of A (and of B)
static_assert(kTileM == kTileN && kChunksPerThread * kThreads == kTileM * kTileK / 8, "copy mapping");
constexpr int kTableThreads = 1024;
constexpr int kSlotsPerThread = 4;  // the table kernel takes up to 4096 active experts

struct TileTable {
  int32_t* num_tiles;   // [1]
  int32_t* first_tile;  // [max_active]
  int32_t* tile_slot;   // [max_tiles]
};

int64_t max_tiles(int64_t pairs, int64_t max_active) { return (pairs + kTileM - 1) / kTileM + max_active; }
int64_t max_tiles(const TiledExpertsParams& p) { return max_tiles(p.pairs, p.max_active); }

TileTable table_view(const TiledExpertsParams& p, int32_t* t) { return {t, t + 1, t + 1 + p.max_active}; }

struct TableArgs {
  WorkList list;
  TileTable table;
};

// One CTA: each thread takes 4 consecutive slots, their tile counts ceil(count / 128) are scanned across
// the CTA, and each thread writes its slots' first tiles and the slot of each of their tiles.
__global__ void __launch_bounds__(kTableThreads) tile_table_kernel(TableArgs args) {
  pdl_wait();
  pdl_trigger();
  __shared__ int warp_sums[kTableThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int active = *args.list.num_active;
  int tiles[kSlotsPerThread], mine = 0;
#pragma unroll
  for (int q = 0; q < kSlotsPerThread; ++q) {
    const int slot = tid * kSlotsPerThread + q;
    tiles[q] = slot < active ? (args.list.active_count[slot] + kTileM - 1) / kTileM : 0;
    mine += tiles[q];
  }
  int end = mine;  // inclusive scan: within the warp, then over the warps' totals
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, end, o);
    if (lane >= o) end += v;
  }
  if (lane == 31) warp_sums[warp] = end;
  __syncthreads();
  if (warp == 0) {
    int s = warp_sums[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += v;
    }
    warp_sums[lane] = s;
  }
  __syncthreads();
  if (warp > 0) end += warp_sums[warp - 1];
  int next = end - mine;
#pragma unroll
  for (int q = 0; q < kSlotsPerThread; ++q) {
    const int slot = tid * kSlotsPerThread + q;
    if (slot >= active) break;
    args.table.first_tile[slot] = next;
    for (int i = 0; i < tiles[q]; ++i) args.table.tile_slot[next + i] = slot;
    next += tiles[q];
  }
  if (tid == kTableThreads - 1) *args.table.num_tiles = end;
}

struct GemmArgs {
  TiledExpertsParams p;
  TileTable table;
};

template <bool kGateUp, bool kMxfp4>
__global__ void __launch_bounds__(kThreads, 2) tiled_expert_gemm_kernel(GemmArgs args) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* stages = align_1024(smem_raw);
  __shared__ int64_t a_offset[kTileM];  // element offset of each pair row's source (x or h)
  __shared__ int32_t a_pair[kTileM];    // the pair of each row, -1 past the tile's pairs
  const TiledExpertsParams& p = args.p;
  pdl_wait();
  pdl_trigger();
  const int tile = blockIdx.y;
  if (tile >= *args.table.num_tiles) return;
  const int slot = args.table.tile_slot[tile];
  const int m0 = (tile - args.table.first_tile[slot]) * kTileM;
  const int64_t expert = p.list.active_expert[slot];
  const int begin = p.list.active_begin[slot];
  const int rows_here = min(kTileM, p.list.active_count[slot] - m0);
  const int64_t k_dim = kGateUp ? p.hidden : p.inter;   // K
  const int64_t w_rows = kGateUp ? p.inter : p.hidden;  // rows of each weight matrix
  const bf16* in = static_cast<const bf16*>(kGateUp ? p.x : p.h);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int i = tid; i < kTileM; i += kThreads) {
    int32_t pair = -1;
    int64_t offset = 0;
    if (i < rows_here) {
      pair = p.list.entries[begin + m0 + i];
      offset = (kGateUp ? pair / p.top_k : pair) * k_dim;
    }
    a_pair[i] = pair;
    a_offset[i] = offset;
  }
  // This tile's weight rows: gate/up rows [n0, n0 + 64) of both matrices; down rows [n0, n0 + 128). Tile
  // row r is row weight_row(r) of the expert's gate (r < 64) or up matrix, or of its down matrix.
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * (kGateUp ? kTileN / 2 : kTileN);
  const void* w_main = kGateUp ? p.gate : p.down;
  auto up_row = [&](int r) { return kGateUp && r >= kTileN / 2; };
  auto weight_row = [&](int r) { return expert * w_rows + n0 + (up_row(r) ? r - kTileN / 2 : r); };
  __syncthreads();

  // Stage s holds columns [k0, k0 + 64) of the 128 pair rows (A) and of the 128 weight rows (B), each
  // [128][64] in the 128-byte swizzle; the thread copies 16-byte parts c % 8 of rows c / 8 for
  // c = tid + 256·i. Pair rows past the tile's pairs are zero-filled.
  const unsigned stages_addr = smem_addr(stages);
  auto load_stage = [&](int stage, int64_t k0) {
    const unsigned a_sh = stages_addr + stage * kStageBytes, b_sh = a_sh + kOperandBytes;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int c = tid + i * kThreads, r = c / (kTileK / 8), part = c % (kTileK / 8);
      const int64_t col = k0 + part * 8;
      const unsigned at = sw128_offset(r, part * 8, kTileM);
      cp_async16(a_sh + at, in + a_offset[r] + col, r < rows_here);
      if constexpr (!kMxfp4) {
        const bf16* w = static_cast<const bf16*>(up_row(r) ? p.up : w_main);
        cp_async16(b_sh + at, w + weight_row(r) * k_dim + col, true);
      }
    }
  };
  // MXFP4 weights go through registers instead: the thread decodes 32 columns (one scale group) of tile row
  // b_row = tid / 2 per stage, loaded an iteration ahead of their decode (the loads of stage s + 2 go out
  // while stage s's MMAs run, their decode into stage s + 2's place in the next iteration), and stores
  // them in the swizzled layout the BF16 copies take.
  [[maybe_unused]] const int b_row = tid / 2, b_half = tid % 2;
  [[maybe_unused]] const uint8_t* codes = nullptr;  // the thread's 16 code bytes of stage 0
  [[maybe_unused]] const uint8_t* scales = nullptr;
  if constexpr (kMxfp4) {
    const int64_t row = weight_row(b_row);
    codes = static_cast<const uint8_t*>(up_row(b_row) ? p.up : w_main) + row * (k_dim / 2) + 16 * b_half;
    scales = (up_row(b_row) ? p.up_scale
              : kGateUp     ? p.gate_scale
                            : p.down_scale) +
             row * (k_dim / 32) + b_half;
  }
  struct CodeChunk {
    uint4 codes;
    uint32_t scale;
  };
  auto load_codes = [&](int64_t k0) {
    return CodeChunk{__ldg(reinterpret_cast<const uint4*>(codes + k0 / 2)), scales[k0 / 32]};
  };
  auto store_codes = [&](int stage, const CodeChunk& c) {
    unsigned char* b_sh = stages + stage * kStageBytes + kOperandBytes;
    const Mxfp4Factors f = mxfp4_factors<true>(c.scale);
    const uint32_t q[4] = {c.codes.x, c.codes.y, c.codes.z, c.codes.w};
#pragma unroll
    for (int run = 0; run < 4; ++run) {
      uint32_t w[4];
      e2m1x8_to_bf16_ordered<true>(q[run], f, w);
      *reinterpret_cast<uint4*>(b_sh + sw128_offset(b_row, 32 * b_half + 8 * run, kTileN)) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
  };

  const int k_tiles = static_cast<int>(k_dim / kTileK);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, static_cast<int64_t>(s) * kTileK);
    cp_async_commit();
  }
  [[maybe_unused]] CodeChunk pending{};  // MXFP4: the codes of stage kt + 1 during iteration kt
  if constexpr (kMxfp4) {
    store_codes(0, load_codes(0));
    if (k_tiles > 1) pending = load_codes(kTileK);
  }
  // Warpgroup wg multiplies pair rows [64·wg, 64·wg + 64) by all 128 weight rows: acc[4j + v0 + 2v1] is
  // pair row 64·wg + 16·(warp % 4) + g + 8v1, weight row 8j + 2t + v0 of the tile. A warpgroup with no pair
  // rows (an expert's last tile of at most 64 pairs) runs the loop's copies and barriers without its MMAs,
  // leaving the tensor cores to the other CTA on the SM. Measured on an H200 (kernel_bench --moe-prefill,
  // 48B experts, the whole routed-expert op): 256 to 1,024 tokens 6% faster (1,001 → 941 µs at 256), 8,192
  // tokens 1% slower (2,932-2,940 → 2,958-2,967 µs), 8K-token prefill unchanged. The MMAs must stay outside
  // any branch inside the loop: skipped by a branch around them there (and the rows below unwritten), the
  // gate/up GEMMs of an 8K-token prefill took 47.7 against 39.5 ms (ncu), where this form with the rows
  // unwritten took the baseline's time in kernel_bench. Rows past the pairs are zero-filled, not left
  // unwritten: unwritten, every size was slower (256 tokens 1,112-1,129 µs against 1,001-1,002).
  const int wg = warp >> 2;
  float acc[64] = {};
  auto main_loop = [&](auto with_mma) {
    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<kStages - 2>();
      fence_proxy_async();
      __syncthreads();  // stage kt has landed for every thread; every warpgroup is done with stage kt - 1
      const int next = kt + kStages - 1;
      if (next < k_tiles) load_stage(next % kStages, static_cast<int64_t>(next) * kTileK);
      cp_async_commit();
      if constexpr (decltype(with_mma)::value) {
        const unsigned char* a_sh = stages + (kt % kStages) * kStageBytes;
        const uint64_t a_desc = sw128_desc(a_sh + wg * 64 * 128), b_desc = sw128_desc(a_sh + kOperandBytes);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kTileK / 16; ++ks) wgmma_m64n128k16_ss(acc, a_desc + 2 * ks, b_desc + 2 * ks);
        wgmma_commit();
      }
      if constexpr (kMxfp4) {
        if (kt + 1 < k_tiles) store_codes((kt + 1) % kStages, pending);
        if (kt + 2 < k_tiles) pending = load_codes(static_cast<int64_t>(kt + 2) * kTileK);
      }
      if constexpr (decltype(with_mma)::value) wgmma_wait<0>();
    }
  };
  if (wg * 64 < rows_here) {
    main_loop(std::true_type{});
  } else {
    main_loop(std::false_type{});
  }
  fence_operands(acc);
  cp_async_wait<0>();

  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = wg * 64 + 16 * (warp & 3) + g + 8 * half;
    if (r >= rows_here) continue;
    const int64_t pair = a_pair[r];
    if constexpr (kGateUp) {
      // Weight rows 8j + 2t (j < 8) are gate rows, the same rows 64 further on their up rows.
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float* gate = &acc[4 * j + 2 * half];
        const float* up = &acc[4 * (j + 8) + 2 * half];
        const uint32_t v = pack_bf16x2(glu_value(gate[0], up[0], p.situ, p.situ_beta, p.situ_linear_beta),
                                       glu_value(gate[1], up[1], p.situ, p.situ_beta, p.situ_linear_beta));
        *reinterpret_cast<uint32_t*>(static_cast<bf16*>(p.h) + pair * p.inter + n0 + 8 * j + 2 * t) = v;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<float2*>(static_cast<float*>(p.y) + pair * p.hidden + n0 + 8 * j + 2 * t) =
            make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    }
  }
}

template <bool kGateUp>
void launch_tiled_gemm(const GemmArgs& args, cudaStream_t stream) {
  const TiledExpertsParams& p = args.p;
  auto* kernel = p.gate_scale != nullptr ? tiled_expert_gemm_kernel<kGateUp, true>
                                         : tiled_expert_gemm_kernel<kGateUp, false>;
  HLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(kSmemBytes)));
  const int64_t n_tiles = kGateUp ? p.inter / (kTileN / 2) : p.hidden / kTileN;
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(max_tiles(p)));
  launch_pdl(kernel, grid, kThreads, kSmemBytes, stream, args);
  HLM_CHECK_LAUNCH(kGateUp ? "tiled_expert_gemm_kernel (gate, up)" : "tiled_expert_gemm_kernel (down)");
}

}  // namespace

bool tiled_experts_fit(int64_t hidden, int64_t inter) {
  return hidden % kTileN == 0 && inter % (kTileN / 2) == 0 && hidden % kTileK == 0 && inter % kTileK == 0;
}

int64_t tile_table_ints(int64_t pairs, int64_t max_active) {
  return 1 + max_active + max_tiles(pairs, max_active);
}

void launch_tiled_experts(const TiledExpertsParams& p, int32_t* tile_table, cudaStream_t stream) {
  HLM_CHECK(p.max_active <= int64_t{kTableThreads} * kSlotsPerThread,
            "moe_experts: the tiled expert GEMMs take at most {} active experts, got {}",
            kTableThreads * kSlotsPerThread, p.max_active);
  HLM_CHECK(max_tiles(p) <= 65535, "moe_experts: {} pairs need more than 65535 tiles of {}", p.pairs, kTileM);
  const TileTable table = table_view(p, tile_table);
  launch_pdl(tile_table_kernel, 1, kTableThreads, 0, stream, TableArgs{p.list, table});
  HLM_CHECK_LAUNCH("tile_table_kernel");
  launch_tiled_gemm<true>(GemmArgs{p, table}, stream);
  launch_tiled_gemm<false>(GemmArgs{p, table}, stream);
}

}  // namespace hlm::cuda
