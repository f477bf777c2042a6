// Decode-size dense GEMMs: y [T, M] = x [T, K] · w [M, K]ᵀ for T <= 16 tokens and bf16 weights. At this
// size a GEMM only streams its weights, and cuBLASLt's tiles (sized for compute) leave most of the copy
// bandwidth unused on the small projections of a decode step (down to 0.3 TB/s on a 4.7 MB matrix on an
// H200). Here the weights are the 16-row A side of mma.sync m16n8k16 and the tokens the 8-column B side
// (mma.cuh), so every weight byte is read once whatever T is.
//
// Decomposition: CTA b takes rows [16b, 16b + 16) over the whole K; its kWarps warps split K in 64-column
// chunks (warp w: chunks w, w + kWarps, ...), each keeping kDepth chunks of loads in flight (64 KB per CTA).
// The warps' partial sums meet in shared memory and are added in warp order (a fixed order: the result is
// the same every run). The kernel is launched with PDL (pdl.cuh): its first weight loads go out before
// pdl_wait(), overlapping the previous kernel's tail, since no kernel of a step writes weights.
// Measured on an H200 and dropped: splitting K across a thread-block cluster for the small matrices, and a
// two-buffer pipeline per warp; with either, every matrix size took longer per call and the decode step
// was slower.
//
// A GLU variant saves the GLU's launch for a weight stacking gate rows [0, I) over up rows [I, 2I): CTA b
// takes gate rows [8b, 8b + 8) as A rows 0-7 and the same up rows as A rows 8-15, so each lane holds the
// gate and up sums of its (token, row) pairs and writes act(gate)·up. (Measured and dropped: a pair of
// independent GEMMs in one launch, for KDA's f_b and g_b: 3.74 µs in a graph against 3.77 µs for the two
// launches, whose weight loads already overlap through PDL.)
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kDepth = 4;       // chunks per warp in flight
constexpr int kChunkCols = 64;  // a chunk: 16 rows x 64 columns; lane (g, t) loads 2 runs of 8 per row
constexpr int kMaxTokens = 16;  // two 8-column token tiles
// Rows from which cuBLASLt takes the GEMM: its tiles stream the large matrices faster (lm_head at 4.4 TB/s,
// KDA's fused q|k|v at 3.1 against 2.6 here). Measured on an H200 with the 48B config: cuBLASLt from
// 8,192 rows made the batch-1 step 1.4% and the batch-8 step 2.2% faster than from 65,536, and from
// 4,096 rows slower again.
constexpr int64_t kCublasRows = 8192;

struct SkinnyGemmParams {
  const bf16* w;  // [M, K]
  const void* x;  // [T, K] BF16 or F32
  void* y;        // [T, M] BF16 or F32; GLU: [T, M/2]
  int64_t m, k;
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

template <int kTiles, class XT, class YT, bool kGlu>
__global__ void __launch_bounds__(kWarps * 32) skinny_gemm_kernel(SkinnyGemmParams p) {
  __shared__ float partial[kWarps][kTiles * 4][32];
  const int64_t tile = blockIdx.x;
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
          a[d][r][run] = c < chunks && col < p.k && row_in[r] ? load_streaming(p.w + row[r] * p.k + col)
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
    xrow[nt] = col < p.tokens ? static_cast<const XT*>(p.x) + col * p.k : nullptr;
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
      static_cast<YT*>(p.y)[tok * half + glu_row] =
          from_float<YT>(glu_value(v, up, p.situ, p.situ_beta, p.situ_linear_beta));
    } else {
      static_cast<YT*>(p.y)[tok * p.m + row[r]] = from_float<YT>(v);
    }
  }
}

template <int kTiles, class XT, bool kGlu>
void launch_skinny_gemm_tiles(const SkinnyGemmParams& p, unsigned tiles, bool f32_out, cudaStream_t stream) {
  if (f32_out) {
    launch_pdl(skinny_gemm_kernel<kTiles, XT, float, kGlu>, tiles, kWarps * 32, 0, stream, p);
  } else {
    launch_pdl(skinny_gemm_kernel<kTiles, XT, bf16, kGlu>, tiles, kWarps * 32, 0, stream, p);
  }
  HLM_CHECK_LAUNCH("skinny_gemm_kernel");
}

template <bool kGlu>
void launch_skinny_gemm(const SkinnyGemmParams& p, unsigned tiles, bool x_f32, bool f32_out,
                        cudaStream_t stream) {
  if (p.tokens <= 8) {
    x_f32 ? launch_skinny_gemm_tiles<1, float, kGlu>(p, tiles, f32_out, stream)
          : launch_skinny_gemm_tiles<1, bf16, kGlu>(p, tiles, f32_out, stream);
  } else {
    x_f32 ? launch_skinny_gemm_tiles<2, float, kGlu>(p, tiles, f32_out, stream)
          : launch_skinny_gemm_tiles<2, bf16, kGlu>(p, tiles, f32_out, stream);
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

}  // namespace

bool skinny_gemm_applies(const Tensor& x, const Tensor& w) {
  return x.dim(0) >= 1 && x.dim(0) <= kMaxTokens && w.dtype() == DType::kBF16 && w.dim(0) < kCublasRows &&
         x.dim(1) % 8 == 0 && aligned16(x.raw()) && aligned16(w.raw());
}

void skinny_gemm(CudaContext& ctx, const Tensor& x, const Tensor& w, Tensor& y) {
  HLM_CHECK(skinny_gemm_applies(x, w), "skinny_gemm: x {} / w {} outside its range", shape_str(x.shape()),
            shape_str(w.shape()));
  expect_dim(y, 0, x.dim(0), "skinny_gemm", "y [T, M]", "the token count of x");
  expect_dim(y, 1, w.dim(0), "skinny_gemm", "y [T, M]", "the row count of w");
  const SkinnyGemmParams p = skinny_params(x, w, y);
  launch_skinny_gemm<false>(p, static_cast<unsigned>((w.dim(0) + 15) / 16), x.dtype() == DType::kF32,
                            y.dtype() == DType::kF32, ctx.stream());
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
  launch_skinny_gemm<true>(p, static_cast<unsigned>((gate_up.dim(0) / 2 + 7) / 8), x.dtype() == DType::kF32,
                           y.dtype() == DType::kF32, ctx.stream());
}

}  // namespace hlm::cuda
