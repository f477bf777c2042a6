// The element-wise parts of a KDA layer around the recurrent core (docs/MODEL.md §5.2, §5.3, §5.7), the same
// functions as ops/cpu/kda_conv_gate.cc: the causal depthwise short conv with its per-slot cache of raw
// inputs, the forget gate in log space, and the sigmoid-gated RMSNorm of the core output. fp32 math; all
// three are memory-bound streams (about 2 B in and 2 B out per element for the conv, 2 in and 4 out for the
// gate, 4 in and 2 out for the norm), so each is one coalesced pass with no shared-memory staging.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kda_common.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {
namespace {

constexpr int kMaxConvWidth = 8;  // the models use 4
constexpr int kConvThreads = 256;
constexpr int kConvRows = 32;  // rows of the batch per CTA of short_conv_kernel, at most

template <class XT>
struct ShortConvParams {
  const XT* x;           // [T, C] raw projected inputs
  FloatIn w;             // [C, W]
  FloatInOut state;      // [slots, C, W-1] the last W-1 raw inputs of each slot
  const int32_t* table;  // [S, 3]
  __nv_bfloat16* y;      // [T, C]
  int64_t rows;
  int channels;
  int width;
  int num_spans;
  bool state_inline;  // every sequence has at most one new token: short_conv_kernel rewrites the cache
  int rows_per_cta;   // <= kConvRows
};

// A CTA takes rows_per_cta consecutive rows and kConvThreads channels; a thread owns one channel and walks
// the rows (consecutive threads read consecutive channels: coalesced), keeping the window of inputs in
// registers from one row of a sequence to the next, so that each row loads one new input instead of W
// (measured on an H200: an 8K-token prefill of the 48B model 21,834-21,853 -> 22,031-22,046 tokens/s). A
// decode step takes one row per CTA: a thread's rows are a serial chain of cache loads, and at batch 8
// walking them made the conv 12 µs against 4 at batch 1 (ncu, 48B config). Which sequence each row belongs to
// comes from one scan of the span table per CTA (S is small), so rows outside every span are found on the
// device and written as zeros, as graphs require. Taps before a sequence's first new token read the cached
// inputs; the cache is rewritten afterwards by short_conv_state_kernel, because the first W-1 rows of a
// sequence can fall in two CTAs that both read the old cache. With one new token per sequence (a decode step)
// the thread that reads a (slot, channel) cache is its only reader, so it rewrites it right after the conv
// and the second launch is skipped (state_inline).
template <class XT>
__global__ void __launch_bounds__(kConvThreads) short_conv_kernel(ShortConvParams<XT> p) {
  pdl_wait();
  pdl_trigger();
  __shared__ int row_pos[kConvRows];   // the row's index among its sequence's new tokens; -1: no sequence
  __shared__ int row_slot[kConvRows];  // the sequence's cache slot
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * p.rows_per_cta;
  for (int i = threadIdx.x; i < kConvRows; i += blockDim.x) row_pos[i] = -1;
  __syncthreads();
  for (int s = threadIdx.x; s < p.num_spans; s += blockDim.x) {
    const Span span = load_span(p.table, s);
    if (span.count <= 0 || span.slot < 0) continue;
    const int64_t lo = max(static_cast<int64_t>(span.begin), row0);
    const int64_t hi = min(static_cast<int64_t>(span.begin) + span.count, row0 + p.rows_per_cta);
    for (int64_t r = lo; r < hi; ++r) {
      row_pos[r - row0] = static_cast<int>(r - span.begin);
      row_slot[r - row0] = span.slot;
    }
  }
  __syncthreads();

  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  if (c >= p.channels) return;
  const int64_t channels = p.channels;
  const int hist = p.width - 1;
  float taps[kMaxConvWidth];
#pragma unroll
  for (int j = 0; j < kMaxConvWidth; ++j)
    taps[j] = j < p.width ? p.w.load(c * static_cast<int64_t>(p.width) + j) : 0.0f;

  const int rows_here = static_cast<int>(min(static_cast<int64_t>(p.rows_per_cta), p.rows - row0));
  float in[kMaxConvWidth] = {};  // the window of the row before, when it was this sequence's previous row
  for (int i = 0; i < rows_here; ++i) {
    const int t = row_pos[i];
    float acc = 0.0f;
    if (t >= 0) {
      const int64_t begin = row0 + i - t;                                // the sequence's first new row
      const int64_t cache = (row_slot[i] * channels + c) * hist + hist;  // + p reads stream position p < 0
      if (t > 0 && i > 0 && row_pos[i - 1] == t - 1) {  // the row before is this sequence's previous one
        const float newest = to_float(p.x[(row0 + i) * channels + c]);
#pragma unroll
        for (int j = 0; j < kMaxConvWidth; ++j) {
          // (The guard on j + 1 keeps every index a constant inside the array, so `in` stays in registers.)
          if (j < p.width) in[j] = j + 1 < p.width ? in[j + 1 < kMaxConvWidth ? j + 1 : j] : newest;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kMaxConvWidth; ++j) {
          if (j < p.width) {
            const int pos = t - hist + j;  // stream position of tap j, relative to the first new token
            in[j] = pos >= 0 ? to_float(p.x[(begin + pos) * channels + c]) : p.state.load(cache + pos);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kMaxConvWidth; ++j) {
        if (j < p.width) acc += taps[j] * in[j];
      }
      acc = silu(acc);
      if (p.state_inline) {  // t == 0: the cache becomes the window's last W-1 inputs
#pragma unroll
        for (int j = 1; j < kMaxConvWidth; ++j) {
          if (j < p.width) p.state.store(cache - hist + j - 1, in[j]);
        }
      }
    }
    p.y[(row0 + i) * channels + c] = __float2bfloat16_rn(acc);
  }
}

// A thread per (sequence, channel): the cache becomes the last W-1 inputs of [cache | new inputs]. Every new
// value is read before any is written, so a sequence with fewer than W-1 new tokens shifts its old inputs
// correctly in place.
template <class XT>
__global__ void __launch_bounds__(kConvThreads) short_conv_state_kernel(ShortConvParams<XT> p) {
  pdl_wait();
  pdl_trigger();
  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  const Span span = load_span(p.table, blockIdx.y);
  if (c >= p.channels || span.count <= 0 || span.slot < 0) return;
  const int64_t channels = p.channels;
  const int hist = p.width - 1;
  const int64_t cache = (span.slot * channels + c) * hist;
  float next[kMaxConvWidth - 1];
#pragma unroll
  for (int i = 0; i < kMaxConvWidth - 1; ++i) {
    if (i < hist) {
      const int pos = span.count + i - hist;  // stream position relative to the first new token
      next[i] = pos >= 0 ? to_float(p.x[(span.begin + static_cast<int64_t>(pos)) * channels + c])
                         : p.state.load(cache + span.count + i);
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxConvWidth - 1; ++i) {
    if (i < hist) p.state.store(cache + i, next[i]);
  }
}

template <class XT>
void launch_short_conv(const ShortConvParams<XT>& p, cudaStream_t stream) {
  const dim3 conv_grid(blocks_for(p.channels, kConvThreads), blocks_for(p.rows, p.rows_per_cta));
  launch_pdl(short_conv_kernel<XT>, conv_grid, kConvThreads, 0, stream, p);
  HLM_CHECK_LAUNCH("short_conv_kernel");
  if (p.num_spans == 0 || p.width == 1 || p.state_inline) return;  // no cache, or rewritten above
  const dim3 state_grid(blocks_for(p.channels, kConvThreads), p.num_spans);
  launch_pdl(short_conv_state_kernel<XT>, state_grid, kConvThreads, 0, stream, p);
  HLM_CHECK_LAUNCH("short_conv_state_kernel");
}

constexpr int kGateThreads = 256;
constexpr int kGateRows = 16;  // rows per CTA of kda_gate_kernel

template <class GT>
struct KdaGateParams {
  const GT* graw;   // [T, H*K]
  FloatIn a_log;    // [H]
  FloatIn dt_bias;  // [H*K]
  float* g;         // [T, H*K]
  int64_t rows;     // T
  int width;        // H*K
  int head_dim;     // K
  float lower_bound;
};

// Grid (H*K / 256, T / kGateRows): a thread per column and kGateRows rows, so that the column's dt_bias and
// exp(a_log) are loaded and computed once, and all the rows' inputs are loaded before the first output is
// stored. Measured with ncu on an H200, an 8K-token prefill chunk of the 48B model: 92 µs per layer, where
// one thread per element, with a 64-bit index taken modulo the width for its column, took 168 µs (1.2 TB/s).
template <class GT>
__global__ void __launch_bounds__(kGateThreads) kda_gate_kernel(KdaGateParams<GT> p) {
  pdl_wait();
  pdl_trigger();
  const int c = blockIdx.x * kGateThreads + threadIdx.x;
  if (c >= p.width) return;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kGateRows;
  const float bias = p.dt_bias.load(c), rate = expf(p.a_log.load(c / p.head_dim));
  float z[kGateRows];
#pragma unroll
  for (int u = 0; u < kGateRows; ++u) {
    const int64_t r = row0 + u;
    z[u] = r < p.rows ? to_float(p.graw[r * p.width + c]) : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < kGateRows; ++u) {
    const int64_t r = row0 + u;
    if (r < p.rows) p.g[r * p.width + c] = kda_gate_value(z[u] + bias, rate, p.lower_bound);
  }
}

template <class GT>
void launch_kda_gate(const KdaGateParams<GT>& p, cudaStream_t stream) {
  const dim3 grid(blocks_for(p.width, kGateThreads), blocks_for(p.rows, kGateRows));
  launch_pdl(kda_gate_kernel<GT>, grid, kGateThreads, 0, stream, p);
  HLM_CHECK_LAUNCH("kda_gate_kernel");
}

constexpr int kNormThreads = 256;
constexpr int kNormRowsPerBlock = kNormThreads / 32;

template <class OT, class GT>
struct GatedRmsNormParams {
  const OT* o;       // [T*H, V]
  const GT* gate;    // [T*H, V]
  FloatIn w;         // [V]
  __nv_bfloat16* y;  // [T*H, V]
  int64_t rows;
  int dim;
  float eps;
};

// A warp per (token, head) row: the sum of squares is a warp reduction and the second pass re-reads the
// row from L1, so any V works with no shared memory.
template <class OT, class GT>
__global__ void __launch_bounds__(kNormThreads) gated_rms_norm_kernel(GatedRmsNormParams<OT, GT> p) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kNormRowsPerBlock + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const OT* o = p.o + row * p.dim;
  const GT* gate = p.gate + row * p.dim;
  float sum_sq = 0.0f;
  for (int i = lane; i < p.dim; i += 32) {
    const float x = to_float(o[i]);
    sum_sq += x * x;
  }
  sum_sq = warp_sum(sum_sq);
  const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(p.dim) + p.eps);
  for (int i = lane; i < p.dim; i += 32) {
    // Weight before gate, no (1 + w), sigmoid gate (docs/MODEL.md §5.7).
    const float value = p.w.load(i) * (to_float(o[i]) * inv) * logistic(to_float(gate[i]));
    p.y[row * p.dim + i] = __float2bfloat16_rn(value);
  }
}

template <class OT, class GT>
void launch_gated_rms_norm(const GatedRmsNormParams<OT, GT>& p, cudaStream_t stream) {
  launch_pdl(gated_rms_norm_kernel<OT, GT>, blocks_for(p.rows, kNormRowsPerBlock), kNormThreads, 0, stream,
             p);
  HLM_CHECK_LAUNCH("gated_rms_norm_kernel");
}

}  // namespace

Tensor short_conv(CudaContext& ctx, const Tensor& x, const Tensor& w, const SeqBatch& seqs, Tensor& state) {
  const char* op = "short_conv";
  expect_cuda(x, op, "x", {DType::kBF16, DType::kF32}, 2, "[T, C]");
  expect_cuda(w, op, "w", {DType::kBF16, DType::kF32}, 2, "[C, W]");
  expect_cuda(state, op, "state", {DType::kBF16, DType::kF32}, 3, "[slots, C, W-1]");
  const int64_t rows = x.dim(0), channels = x.dim(1), width = w.dim(1);
  expect_dim(w, 0, channels, op, "w [C, W]", "the channel count of x [T, C]");
  HLM_CHECK(width >= 1 && width <= kMaxConvWidth, "short_conv: the kernel width of w {} must be in [1, {}]",
            w.describe(), kMaxConvWidth);
  expect_dim(state, 1, channels, op, "state [slots, C, W-1]", "the channel count of x [T, C]");
  expect_dim(state, 2, width - 1, op, "state [slots, C, W-1]", "the kernel width of w [C, W] minus 1");
  HLM_CHECK(channels <= INT32_MAX, "short_conv: {} channels exceed the kernel's int range", channels);
  HLM_CHECK(blocks_for(rows, kConvRows) <= 65535u, "short_conv: {} rows exceed the grid ({} at most)", rows,
            int64_t{65535} * kConvRows);
  check_seq_batch(seqs, rows, state.dim(0), op);

  Tensor y = ctx.empty({rows, channels}, DType::kBF16);  // [T, C]
  if (rows == 0 || channels == 0) return y;
  // A captured decode step replays with other spans in the device table, but still at most one new token
  // per sequence (decode graphs take no other steps), so the host spans decide for every replay.
  const bool single_tokens =
      std::all_of(seqs.spans.begin(), seqs.spans.end(), [](const SeqSpan& s) { return s.token_count <= 1; });
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using XT = typename decltype(tag)::type;
    const ShortConvParams<XT> p{static_cast<const XT*>(x.raw()),
                                float_in(w),
                                float_in_out(state),
                                seqs.table.data<int32_t>(),
                                static_cast<__nv_bfloat16*>(y.raw()),
                                rows,
                                static_cast<int>(channels),
                                static_cast<int>(width),
                                static_cast<int>(seqs.spans.size()),
                                single_tokens,
                                single_tokens ? 1 : kConvRows};
    launch_short_conv(p, ctx.stream());
  });
  return y;
}

