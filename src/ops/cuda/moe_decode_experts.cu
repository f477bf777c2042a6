// The routed experts of a decode step in two launches instead of four (moe_decode_experts.cuh): at batch 1
// the work list, the gate/up GEMM, the down GEMM and the combine were a chain of latency-bound launches
// that read the 8 experts' 113 MB at 69% of the copy bandwidth (docs/benchmarks.md, "The routed experts
// alone"). Here one CTA of 8 warps takes slice s (kSlice intermediate rows) of the slot-th active expert:
//  1. its warp 0 finds the expert and its pairs from idx (at most 32 pairs: __match_any_sync), so no work
//     list launch;
//  2. gate and up rows of the slice times the expert's tokens (mma.sync m16n8k16, the weights as the
//     16-row A side, up to 8 tokens as B; warps split the rows and K), then act(gate)·up rounded to bf16
//     into shared memory: h [8 tokens, kSlice];
//  3. the down projection's columns of the slice, all D rows in 16-row tiles, times h: the slice's fp32
//     partial of down·h per pair into y [S, T·k, D]. Its first weight tiles are loaded before step 2's
//     reduction, so the weight stream does not stop between the two products.
// The combine kernel sums each pair's S partials in slice order and the pairs in slot order, then adds the
// addend: a fixed order, no atomics.
#include "ops/cuda/moe_decode_experts.cuh"

#include <algorithm>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kTok = 8;     // token columns per pass (one mma n-tile)
constexpr int kChunk = 64;  // gate/up: K columns a warp loads per step (two 8-column runs per lane)
constexpr int kDepth = 2;   // gate/up: chunks each warp has in flight
// Float4 columns per combine CTA. (Measured on an H200 and dropped: 8, so that the 48B's batch-1 combine
// reads its 1.2 MB of partials with 72 CTAs instead of 18: the routed experts took 34.0-34.1 µs against
// 33.5-33.8 at batch 1, kernel_bench --moe.)
constexpr int kCombineLanes = 32;

using bf16 = __nv_bfloat16;

struct Slot {
  int expert;  // local expert, or -1 when this CTA's slot is past the active experts
  int count;   // its pairs
};

// Warp 0: the slot-th smallest local expert among the pairs, and its pairs in ascending order into
// `pairs`. Lane i holds pair i; lanes with one expert find each other with __match_any_sync, and an
// expert's rank is the number of distinct local experts below it.
__device__ Slot find_slot(const DecodeExpertsParams& p, int slot, int* pairs) {
  const int lane = threadIdx.x & 31;
  const int64_t n_pairs = p.tokens * p.top_k;
  int e = -1;
  if (lane < n_pairs) {
    const int64_t local = static_cast<int64_t>(p.idx[lane]) - p.expert_begin;
    if (local >= 0 && local < p.local) e = static_cast<int>(local);
  }
  const unsigned below = (1u << lane) - 1;
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const bool first = e >= 0 && (peers & below) == 0;
  int rank = 0;
  for (int j = 0; j < 32; ++j) {
    const int ej = __shfl_sync(0xffffffffu, e, j);
    const bool fj = __shfl_sync(0xffffffffu, first, j);
    rank += fj && ej < e;
  }
  const unsigned hit = __ballot_sync(0xffffffffu, first && rank == slot);
  if (hit == 0) return {-1, 0};
  const int leader = __ffs(hit) - 1;
  const unsigned mine = __shfl_sync(0xffffffffu, peers, leader);
  if ((mine >> lane) & 1u) pairs[__popc(mine & below)] = lane;
  return {__shfl_sync(0xffffffffu, e, leader), __popc(mine)};
}

