// Decode-size dense GEMMs: y [T, M] = x [T, K] · w [M, K]ᵀ for T <= 16 tokens and bf16 weights. At this
// size a GEMM only streams its weights, and cuBLASLt's tiles (sized for compute) leave most of the copy
// bandwidth unused on the small projections of a decode step (down to 0.3 TB/s on a 4.7 MB matrix on an
// H200). Here the weights are the 16-row A side of mma.sync m16n8k16 and the tokens the 8-column B side
// (mma.cuh), so every weight byte is read once whatever T is.
//
// Decomposition: CTA b takes rows [16b, 16b + 16) over the whole K; its kWarps warps split K in 64-column
// chunks (warp w: chunks w, w + kWarps, ...), each keeping kDepth chunks of loads in flight (both chosen
// per launch from the grid and the SM count: pick_streaming).
// The warps' partial sums meet in shared memory and are added in warp order (a fixed order: the result is
// the same every run). The kernel is launched with PDL (pdl.cuh): its first weight loads go out before
// pdl_wait(), overlapping the previous kernel's tail, since no kernel of a step writes weights.
// Measured on an H200 and dropped: splitting K across a thread-block cluster for the small matrices, and a
// two-buffer pipeline per warp; with either, every matrix size took longer per call and the decode step
// was slower. And (2026-12-04) a staged form that copied each CTA's whole tile into shared memory with
// cp.async before pdl_wait(), in 16- or 8-row tiles so that the whole grid was resident at once (o_proj
// as 288 CTAs of 64 KB, three per SM), meant to stream the matrix while a latency-bound kernel ahead of it
// runs: o_proj alone 8.4 -> 8.0 µs, but the shared expert's GEMMs 2.8 -> 3.0 and 4.6 -> 4.8-5.0; in the
// 48B step (--layer-split, batch 1) the KDA layer 42.3 -> 41.3 µs while the MoE layer, none of its kernels
// staged, went 54.7 -> 56.0, and the 4K batch-1 step 2.55-2.59 -> 2.57-2.62 ms (docs/benchmarks.md).
//
// Per-head GEMMs (head_matmul, MLA's W_UK absorption and W_UV at decode) go through the same kernels
// instead of a cuBLASLt strided batch, which cannot start its weight loads before the kernel ahead of it
// ends and needs an F32 activation converted by a kernel of its own first: the transposed form
// (y_h = x_h · w_hᵀ, w [H, b, a]) is this GEMM with the head as grid.y and x, y rows strided over the
// heads; the plain form (y_h = x_h · w_h, w [H, a, b], the reduction down w's rows) has its own kernel
// below, head_rows_kernel.
//
// A GLU variant saves the GLU's launch for a weight stacking gate rows [0, I) over up rows [I, 2I): CTA b
// takes gate rows [8b, 8b + 8) as A rows 0-7 and the same up rows as A rows 8-15, so each lane holds the
// gate and up sums of its (token, row) pairs and writes act(gate)·up. (Measured and dropped: a pair of
// independent GEMMs in one launch, for KDA's f_b and g_b: 3.74 µs in a graph against 3.77 µs for the two
// launches, whose weight loads already overlap through PDL.)
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/head_rows.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

