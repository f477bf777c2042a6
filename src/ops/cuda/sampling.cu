// Token sampling on the GPU: the same draws as ops/cpu/sampling.cc (see its comment and SampleParams in
// ops/ops.h), without sorting the vocabulary. Three steps:
//  1. scan: finite check and argmax (lowest index on ties), in slices of kSliceItems logits per CTA, then
//     one warp per row over its slices' winners; greedy and non-finite rows are answered here.
//  2. weights (many CTAs per row): w_i = exp((x_i − max)·(1/T)) into a scratch row, computed in double and
//     rounded once, so that each w_i is the correctly rounded value, which glibc's expf (within 0.502 ulp)
//     nearly always gives too: the CPU's weights are matched bit for bit, or off by one ulp.
//  3. draw (one CTA per row): the top-k threshold (the k-th largest w) and the top-p threshold (the largest
//     kept w whose mass of kept weights at or above it reaches top_p of the kept total) by radix select over
//     the bit patterns of the non-negative floats w (three passes of 11/11/10-bit digits, histograms in
//     shared memory), then the inverse CDF in index order: tile sums of the kept weights, the tile where the
//     running sum passes u·total, and a scan inside it.
// Masses in the top-p select are fixed-point integers (2^40 per unit weight), so the histograms are
// order-independent and deterministic; the final scan sums in double in a fixed order. With the one-ulp
// weight differences these change a draw only when u·total (or top_p·total, or a threshold) lies within
// ~2^-22 of the kept total from a boundary (tests/gpu/cuda_sampling_test.cc derives the margin).
#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/random_hash.h"

namespace hlm::cuda {

namespace {

constexpr int kThreads = 1024;  // one CTA per row (scan and draw)
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;    // radix-select digit of 11 bits; each thread owns 2 bins
constexpr int kScanItems = 8;  // consecutive weights per thread in the ordered scan
constexpr int kScanTile = kThreads * kScanItems;
constexpr int64_t kMaxVocab = int64_t{1} << 23;  // 2^23 weights of at most 2^40 fixed-point units fit 63 bits
constexpr int kMaxTiles = static_cast<int>(kMaxVocab / kScanTile);
constexpr float kMassUnit = 1099511627776.0f;  // 2^40
constexpr int kWeightThreads = 256, kWeightItems = 4;
constexpr int kSliceThreads = 256, kSliceLoads = 16;  // the argmax scan: 4,096 logits per CTA
constexpr int kSliceItems = kSliceThreads * kSliceLoads;

struct SampleRow {
  float inv_temperature;  // 1 / T, 0 for greedy
  float top_p;            // 1: no top-p cut
  int32_t top_k;          // 0: no top-k cut (0 or >= V in the request)
  int32_t greedy;
  uint64_t seed, stream, counter;
};

struct RowState {
  float max;
  int32_t best;     // argmax, lowest index on ties
  int32_t sampled;  // whether kernels 2 and 3 draw this row
};

// Rows whose sampling parameters travel inside the kernel parameters. Uploaded instead, they were a copy on
// the stream between the decode step's lm_head and the scan, which the scan waited for (a traced batch-1
// step on an H200: the GPU idle there 3.7 µs, 1.5 µs with the parameters inline).
constexpr int64_t kInlineRows = 16;

struct SampleKernelParams {
  const float* logits;    // [R, V]
  const SampleRow* rows;  // [R] on the device, or null: the first R of inline_rows
  SampleRow inline_rows[kInlineRows];
  RowState* state;        // [R]
  float* weights;         // [R, V8]: w_i, 0 past V
  int32_t* ids;           // [R]
  int64_t vocab, padded;  // V and V8 = V rounded up to 8
};

__device__ __forceinline__ const SampleRow& row_params(const SampleKernelParams& p, int64_t row) {
  return p.rows != nullptr ? p.rows[row] : p.inline_rows[row];
}

// --- 1. finite check and argmax ----------------------------------------------------------------------------
// Whether candidate (v, i) beats (best_v, best_i): the larger value wins, equal values go to the lower index.
__device__ __forceinline__ bool beats(float v, int i, float best_v, int best_i) {
  return v > best_v || (v == best_v && i < best_i);
}

// Every lane gets the warp's winner (beats).
__device__ __forceinline__ void warp_argmax(float& best_v, int& best_i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best_v, o);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (beats(v, i, best_v, best_i)) {
      best_v = v;
      best_i = i;
    }
  }
}