// Grid (I / kSlice, max_active), 8 warps. Step 2: warp w takes row tile w % kRowTiles of the slice (gate
// and up) and the K chunks w / kRowTiles, + kParts, ...; its partials meet the other parts' in shared
// memory. Step 3: warp w takes the 16-row tiles w, w + 8, ... of down, kTileDepth of them loaded at once;
// lane t reads kRuns 8-column runs of each row's kSlice columns, and h's matching runs once per pass.
template <int kSlice>
__global__ void __launch_bounds__(kWarps * 32, 2) decode_experts_kernel(DecodeExpertsParams p) {
  constexpr int kRowTiles = kSlice / 16;
  constexpr int kParts = kWarps / kRowTiles;
  constexpr int kRuns = kSlice / 32;
  constexpr int kTileDepth = 8 / kRuns;
  static_assert(kParts * kRowTiles == kWarps && kRuns >= 1, "slice of 32 or 64 rows");
  __shared__ float partial[kParts][2][kRowTiles][4][32];
  __shared__ __align__(16) bf16 h[kTok][kSlice];  // [token column, slice row]
  __shared__ int pairs[32];
  __shared__ Slot slot;

  pdl_wait();
  pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if (warp == 0) {
    const Slot s = find_slot(p, blockIdx.y, pairs);
    if (lane == 0) slot = s;
  }
  __syncthreads();
  const Slot mine = slot;
  if (mine.expert < 0) return;

  const int64_t D = p.hidden, I = p.inter;
  const int64_t expert = mine.expert;
  const int64_t slice_row0 = static_cast<int64_t>(blockIdx.x) * kSlice;
  const int rt = warp % kRowTiles, part = warp / kRowTiles;
  const bf16* gate = static_cast<const bf16*>(p.gate) + (expert * I + slice_row0 + rt * 16 + g) * D;
  const bf16* up = static_cast<const bf16*>(p.up) + (expert * I + slice_row0 + rt * 16 + g) * D;
  // Row d of down's slice columns, lane t's first run.
  const bf16* down = static_cast<const bf16*>(p.down) + expert * D * I + slice_row0 + 8 * t;
  const int64_t chunks = (D + kChunk - 1) / kChunk;
  const int64_t row_tiles = D / 16;
  const int64_t n_pairs = p.tokens * p.top_k;
  float* y_slice = p.y + static_cast<int64_t>(blockIdx.x) * n_pairs * D;

  for (int base = 0; base < mine.count; base += kTok) {
    const int n = min(mine.count - base, kTok);
    // The token row this lane feeds as B column g (none past the count).
    const bf16* xrow = g < n ? static_cast<const bf16*>(p.x) + (pairs[base + g] / p.top_k) * D : nullptr;

    // Step 2: gate and up rows rt·16 + g, + 8 of the slice, over this warp's K chunks.
    float acc[2][4] = {};
    for (int64_t c0 = part; c0 < chunks; c0 += kParts * kDepth) {
      uint4 a[kDepth][2][2][2];  // [chunk][gate, up][row g, g + 8][run]
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t col = (c0 + d * kParts) * kChunk + r * 32 + t * 8;
          const bool inside = col < D;
#pragma unroll
          for (int h8 = 0; h8 < 2; ++h8) {
            a[d][0][h8][r] = inside ? load_streaming(gate + h8 * 8 * D + col) : make_uint4(0, 0, 0, 0);
            a[d][1][h8][r] = inside ? load_streaming(up + h8 * 8 * D + col) : make_uint4(0, 0, 0, 0);
          }
        }
      }
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t col = (c0 + d * kParts) * kChunk + r * 32 + t * 8;
          uint4 b = make_uint4(0, 0, 0, 0);
          if (xrow != nullptr && col < D) b = __ldg(reinterpret_cast<const uint4*>(xrow + col));
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const uint4 &lo = a[d][m][0][r], &hi = a[d][m][1][r];
            mma_bf16(acc[m], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
            mma_bf16(acc[m], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
          }
        }
      }
    }

    // Step 3's first tiles go out now: they do not depend on h.
    uint4 w[kTileDepth][2][kRuns];  // [tile][row g, g + 8][run]
    auto load_tiles = [&](int64_t tile0) {
#pragma unroll
      for (int d = 0; d < kTileDepth; ++d) {
        const int64_t tile = tile0 + d * kWarps;
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
#pragma unroll
          for (int r = 0; r < kRuns; ++r) {
            w[d][h8][r] = tile < row_tiles ? load_streaming(down + (tile * 16 + h8 * 8 + g) * I + r * 32)
                                           : make_uint4(0, 0, 0, 0);
          }
        }
      }
    };
    load_tiles(warp);