constexpr int kChunkCols = 64;  // a chunk: 16 rows x 64 columns; lane (g, t) loads 2 runs of 8 per row
constexpr int kMaxTokens = 16;  // two 8-column token tiles
static_assert(kMaxTokens == kHeadMaxTokens, "head_gemv takes the skinny GEMM's token range");
// Rows from which cuBLASLt takes the GEMM: its tiles stream the large matrices faster (lm_head at 4.4 TB/s,
// KDA's fused q|k|v at 3.1 against 2.6 here). Measured on an H200 with the 48B config: cuBLASLt from
// 8,192 rows made the batch-1 step 1.4% and the batch-8 step 2.2% faster than from 65,536, and from
// 4,096 rows slower again. Measured again once KDA's decode after its input projection was one kernel
// (whose state loads could then overlap this GEMM through PDL): from 16,384 rows, that projection here,
// the KDA layer took 46.5 against 44.4 µs at batch 1 and 63.6 against 60.7 at batch 8 (--layer-split).
// And once more with the streaming chosen per launch below (that projection then on kNarrow): 42.5-42.7
// against 42.7-42.8 µs at batch 1, 59.1-59.3 against 59.2 at batch 8, the 4K steps inside their noise.
// A single token takes this kernel up to kCublasRowsOneToken rows: the KDA projection (12,576 rows) then
// triggers the fused KDA decode early, whose state and weight loads (issued before its PDL wait) overlap
// the projection; after cuBLASLt, which never triggers its dependents, they followed it. Measured on an H200
// (2026-12-04, bench --kernel-trace and three alternating runs, 4K): the KDA decode kernel's share of a
// batch-1 step 204.7 -> 137.7 µs, the projections 366.8 µs (cuBLASLt) -> about 332 here, the step
// 2.543-2.546 -> 2.490-2.497 ms; at batch 8 this kernel lost (7.400-7.407 -> 7.436-7.449 ms). In a second
// call: 4K 2.555-2.560 -> 2.502-2.551, 128K 2.884 -> 2.806, 1M 4.434 -> 4.396; batch 2 unchanged (3.407);
// K3's first 4 layers, whose stacked MLA projection and shared experts' gate|up also come here at one
// token, 2.580-2.596 -> 2.592-2.596.
constexpr int64_t kCublasRows = 8192;
constexpr int64_t kCublasRowsOneToken = 16384;

struct SkinnyGemmParams {
  const bf16* w;  // [M, K]
  const void* x;  // [T, K] BF16 or F32
  void* y;        // [T, M] BF16 or F32; GLU: [T, M/2]
  int64_t m, k;
  // The per-head form only (kBatched): row strides of x and y, and the element offsets of batch blockIdx.y.
  int64_t x_ld, y_ld;
  int64_t w_batch, x_batch, y_batch;
  int tokens;
  bool situ;  // GLU: the activation (silu or SiTU)
  float situ_beta, situ_linear_beta;
};

// Run r of chunk c for lane group t: the 8 columns at 64c + 32r + 8t.
__device__ __forceinline__ int64_t run_col(int64_t chunk, int run, int t) {
  return chunk * kChunkCols + run * 32 + t * 8;
}

// The B words of one run of a token row, as bf16 pairs in column order (zero outside K or past T).
template <class XT>
__device__ __forceinline__ void token_words(const XT* row, int64_t col, bool inside, uint32_t (&b)[4]) {
  b[0] = b[1] = b[2] = b[3] = 0;
  if (row == nullptr || !inside) return;
  if constexpr (sizeof(XT) == 2) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + col));
    b[0] = v.x, b[1] = v.y, b[2] = v.z, b[3] = v.w;
  } else {
    const uint4 v = f32x8_to_bf16(__ldg(reinterpret_cast<const uint4*>(row + col)),
                                  __ldg(reinterpret_cast<const uint4*>(row + col + 4)));
    b[0] = v.x, b[1] = v.y, b[2] = v.z, b[3] = v.w;
  }
}