Tensor kda_gate(CudaContext& ctx, const Tensor& graw, const Tensor& a_log, const Tensor& dt_bias,
                float lower_bound) {
  const char* op = "kda_gate";
  expect_cuda(graw, op, "graw", {DType::kBF16, DType::kF32}, 2, "[T, H*K]");
  expect_cuda(a_log, op, "a_log", {DType::kF32, DType::kBF16}, 1, "[H]");
  expect_cuda(dt_bias, op, "dt_bias", {DType::kF32, DType::kBF16}, 1, "[H*K]");
  const int64_t rows = graw.dim(0), width = graw.dim(1), heads = a_log.dim(0);
  HLM_CHECK(heads > 0 && width % heads == 0,
            "kda_gate: the width {} of graw [T, H*K] must be a multiple of the head count {} of a_log [H]",
            width, heads);
  expect_dim(dt_bias, 0, width, op, "dt_bias [H*K]", "the width of graw [T, H*K]");
  HLM_CHECK(lower_bound <= 0.0f,
            "kda_gate: lower_bound must be 0 (softplus gate) or negative (bounded gate), got {}",
            lower_bound);
  HLM_CHECK(width <= INT32_MAX, "kda_gate: width {} exceeds the kernel's int range", width);
  HLM_CHECK(blocks_for(rows, kGateRows) <= 65535u, "kda_gate: {} rows exceed the grid ({} at most)", rows,
            int64_t{65535} * kGateRows);

  Tensor g = ctx.empty({rows, width}, DType::kF32);  // [T, H*K]
  if (g.numel() == 0) return g;
  dispatch_float(graw.dtype(), op, [&](auto tag) {
    using GT = typename decltype(tag)::type;
    const KdaGateParams<GT> p{static_cast<const GT*>(graw.raw()),
                              float_in(a_log),
                              float_in(dt_bias),
                              g.data<float>(),
                              rows,
                              static_cast<int>(width),
                              static_cast<int>(width / heads),
                              lower_bound};
    launch_kda_gate(p, ctx.stream());
  });
  return g;
}