#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[part][m][rt][i][lane] = acc[m][i];
    }
    __syncthreads();
    // h: C element i of row tile `tile` in lane l is row tile·16 + l/4 (+ 8 for i >= 2), column 2·(l%4)
    // + i%2; the parts are summed in order.
    for (int item = threadIdx.x; item < kRowTiles * 4 * 32; item += kWarps * 32) {
      const int l = item & 31, i = (item >> 5) & 3, tile = item >> 7;
      const int row = tile * 16 + (l >> 2) + (i & 2 ? 8 : 0), col = 2 * (l & 3) + (i & 1);
      float v[2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        v[m] = partial[0][m][tile][i][l];
#pragma unroll
        for (int q = 1; q < kParts; ++q) v[m] += partial[q][m][tile][i][l];
      }
      h[col][row] = __float2bfloat16_rn(
          col < n ? glu_value(v[0], v[1], p.situ, p.situ_beta, p.situ_linear_beta) : 0.0f);
    }
    __syncthreads();
    uint4 hb[kRuns];  // B: token g's h at this lane's runs
#pragma unroll
    for (int r = 0; r < kRuns; ++r) hb[r] = *reinterpret_cast<const uint4*>(&h[g][r * 32 + t * 8]);

    // Step 3: y[s, pair, d] = Σ over the slice's columns of down[d, ·] · h[pair, ·].
    int pair_lo = -1, pair_hi = -1;  // the pairs of C columns 2t and 2t + 1
    if (2 * t < n) pair_lo = pairs[base + 2 * t];
    if (2 * t + 1 < n) pair_hi = pairs[base + 2 * t + 1];
    for (int64_t tile0 = warp;;) {
#pragma unroll
      for (int d = 0; d < kTileDepth; ++d) {
        const int64_t tile = tile0 + d * kWarps;
        if (tile >= row_tiles) break;
        float c[4] = {};
#pragma unroll
        for (int r = 0; r < kRuns; ++r) {
          const uint4 &lo = w[d][0][r], &hi = w[d][1][r];
          mma_bf16(c, lo.x, hi.x, lo.y, hi.y, hb[r].x, hb[r].y);
          mma_bf16(c, lo.z, hi.z, lo.w, hi.w, hb[r].z, hb[r].w);
        }
        const int64_t row = tile * 16 + g;
        if (pair_lo >= 0) {
          y_slice[pair_lo * D + row] = c[0];
          y_slice[pair_lo * D + row + 8] = c[2];
        }
        if (pair_hi >= 0) {
          y_slice[pair_hi * D + row] = c[1];
          y_slice[pair_hi * D + row + 8] = c[3];
        }
      }
      tile0 += kTileDepth * kWarps;
      if (tile0 >= row_tiles) break;
      load_tiles(tile0);
    }
    __syncthreads();  // the next pass rewrites partial and h
  }
}

// Grid (T, ceil(D / 4 / 32)), block (32, k): thread (lane, j) sums slot j's S partials of one float4 in
// slice order and scales it by the slot's weight; then the slot-0 threads add the slots in order and the
// addend. Routing and addend are read before pdl_wait(): the router wrote them two launches back (pdl.cuh),
// and the shared experts that made the addend were joined before the expert kernel.
// Measured on an H200 and dropped (2026-12-04): this kernel also taking the residual step after the MoE
// layer (h += the sum, then the next layer's RMSNorm, add_rms_norm's launch saved): a token's row over a
// cluster of 16 CTAs (36 float4 columns each) or 8, the sum of squares added across the cluster through
// distributed shared memory. The 48B's batch-1 step (4K) was unchanged within its noise (2.483-2.533 ms
// against 2.489-2.543 over three calls; 128K, 1M, batch 2 and 4 within 1.6% either way): the fused
// kernel ended 6.3-9.1 µs after the expert kernel, where combine and norm had ended 5.8-7.1 µs after it
// (bench --kernel-trace: its share 164-165 µs per step against 68 + 90 for the two), and with its
// dependents triggered only after the cluster's sum, 116 µs, but the KDA projection after it 40 µs more.
struct CombineSlicesParams {
  DecodeExpertsParams e;
  int64_t slices;  // S
};