// A slice's winner: the first index of its largest finite logit, and whether all its logits are finite.
struct SliceBest {
  float v;
  int32_t i;
  int32_t finite;
};

// Grid (slices, R), kSliceThreads threads: CTA s takes logits [s·kSliceItems, (s + 1)·kSliceItems) of its
// row, each thread kSliceLoads of them kSliceThreads apart, all loaded before any is compared. Measured
// with ncu on an H200 at the 48B's 163,840 logits, batch 1: this kernel and the per-row one below 3.7 +
// 2.5 µs, against 25.2 µs for the one CTA of 1024 threads per row that walked the row before.
__global__ void __launch_bounds__(kSliceThreads)
    sample_scan_slice_kernel(const SampleKernelParams p, SliceBest* slices) {
  __shared__ float warp_v[kSliceThreads / 32];
  __shared__ int warp_i[kSliceThreads / 32];
  const int64_t row = blockIdx.y;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kSliceItems + threadIdx.x;
  const float* x = p.logits + row * p.vocab;
  float v[kSliceLoads];
#pragma unroll
  for (int j = 0; j < kSliceLoads; ++j) {
    const int64_t i = first + static_cast<int64_t>(j) * kSliceThreads;
    v[j] = i < p.vocab ? x[i] : -INFINITY;
  }
  float best_v = -INFINITY;
  int best_i = INT_MAX;
  bool finite = true;
#pragma unroll
  for (int j = 0; j < kSliceLoads; ++j) {
    const int64_t i = first + static_cast<int64_t>(j) * kSliceThreads;
    if (i >= p.vocab) break;
    if (!isfinite(v[j])) {
      finite = false;
    } else if (v[j] > best_v) {  // i increases, so the first of equal values stays
      best_v = v[j];
      best_i = static_cast<int>(i);
    }
  }
  warp_argmax(best_v, best_i);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    warp_v[warp] = best_v;
    warp_i[warp] = best_i;
  }
  finite = __syncthreads_and(finite);
  if (warp != 0) return;
  best_v = lane < kSliceThreads / 32 ? warp_v[lane] : -INFINITY;
  best_i = lane < kSliceThreads / 32 ? warp_i[lane] : INT_MAX;
  warp_argmax(best_v, best_i);
  if (lane == 0) slices[row * gridDim.x + blockIdx.x] = SliceBest{best_v, best_i, finite ? 1 : 0};
}

// One warp per row over its `count` slice winners.
__global__ void __launch_bounds__(32)
    sample_scan_rows_kernel(const SampleKernelParams p, const SliceBest* slices, int count) {
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x;
  float best_v = -INFINITY;
  int best_i = INT_MAX;
  bool finite = true;
  for (int s = lane; s < count; s += 32) {
    const SliceBest b = slices[row * count + s];
    finite = finite && b.finite != 0;
    if (beats(b.v, b.i, best_v, best_i)) {
      best_v = b.v;
      best_i = b.i;
    }
  }
  warp_argmax(best_v, best_i);
  finite = __all_sync(0xffffffffu, finite);
  if (lane != 0) return;
  const bool greedy = row_params(p, row).greedy != 0;
  p.state[row] = RowState{best_v, best_i, finite && !greedy ? 1 : 0};
  if (!finite) {
    p.ids[row] = -1;
  } else if (greedy) {
    p.ids[row] = best_i;
  }
}

// --- 2. weights --------------------------------------------------------------------------------------------
// Grid (ceil(V8 / 1024), R). The argument is formed in float exactly as the CPU does ((x − max) then · 1/T,
// each rounded), and exp in double rounded to float is the correctly rounded expf.
__global__ void __launch_bounds__(kWeightThreads) sample_weights_kernel(const SampleKernelParams p) {
  const int64_t row = blockIdx.y;
  const RowState st = p.state[row];
  if (st.sampled == 0) return;
  const float inv_t = row_params(p, row).inv_temperature;
  const float* x = p.logits + row * p.vocab;
  float* w = p.weights + row * p.padded;
  for (int k = 0; k < kWeightItems; ++k) {
    const int64_t i = (blockIdx.x * static_cast<int64_t>(kWeightItems) + k) * kWeightThreads + threadIdx.x;
    if (i >= p.padded) return;
    w[i] = i < p.vocab
               ? __double2float_rn(exp(static_cast<double>(__fmul_rn(__fsub_rn(x[i], st.max), inv_t))))
               : 0.0f;
  }
}