Tensor gated_rms_norm(CudaContext& ctx, const Tensor& o, const Tensor& gate, const Tensor& w, float eps) {
  const char* op = "gated_rms_norm";
  expect_cuda(o, op, "o", {DType::kBF16, DType::kF32}, 3, "[T, H, V]");
  expect_cuda(gate, op, "gate", {DType::kBF16, DType::kF32}, 3, "[T, H, V]");
  expect_same_shape(o, gate, op, "o [T, H, V]", "gate");
  expect_cuda(w, op, "w", {DType::kBF16, DType::kF32}, 1, "[V]");
  expect_dim(w, 0, o.dim(2), op, "w [V]", "the head dimension of o [T, H, V]");
  HLM_CHECK(o.dim(2) <= INT32_MAX, "gated_rms_norm: head dimension {} exceeds the kernel's int range",
            o.dim(2));
  const int64_t rows = o.dim(0) * o.dim(1);
  HLM_CHECK(blocks_for(rows, kNormRowsPerBlock) <= static_cast<unsigned>(INT32_MAX),
            "gated_rms_norm: {} rows exceed the grid", rows);

  Tensor y = ctx.empty(o.shape(), DType::kBF16);  // [T, H, V]
  if (y.numel() == 0) return y;
  dispatch_float(o.dtype(), op, [&](auto o_tag) {
    dispatch_float(gate.dtype(), op, [&](auto gate_tag) {
      using OT = typename decltype(o_tag)::type;
      using GT = typename decltype(gate_tag)::type;
      const GatedRmsNormParams<OT, GT> p{static_cast<const OT*>(o.raw()),
                                         static_cast<const GT*>(gate.raw()),
                                         float_in(w),
                                         static_cast<__nv_bfloat16*>(y.raw()),
                                         rows,
                                         static_cast<int>(o.dim(2)),
                                         eps};
      launch_gated_rms_norm(p, ctx.stream());
    });
  });
  return y;
}

}  // namespace hlm::cuda