// kBatched: the per-head form (grid.y batches, strided rows); the plain GEMMs compile without it, since
// the batch offsets and strides in their address arithmetic made every decode-step GEMM slower (measured
// on an H200 with bench --layer-split: 0.6 to 1.7 µs per call in the KDA and dense FFN sections).
template <int kWarps, int kDepth, int kTiles, class XT, class YT, bool kGlu, bool kBatched, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) skinny_gemm_kernel(SkinnyGemmParams p) {
  __shared__ float partial[kWarps][kTiles * 4][32];
  const int64_t tile = blockIdx.x;
  const bf16* weights = kBatched ? p.w + blockIdx.y * p.w_batch : p.w;
  const XT* x = static_cast<const XT*>(p.x) + (kBatched ? blockIdx.y * p.x_batch : 0);
  YT* y = static_cast<YT*>(p.y) + (kBatched ? blockIdx.y * p.y_batch : 0);
  const int64_t x_ld = kBatched ? p.x_ld : p.k, y_ld = kBatched ? p.y_ld : (kGlu ? p.m / 2 : p.m);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // A rows g and g + 8: 16 consecutive weight rows, or (GLU) gate row 8·tile + g and its up row.
  const int64_t half = p.m / 2, glu_row = tile * 8 + g;
  const int64_t row[2] = {kGlu ? glu_row : tile * 16 + g, kGlu ? half + glu_row : tile * 16 + g + 8};
  const bool row_in[2] = {kGlu ? glu_row < half : row[0] < p.m, kGlu ? glu_row < half : row[1] < p.m};
  const int64_t chunks = (p.k + kChunkCols - 1) / kChunkCols;

  // Loads of kDepth chunks of this warp (weights only: legal before pdl_wait). Chunks past the end load
  // nothing.
  uint4 a[kDepth][2][2];  // [chunk][row g, g + 8][run]
  auto load_group = [&](int64_t c0) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t c = c0 + static_cast<int64_t>(d) * kWarps;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int run = 0; run < 2; ++run) {
          const int64_t col = run_col(c, run, t);
          a[d][r][run] = c < chunks && col < p.k && row_in[r] ? load_streaming(weights + row[r] * p.k + col)
                                                              : make_uint4(0, 0, 0, 0);
        }
      }
    }
  };
  load_group(warp);
  pdl_wait();
  pdl_trigger();

  const XT* xrow[kTiles];
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    const int col = nt * 8 + g;
    xrow[nt] = col < p.tokens ? x + col * x_ld : nullptr;
  }
  float acc[kTiles][4];
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

  for (int64_t c0 = warp; c0 < chunks; c0 += kWarps * kDepth) {
    if (c0 != warp) load_group(c0);
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t c = c0 + static_cast<int64_t>(d) * kWarps;
      if (c >= chunks) break;  // uniform across the warp
#pragma unroll
      for (int run = 0; run < 2; ++run) {
        const int64_t col = run_col(c, run, t);
        const uint4 w0 = a[d][0][run], w1 = a[d][1][run];
#pragma unroll
        for (int nt = 0; nt < kTiles; ++nt) {
          uint32_t b[4];
          token_words<XT>(xrow[nt], col, col < p.k, b);
          mma_bf16(acc[nt], w0.x, w1.x, w0.y, w1.y, b[0], b[1]);
          mma_bf16(acc[nt], w0.z, w1.z, w0.w, w1.w, b[2], b[3]);
        }
      }
    }
  }

#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][nt * 4 + i][lane] = acc[nt][i];
  }
  __syncthreads();
  for (int item = warp; item < kTiles * 4; item += kWarps) {
    const int tok = (item >> 2) * 8 + 2 * t + (item & 1);  // C element item & 3 of tile item >> 2
    const int r = (item & 2) ? 1 : 0;
    if (tok >= p.tokens || !row_in[r] || (kGlu && r == 1)) continue;
    float v = partial[0][item][lane];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v += partial[w][item][lane];
    if constexpr (kGlu) {
      float up = partial[0][item + 2][lane];  // the same token's up row (C element item & 3 + 2)
#pragma unroll
      for (int w = 1; w < kWarps; ++w) up += partial[w][item + 2][lane];
      y[tok * y_ld + glu_row] = from_float<YT>(glu_value(v, up, p.situ, p.situ_beta, p.situ_linear_beta));
    } else {
      y[tok * y_ld + row[r]] = from_float<YT>(v);
    }
  }
}