// --- 3. thresholds and the draw ----------------------------------------------------------------------------
struct DrawSmem {
  unsigned long long hist[kBins];
  double tile_sum[kMaxTiles];
  double incl[kThreads];  // inclusive scan of the thread sums of the chosen tile
  double warp_total[kWarps];
  unsigned long long warp_above[kWarps];
  unsigned long long base, level_total;
  uint32_t digit;
  int first, tile;
  double acc, goal;
};

// Inclusive prefix sum over the block in thread order, in a fixed association (Hillis-Steele in each warp,
// then the warp totals), so two calls on the same values give the same bits.
__device__ __forceinline__ double block_inclusive_scan(double v, DrawSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  if (lane == 31) sm.warp_total[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double t = sm.warp_total[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += y;
    }
    sm.warp_total[lane] = t;
  }
  __syncthreads();
  if (warp > 0) v += sm.warp_total[warp - 1];
  __syncthreads();  // warp_total is reused by the next call
  return v;
}

// Among the elements with w >= floor, the largest value v whose weight F(v) (count or fixed-point mass of
// the elements >= v) reaches the goal: count mode: goal = k, v is the k-th largest; mass mode: goal =
// top_p · (mass of all elements >= floor). Digits [31:21], [20:10], [9:0] of the float bits (non-negative
// floats order as their bits). At each digit, bins are scanned from the top: the answer lies in the highest
// bin where (weight above the bin) + (weight of the bins >= it) reaches the goal; the weight above it
// carries to the next digit. Bin d is owned by thread d/2, so one suffix scan over threads finds it.
__device__ __forceinline__ float radix_select(const float* w, int64_t n, float floor, bool mass, double goal,
                                              DrawSmem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t prefix = 0, mask = 0;
  unsigned long long base = 0;  // weight of the elements above the prefix's range
  double target = goal;
#pragma unroll 1
  for (int level = 0; level < 3; ++level) {
    const int shift = level == 0 ? 21 : level == 1 ? 10 : 0;
    const uint32_t digit_mask = level == 2 ? 0x3ffu : 0x7ffu;
    for (int b = tid; b < kBins; b += kThreads) sm.hist[b] = 0;
    __syncthreads();
    for (int64_t i = tid; i < n; i += kThreads) {
      const float v = w[i];
      const uint32_t bits = __float_as_uint(v);
      if (v >= floor && (bits & mask) == prefix) {
        atomicAdd(&sm.hist[(bits >> shift) & digit_mask], mass ? __float2ull_rn(v * kMassUnit) : 1ull);
      }
    }
    __syncthreads();
    // Suffix sums over the threads' bin pairs: in the warp, then over the warps' totals.
    const unsigned long long h0 = sm.hist[2 * tid], h1 = sm.hist[2 * tid + 1];
    unsigned long long suffix = h0 + h1;  // this thread's bins and those of the later lanes
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long y = __shfl_down_sync(0xffffffffu, suffix, o);
      if (lane + o < 32) suffix += y;
    }
    if (lane == 0) sm.warp_above[warp] = suffix;  // the warp's total
    __syncthreads();
    if (warp == 0) {
      const unsigned long long own = sm.warp_above[lane];
      unsigned long long t = own;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_down_sync(0xffffffffu, t, o);
        if (lane + o < 32) t += y;
      }
      sm.warp_above[lane] = t - own;  // total of the later warps
      if (lane == 0) sm.level_total = t;
    }
    __syncthreads();
    if (level == 0 && mass) target = goal * static_cast<double>(sm.level_total);  // top_p of the kept mass
    const unsigned long long above = base + sm.warp_above[warp] + (suffix - h0 - h1);  // bins > 2·tid + 1
    const unsigned long long c1 = above + h1, c0 = c1 + h0;  // bins >= 2·tid + 1, 2·tid
    if (static_cast<double>(c1) >= target && static_cast<double>(above) < target) {
      sm.digit = 2 * tid + 1;
      sm.base = above;
    } else if (static_cast<double>(c0) >= target && static_cast<double>(c1) < target) {
      sm.digit = 2 * tid;
      sm.base = c1;
    }
    __syncthreads();
    prefix |= sm.digit << shift;
    mask |= digit_mask << shift;
    base = sm.base;
    __syncthreads();  // sm.digit, sm.base and sm.hist are rewritten by the next level
  }
  return __uint_as_float(prefix);
}