__global__ void __launch_bounds__(kCombineLanes* kDecodeExpertsMaxTopK)
    decode_experts_combine_kernel(CombineSlicesParams cp) {
  const DecodeExpertsParams& p = cp.e;
  __shared__ float4 part[kDecodeExpertsMaxTopK][kCombineLanes];
  const int lane = threadIdx.x, j = threadIdx.y;
  const int64_t tok = blockIdx.x, D = p.hidden;
  const int64_t d4 = static_cast<int64_t>(blockIdx.y) * kCombineLanes + lane;
  const bool inside = d4 * 4 < D;
  const int64_t pair = tok * p.top_k + j, n_pairs = p.tokens * p.top_k;
  const int64_t e = static_cast<int64_t>(p.idx[pair]) - p.expert_begin;
  const bool here = e >= 0 && e < p.local;
  const float weight = here ? p.weights[pair] : 0.0f;
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (j == 0 && p.addend != nullptr && inside) a = load_addend4(p.addend, p.addend_bf16, tok, D, d4);
  pdl_wait();
  pdl_trigger();
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (here && inside) {
    const float4* y = reinterpret_cast<const float4*>(p.y + pair * D) + d4;
    const int64_t stride = n_pairs * D / 4;
    // All of a 48B expert's 16 slices in flight at once: 34.7 µs for the routed experts at batch 1
    // against 35.1 with 8 at a time (kernel_bench --moe on an H200).
#pragma unroll 16
    for (int64_t s = 0; s < cp.slices; ++s) {
      const float4 q = y[s * stride];
      v.x += q.x, v.y += q.y, v.z += q.z, v.w += q.w;
    }
  }
  part[j][lane] = make_float4(weight * v.x, weight * v.y, weight * v.z, weight * v.w);
  __syncthreads();
  if (j != 0 || !inside) return;
  float4 acc = part[0][lane];
  for (int q = 1; q < p.top_k; ++q) {
    const float4 u = part[q][lane];
    acc.x += u.x, acc.y += u.y, acc.z += u.z, acc.w += u.w;
  }
  acc.x += a.x, acc.y += a.y, acc.z += a.z, acc.w += a.w;
  reinterpret_cast<float4*>(p.out + tok * D)[d4] = acc;
}

}  // namespace

bool decode_experts_fit(int64_t tokens, int64_t top_k, int64_t hidden, int64_t inter) {
  return tokens * top_k <= kDecodeExpertsMaxPairs && top_k <= kDecodeExpertsMaxTopK && inter % 32 == 0 &&
         hidden % 16 == 0;
}

// 64-row slices where they fit: the 48B's batch-1 step is then 128 CTAs, one per SM. Measured on an H200
// (kernel_bench --moe, routed experts at batch 1, each against this kernel in the same call): 32-row slices
// (256 CTAs, two per SM, twice the partials) 40.3 against 35.5 µs; three gate/up chunks and six down tiles
// in flight per warp (168 registers, one CTA per SM) 35.9 against 35.5; 16 warps per CTA (K split four
// ways, one CTA per SM) 36.1 against 34.6. More loads in flight do not make it faster.
int64_t decode_experts_slice(int64_t inter) { return inter % 64 == 0 ? 64 : 32; }

void launch_decode_experts(const DecodeExpertsParams& p, cudaStream_t stream) {
  const int64_t slice = decode_experts_slice(p.inter), slices = p.inter / slice;
  const int64_t max_active = std::min<int64_t>(p.local, p.tokens * p.top_k);
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(max_active));
  if (slice == 64) {
    launch_pdl(decode_experts_kernel<64>, grid, kWarps * 32, 0, stream, p);
  } else {
    launch_pdl(decode_experts_kernel<32>, grid, kWarps * 32, 0, stream, p);
  }
  HLM_CHECK_LAUNCH("decode_experts_kernel");
  const dim3 cgrid(static_cast<unsigned>(p.tokens),
                   static_cast<unsigned>((p.hidden / 4 + kCombineLanes - 1) / kCombineLanes));
  launch_pdl(decode_experts_combine_kernel, cgrid, dim3(kCombineLanes, static_cast<unsigned>(p.top_k)), 0,
             stream, CombineSlicesParams{p, slices});
  HLM_CHECK_LAUNCH("decode_experts_combine_kernel");
}

}  // namespace hlm::cuda