// How a CTA streams its tile: kWarps warps, each with kDepth chunks of loads in flight, chosen per launch
// from the grid against the SM count (pick_streaming). Measured on an H200 with kernel_bench --skinny (each
// call on its own copy of the weights), batch 1, against the one configuration before, 8 warps x 4 chunks
// (102 registers, 2 CTAs per SM), in the same call:
//  - kWide, 16 x 1 (56 registers, 2 CTAs and 32 warps per SM), up to 2 tiles per SM: o_proj [2304 x 4096]
//    8.2 against 9.0 µs, the dense FFN's down [2304 x 9216] 16.2 against 18.6. In the sweep that chose it,
//    many warps with one chunk each beat fewer warps with deeper queues at the same bytes in flight (o_proj:
//    16 x 2 8.7, 8 x 2 8.2-8.7, 32 x 1 at one CTA per SM 9.7, against 7.6-8.0 for 16 x 1). Again on
//    2026-12-04, with more loads in flight per SM and the CTAs per SM stated in __launch_bounds__ (no
//    spills): o_proj 16 x 2 at 2 CTAs per SM (64 registers) 8.88 µs, 12 x 2 at 2 8.11, 8 x 3 at 4 12.07,
//    against 7.86; the 48B step at 4K, batch 1, 2.427-2.472, 2.407-2.441 and 2.662-2.685 ms against
//    2.401-2.403 (three rounds in one call).
//  - kNarrow, 8 x 1 (4 CTAs per SM, the same 32 warps), past 2 tiles per SM, so that the grid stays one
//    wave: MLA's q|kv_a [6720 x 2304] (420 tiles) 10.2 against 11.7 (kWide: 11.1-11.4 in the sweep).
//  - kDeep, 16 x 3 (one CTA per SM), up to 1 tile per SM: the CTA's whole slab in flight at once (48 chunks
//    cover K = 3,072): the shared expert's gate|up with GLU [2048 x 2304] (128 tiles) 4.6 against 5.5
//    (kWide: 4.9-5.0).
//  - the per-head form, always 8 x 2 (launch_skinny_gemm_tiles): W_UV, K = 512, 8 chunks per tile, 2.8
//    against 3.0 (kWide 2.9-3.1).
// The 48B decode step at batch 1 (4K context): 2.74 against 2.84 ms (bench, three runs each). Measured and
// dropped in the sweep: 8-row tiles (half the A fragment zero) so that the 144 tiles of a 2304-row matrix
// spread more evenly over 132 SMs: o_proj 7.7-10.4 µs over four configurations, the step no faster. And
// afterwards an L2 prefetch (prefetch.global.L2) of each warp's later chunks before pdl_wait, meant to
// fill DRAM while the kernel ahead (KDA's latency-bound decode before o_proj) runs: the KDA layer 42.7 ->
// 43.2 µs, the dense FFN 47.0-47.5 -> 49.2-49.8, K3's first four layers at batch 1 2.83 -> 2.95 ms.
// Added later (2026-12-04), past 4 tiles per SM:
//  - kMany, 6 x 1 at 6 CTAs per SM (56 registers, 36 warps): one token's KDA input projection, 12,576 rows
//    (786 tiles), was 1.5 waves on kNarrow (528 CTAs resident) and is one wave here (792), with K =
//    2,304's 36 chunks dealt 6 to each warp: 18.9 -> 16.5 µs in kernel_bench --small-ops. In the steps
//    (bench, alternating with the build before in one device call): K3's first 4 layers at 4K, batch 1
//    (its stacked MLA projection is 900 tiles here, its shared experts' gate|up 768) 2.597-2.609 ->
//    2.551-2.575 ms; the 48B at 4K, batch 1, unchanged within its noise (2.492-2.532 ms against
//    2.497-2.515 before, and the same in three later calls): the fused KDA decode after the projection
//    took back what the projection gained (bench --kernel-trace: the projections' share of the step 355
//    -> 289 µs, that kernel's 133 -> 199; why was not found). 4 x 1 at 6 CTAs per SM, meant to leave
//    registers for that kernel's CTAs beside the projection: the projection 18.7 µs, the traced shares 299
//    and 201, K3's step 2.535-2.538 ms, the 48B at 1M keys 4.454 against 4.421 (4.396 with 6 x 1).
//  - every configuration states its CTAs per SM in __launch_bounds__ (1 but for kMany), which changed
//    ptxas's register allocation (kWide at one token tile 56 -> 60 registers, the same CTAs per SM); the
//    small GEMMs were then faster in kernel_bench (a 32-row GEMM 2.3-2.5 -> 2.2 µs, the shared expert's
//    gate|up 3.7 -> 3.4, o_proj 5.9 -> 5.7, two calls).
enum class Streaming { kWide, kNarrow, kDeep, kMany };