// Grid (R), kThreads. Rows drawn here: thresholds, then the first kept index (w >= tau, index order) where
// the running sum of kept weights exceeds u·total.
__global__ void __launch_bounds__(kThreads, 1) sample_draw_kernel(const SampleKernelParams p) {
  __shared__ DrawSmem sm;
  const int64_t row = blockIdx.x;
  const RowState st = p.state[row];
  if (st.sampled == 0) return;
  const SampleRow prm = row_params(p, row);
  const float* w = p.weights + row * p.padded;
  const int64_t n = p.vocab;
  const int tid = threadIdx.x;

  float tau = 0.0f;
  if (prm.top_k > 0) tau = radix_select(w, n, 0.0f, false, static_cast<double>(prm.top_k), sm);
  if (prm.top_p < 1.0f) tau = fmaxf(tau, radix_select(w, n, tau, true, static_cast<double>(prm.top_p), sm));

  // Sum of the kept weights of this thread's kScanItems consecutive elements of a tile, in index order.
  auto thread_sum = [&](int tile) {
    const int64_t i0 = static_cast<int64_t>(tile) * kScanTile + tid * kScanItems;
    double s = 0.0;
    if (i0 < n) {
      const float4 a = reinterpret_cast<const float4*>(w + i0)[0],
                   b = reinterpret_cast<const float4*>(w + i0)[1];
      const float v[kScanItems] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int j = 0; j < kScanItems; ++j) {
        if (i0 + j < n && v[j] >= tau) s += v[j];
      }
    }
    return s;
  };
  const int tiles = static_cast<int>((n + kScanTile - 1) / kScanTile);
  for (int tile = 0; tile < tiles; ++tile) {
    const double incl = block_inclusive_scan(thread_sum(tile), sm);
    if (tid == kThreads - 1) sm.tile_sum[tile] = incl;
  }
  __syncthreads();
  const double u = static_cast<double>(uniform01(prm.seed, prm.stream, prm.counter));
  if (tid == 0) {
    // The running total over tiles, summed in the same order as the total, so that target < total implies a
    // tile where the running sum passes it.
    double total = 0.0;
    for (int t = 0; t < tiles; ++t) total += sm.tile_sum[t];
    const double goal = u * total;
    double acc = 0.0;
    int chosen = -1;
    for (int t = 0; t < tiles && chosen < 0; ++t) {
      if (acc + sm.tile_sum[t] > goal) {
        chosen = t;
      } else {
        acc += sm.tile_sum[t];
      }
    }
    sm.tile = chosen;
    sm.acc = acc;
    sm.goal = goal;
    sm.first = kThreads;
  }
  __syncthreads();
  const int tile = sm.tile;
  const double acc = sm.acc, goal = sm.goal;
  if (tile < 0) {  // not reachable (u < 1 and w[best] = 1 is kept); the argmax is a kept token
    if (tid == 0) p.ids[row] = st.best;
    return;
  }
  const double incl = block_inclusive_scan(thread_sum(tile), sm);
  sm.incl[tid] = incl;
  if (acc + incl > goal) atomicMin(&sm.first, tid);
  __syncthreads();
  if (tid != sm.first) return;
  // The first thread whose running sum passes the goal walks its elements.
  double run = tid > 0 ? acc + sm.incl[tid - 1] : acc;
  const int64_t i0 = static_cast<int64_t>(tile) * kScanTile + tid * kScanItems;
  int64_t last_positive = -1;
  for (int j = 0; j < kScanItems && i0 + j < n; ++j) {
    const float v = w[i0 + j];
    if (v < tau) continue;
    run += v;
    if (v > 0.0f) last_positive = i0 + j;
    if (run > goal) {
      p.ids[row] = static_cast<int32_t>(i0 + j);
      return;
    }
  }
  // Rounding between the scan and the walk: the last positive kept weight of the thread is the one the
  // scan says carries the crossing.
  p.ids[row] = static_cast<int32_t>(last_positive >= 0 ? last_positive : st.best);
}

}  // namespace