Streaming pick_streaming(int64_t tiles, int sm_count) {
  if (tiles <= sm_count) return Streaming::kDeep;
  if (tiles <= 2 * static_cast<int64_t>(sm_count)) return Streaming::kWide;
  return tiles <= 4 * static_cast<int64_t>(sm_count) ? Streaming::kNarrow : Streaming::kMany;
}

template <int kWarps, int kDepth, int kTiles, class XT, bool kGlu, bool kBatched, int kMinBlocks = 1>
void launch_skinny_gemm_cfg(const SkinnyGemmParams& p, dim3 tiles, bool f32_out, cudaStream_t stream) {
  if constexpr (kBatched) {  // per-head products: BF16 out only
    HLM_CHECK(!f32_out, "skinny_gemm: the per-head form writes BF16");
    launch_pdl(skinny_gemm_kernel<kWarps, kDepth, kTiles, XT, bf16, kGlu, true, kMinBlocks>, tiles,
               kWarps * 32, 0, stream, p);
  } else if (f32_out) {
    launch_pdl(skinny_gemm_kernel<kWarps, kDepth, kTiles, XT, float, kGlu, false, kMinBlocks>, tiles,
               kWarps * 32, 0, stream, p);
  } else {
    launch_pdl(skinny_gemm_kernel<kWarps, kDepth, kTiles, XT, bf16, kGlu, false, kMinBlocks>, tiles,
               kWarps * 32, 0, stream, p);
  }
  HLM_CHECK_LAUNCH("skinny_gemm_kernel");
}

template <int kTiles, class XT, bool kGlu, bool kBatched>
void launch_skinny_gemm_tiles(const SkinnyGemmParams& p, dim3 tiles, Streaming s, bool f32_out,
                              cudaStream_t stream) {
  if constexpr (kBatched) {
    launch_skinny_gemm_cfg<8, 2, kTiles, XT, kGlu, true>(p, tiles, f32_out, stream);
  } else {
    switch (s) {
      case Streaming::kDeep:
        launch_skinny_gemm_cfg<16, 3, kTiles, XT, kGlu, false>(p, tiles, f32_out, stream);
        break;
      case Streaming::kNarrow:
        launch_skinny_gemm_cfg<8, 1, kTiles, XT, kGlu, false>(p, tiles, f32_out, stream);
        break;
      case Streaming::kMany:
        launch_skinny_gemm_cfg<6, 1, kTiles, XT, kGlu, false, 6>(p, tiles, f32_out, stream);
        break;
      default:
        launch_skinny_gemm_cfg<16, 1, kTiles, XT, kGlu, false>(p, tiles, f32_out, stream);
        break;
    }
  }
}

template <bool kGlu, bool kBatched = false>
void launch_skinny_gemm(const CudaContext& ctx, const SkinnyGemmParams& p, dim3 tiles, bool x_f32,
                        bool f32_out) {
  const Streaming s = pick_streaming(tiles.x, ctx.sm_count());
  if (p.tokens <= 8) {
    x_f32 ? launch_skinny_gemm_tiles<1, float, kGlu, kBatched>(p, tiles, s, f32_out, ctx.stream())
          : launch_skinny_gemm_tiles<1, bf16, kGlu, kBatched>(p, tiles, s, f32_out, ctx.stream());
  } else {
    x_f32 ? launch_skinny_gemm_tiles<2, float, kGlu, kBatched>(p, tiles, s, f32_out, ctx.stream())
          : launch_skinny_gemm_tiles<2, bf16, kGlu, kBatched>(p, tiles, s, f32_out, ctx.stream());
  }
}

SkinnyGemmParams skinny_params(const Tensor& x, const Tensor& w, Tensor& y) {
  SkinnyGemmParams p{};
  p.w = static_cast<const bf16*>(w.raw());
  p.x = x.raw();
  p.y = y.raw();
  p.m = w.dim(0);
  p.k = w.dim(1);
  p.tokens = static_cast<int>(x.dim(0));
  return p;
}

// --- head_rows_kernel: y_h = x_h · w_h with w [H, a, b], for a <= 128 (head_rows.cuh) -------------------
template <class XT>
__global__ void __launch_bounds__(kHeadThreads) head_rows_kernel(HeadRowsParams p) {
  head_rows_block<XT>(p, blockIdx.x, blockIdx.y);
}

}  // namespace

bool skinny_gemm_applies(const Tensor& x, const Tensor& w) {
  return x.dim(0) >= 1 && x.dim(0) <= kMaxTokens && w.dtype() == DType::kBF16 &&
         w.dim(0) < (x.dim(0) == 1 ? kCublasRowsOneToken : kCublasRows) && x.dim(1) % 8 == 0 &&
         aligned16(x.raw()) && aligned16(w.raw());
}

void skinny_gemm(CudaContext& ctx, const Tensor& x, const Tensor& w, Tensor& y) {
  HLM_CHECK(skinny_gemm_applies(x, w), "skinny_gemm: x {} / w {} outside its range", shape_str(x.shape()),
            shape_str(w.shape()));
  expect_dim(y, 0, x.dim(0), "skinny_gemm", "y [T, M]", "the token count of x");
  expect_dim(y, 1, w.dim(0), "skinny_gemm", "y [T, M]", "the row count of w");
  const SkinnyGemmParams p = skinny_params(x, w, y);
  launch_skinny_gemm<false>(ctx, p, dim3(static_cast<unsigned>((w.dim(0) + 15) / 16)),
                            x.dtype() == DType::kF32, y.dtype() == DType::kF32);
}

namespace {

void launch_head_rows(CudaContext& ctx, const Tensor& x, const Tensor& w, int64_t tail, Tensor& y) {
  const HeadRowsParams p = head_rows_params(x, w, tail, y);
  const dim3 grid(blocks_for(p.b, kHeadColThreads * 8), static_cast<unsigned>(p.heads));
  if (x.dtype() == DType::kF32) {
    launch_pdl(head_rows_kernel<float>, grid, kHeadThreads, 0, ctx.stream(), p);
  } else {
    launch_pdl(head_rows_kernel<bf16>, grid, kHeadThreads, 0, ctx.stream(), p);
  }
  HLM_CHECK_LAUNCH("head_rows_kernel");
}

}  // namespace

HeadRowsParams head_rows_params(const Tensor& x, const Tensor& w, int64_t tail, Tensor& y) {
  const int64_t heads = x.dim(1), a = w.dim(1), b = w.dim(2);
  HLM_CHECK(a + tail <= x.dim(2) && y.dim(2) == b + tail && x.dim(0) <= kHeadMaxTokens && a <= kHeadMaxRows,
            "head_rows: x {} / w {} / y {} with {} copied columns", x.describe(), w.describe(), y.describe(),
            tail);
  HeadRowsParams p{};
  p.w = static_cast<const bf16*>(w.raw());
  p.x = x.raw();
  p.y = static_cast<bf16*>(y.raw());
  p.heads = heads;
  p.a = a;
  p.b = b;
  p.tail = tail;
  p.x_ld = x.dim(2);
  p.y_ld = y.dim(2);
  p.tokens = static_cast<int>(x.dim(0));
  return p;
}