std::vector<int32_t> sample(CudaContext& ctx, const Tensor& logits, const std::vector<SampleParams>& rows) {
  const char* op = "sample";
  expect_cuda(logits, op, "logits", {DType::kF32}, 2, "[R, V]");
  const int64_t num_rows = logits.dim(0), vocab = logits.dim(1);
  HLM_CHECK(static_cast<int64_t>(rows.size()) == num_rows,
            "sample: {} rows of sampling parameters for logits {}", rows.size(), logits.describe());
  HLM_CHECK(vocab <= kMaxVocab && num_rows <= 65535, "sample: logits {} exceed {} rows of {} entries",
            logits.describe(), 65535, kMaxVocab);
  std::vector<SampleRow> params(rows.size());
  bool any_sampled = false;
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleParams& s = rows[r];
    HLM_CHECK(s.temperature >= 0.0f && s.top_k >= 0 && s.top_p > 0.0f && s.top_p <= 1.0f,
              "sample: invalid parameters (temperature {}, top_k {}, top_p {})", s.temperature, s.top_k,
              s.top_p);
    const float inv_t = s.temperature == 0.0f ? 0.0f : 1.0f / s.temperature;  // as the CPU forms it
    HLM_CHECK(std::isfinite(inv_t), "sample: temperature {} is too small to invert in fp32", s.temperature);
    params[r] = SampleRow{inv_t,
                          s.top_p,
                          s.top_k > 0 && s.top_k < vocab ? static_cast<int32_t>(s.top_k) : 0,
                          s.temperature == 0.0f ? 1 : 0,
                          s.seed,
                          s.stream,
                          s.counter};
    any_sampled = any_sampled || s.temperature != 0.0f;
  }
  if (num_rows == 0) return {};
  if (vocab == 0) return std::vector<int32_t>(rows.size(), -1);  // no token to pick, as on the CPU

  const int64_t padded = (vocab + kScanItems - 1) / kScanItems * kScanItems;
  Tensor state = ctx.empty({num_rows * static_cast<int64_t>(sizeof(RowState))}, DType::kU8);
  Tensor ids = ctx.empty({num_rows}, DType::kI32);
  SampleKernelParams p{};
  p.logits = logits.data<float>();
  p.state = static_cast<RowState*>(state.raw());
  p.ids = ids.data<int32_t>();
  p.vocab = vocab;
  p.padded = padded;
  Tensor uploaded_rows;
  if (num_rows <= kInlineRows) {
    std::copy(params.begin(), params.end(), p.inline_rows);
  } else {
    uploaded_rows = ctx.empty({num_rows * static_cast<int64_t>(sizeof(SampleRow))}, DType::kU8);
    ctx.upload(params.data(), uploaded_rows.raw(), params.size() * sizeof(SampleRow));
    p.rows = static_cast<const SampleRow*>(uploaded_rows.raw());
  }
  const unsigned grid_rows = static_cast<unsigned>(num_rows);
  const int64_t slices = (vocab + kSliceItems - 1) / kSliceItems;
  Tensor slice_best = ctx.empty({num_rows * slices * static_cast<int64_t>(sizeof(SliceBest))}, DType::kU8);
  auto* sb = static_cast<SliceBest*>(slice_best.raw());
  sample_scan_slice_kernel<<<dim3(static_cast<unsigned>(slices), grid_rows), kSliceThreads, 0,
                             ctx.stream()>>>(p, sb);
  HLM_CHECK_LAUNCH("sample_scan_slice");
  sample_scan_rows_kernel<<<grid_rows, 32, 0, ctx.stream()>>>(p, sb, static_cast<int>(slices));
  HLM_CHECK_LAUNCH("sample_scan_rows");
  if (any_sampled) {
    Tensor weights = ctx.empty({num_rows, padded}, DType::kF32);  // [R, V8]
    p.weights = weights.data<float>();
    const dim3 grid(blocks_for(padded, kWeightThreads * kWeightItems), grid_rows);
    sample_weights_kernel<<<grid, kWeightThreads, 0, ctx.stream()>>>(p);
    HLM_CHECK_LAUNCH("sample_weights");
    sample_draw_kernel<<<grid_rows, kThreads, 0, ctx.stream()>>>(p);
    HLM_CHECK_LAUNCH("sample_draw");
  }
  std::vector<int32_t> out(rows.size());
  HLM_CUDA_CHECK(cudaMemcpyAsync(out.data(), ids.raw(), out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                 ctx.stream()));
  HLM_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  return out;
}

}  // namespace hlm::cuda