bool head_gemv_applies(const Tensor& x, const Tensor& w, bool w_transposed) {
  if (x.rank() != 3 || w.rank() != 3 || x.dim(0) < 1 || x.dim(0) > kMaxTokens || w.dtype() != DType::kBF16 ||
      x.dim(1) > 65535 || !aligned16(x.raw()) || !aligned16(w.raw())) {
    return false;
  }
  return w_transposed ? x.dim(2) % 8 == 0 : w.dim(1) <= kHeadMaxRows && w.dim(2) % 8 == 0;
}

void head_gemv(CudaContext& ctx, const Tensor& x, const Tensor& w, bool w_transposed, Tensor& y) {
  HLM_CHECK(head_gemv_applies(x, w, w_transposed), "head_gemv: x {} / w {} outside its range", x.describe(),
            w.describe());
  const int64_t tokens = x.dim(0), heads = x.dim(1), a = x.dim(2), b = w_transposed ? w.dim(1) : w.dim(2);
  expect_dim(w, 0, heads, "head_gemv", "w", "the head count of x [T, H, a]");
  expect_dim(w, w_transposed ? 2 : 1, a, "head_gemv", "w", "the last dimension of x [T, H, a]");
  expect_dim(y, 2, b, "head_gemv", "y [T, H, b]", "the output width of w");
  if (w_transposed) {
    SkinnyGemmParams p{};
    p.w = static_cast<const bf16*>(w.raw());
    p.x = x.raw();
    p.y = y.raw();
    p.m = b;
    p.k = a;
    p.x_ld = heads * a;
    p.y_ld = heads * b;
    p.w_batch = b * a;
    p.x_batch = a;
    p.y_batch = b;
    p.tokens = static_cast<int>(tokens);
    launch_skinny_gemm<false, true>(ctx, p,
                                    dim3(static_cast<unsigned>((b + 15) / 16), static_cast<unsigned>(heads)),
                                    x.dtype() == DType::kF32, y.dtype() == DType::kF32);
    return;
  }
  launch_head_rows(ctx, x, w, 0, y);
}

bool mla_absorb_queries_applies(const Tensor& q, const Tensor& w_uk) {
  return q.dtype() == DType::kBF16 && head_gemv_applies(q, w_uk, false) && w_uk.dim(1) <= q.dim(2);
}

Tensor mla_absorb_queries(CudaContext& ctx, const Tensor& q, const Tensor& w_uk) {
  HLM_CHECK(mla_absorb_queries_applies(q, w_uk), "mla_absorb_queries: q {} / w_uk {} outside its range",
            q.describe(), w_uk.describe());
  expect_dim(w_uk, 0, q.dim(1), "mla_absorb_queries", "w_uk [H, nope, L]", "the head count of q [T, H, qk]");
  const int64_t nope = w_uk.dim(1), rope = q.dim(2) - nope;
  Tensor y = ctx.empty({q.dim(0), q.dim(1), w_uk.dim(2) + rope}, DType::kBF16);  // [T, H, L + R]
  launch_head_rows(ctx, q, w_uk, rope, y);
  return y;
}

void skinny_gemm_glu(CudaContext& ctx, const Tensor& x, const Tensor& gate_up, const ActivationParams& act,
                     Tensor& y) {
  HLM_CHECK(skinny_gemm_applies(x, gate_up) && gate_up.dim(0) % 2 == 0,
            "skinny_gemm_glu: x {} / gate_up {} outside its range", x.describe(), gate_up.describe());
  expect_dim(y, 1, gate_up.dim(0) / 2, "skinny_gemm_glu", "y [T, I]",
             "half the row count of gate_up [2I, K]");
  SkinnyGemmParams p = skinny_params(x, gate_up, y);
  p.situ = act.kind == Activation::kSitu;
  p.situ_beta = act.situ_beta;
  p.situ_linear_beta = act.situ_linear_beta;
  launch_skinny_gemm<true>(ctx, p, dim3(static_cast<unsigned>((gate_up.dim(0) / 2 + 7) / 8)),
                           x.dtype() == DType::kF32, y.dtype() == DType::kF32);
}

}  // namespace hlm::cuda
