// The element-wise parts of a KDA layer around the recurrent core (docs/MODEL.md §5.2, §5.3, §5.7), the same
// functions as ops/cpu/kda_conv_gate.cc: the causal depthwise short conv with its per-slot cache of raw
// inputs, the forget gate in log space, and the sigmoid-gated RMSNorm of the core output. fp32 math; all
// three are memory-bound streams (about 2 B in and 2 B out per element for the conv, 2 in and 4 out for the
// gate, 4 in and 2 out for the norm), so each is one coalesced pass with no shared-memory staging.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kda_common.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {
namespace {

constexpr int kMaxConvWidth = 8;  // the models use 4
constexpr int kConvRows = 32;     // rows of the batch per CTA of short_conv_kernel, at most
constexpr int kConvVec = 4;       // channels per thread of the vector kernel: one 8-byte load of bf16
constexpr int kConvVecWidth = 4;  // the kernel width of the vector kernel (both models' width)
// Threads per CTA, and rows whose inputs a thread loads before it computes the first of them. The vector
// kernel's registers decide how many warps hide its loads (ncu, 8K prefill chunk, per layer): 8 channels per
// thread in 167 registers, three 128-thread CTAs per SM, 218 µs; 4 channels in 128 registers, 205 µs; 4 in
// 96 (five CTAs per SM, 20 bytes spilled), 181 µs.
constexpr int conv_threads(int vec) { return vec == 1 ? 256 : 128; }
constexpr int conv_ahead(int vec) { return vec == 1 ? 4 : 8; }
// CTAs per SM the register budget is sized for (above); five of the width-4 kernel of a channel per thread
// keep its 48 registers (a decode step's conv is waves of small CTAs; at 62 registers, four per SM, it took
// 17 µs per layer at batch 64 against 15).
constexpr int conv_min_blocks(int vec, int width) { return vec > 1 ? 5 : width <= 4 ? 5 : 1; }

template <class XT>
struct ShortConvParams {
  const XT* x;           // [T, C] raw projected inputs
  FloatIn w;             // [C, W]
  FloatInOut state;      // [slots, C, W-1] the last W-1 raw inputs of each slot
  const int32_t* table;  // [S, 3]
  __nv_bfloat16* y;      // [planes, T, C / planes]: column block p of the conv's [T, C] output is plane p
  int64_t rows;
  int channels;
  int plane_channels;  // C / planes
  int width;
  int num_spans;
  bool state_inline;  // every sequence has at most one new token: short_conv_kernel rewrites the cache
  int rows_per_cta;   // <= kConvRows
};

// A CTA takes rows_per_cta consecutive rows and conv_threads(kVec) · kVec channels; a thread owns kVec
// consecutive channels (kVec = 4: one 8-byte load of bf16 per row; consecutive threads read consecutive
// channels: coalesced) and walks the rows, keeping the window of inputs in registers from one row of a
// sequence to the next, so that each row loads one new input instead of W (measured on an H200: an 8K-token
// prefill of the 48B model 21,834-21,853 -> 22,031-22,046 tokens/s). The inputs of conv_ahead(kVec) rows
// are loaded, raw and unconditionally (the last row repeated past the CTA's end), before the first of them
// is used, and so are the taps and a window's rows at a CTA's or a sequence's start: a channel per thread,
// with each row's 2-byte load a round trip of its own, ran at 0.7 TB/s. A decode step takes one row per CTA:
// a thread's rows are a serial chain of cache loads, and at batch 8 walking them made the conv 12 µs against
// 4 at batch 1 (ncu, 48B config). Which sequence each row belongs to comes from one scan of the span table
// per CTA (S is small), so rows outside every span are found on the device and written as zeros, as graphs
// require. Taps before a sequence's first new token read the cached inputs; the cache is rewritten
// afterwards by short_conv_state_kernel, because the first W-1 rows of a sequence can fall in two CTAs that
// both read the old cache. With one new token per sequence (a decode step) the thread that reads a (slot,
// channel) cache is its only reader, so it rewrites it right after the conv and the second launch is skipped
// (state_inline). kW is the widest kernel the instance takes (p.width <= kW; == kW when kVec > 1).
template <class XT, int kVec, int kW>
__global__ void __launch_bounds__(conv_threads(kVec), conv_min_blocks(kVec, kW))
    short_conv_kernel(ShortConvParams<XT> p) {
  constexpr int kThreads = conv_threads(kVec), kAhead = conv_ahead(kVec);
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

  const int c = (blockIdx.x * kThreads + threadIdx.x) * kVec;  // the thread's first channel
  if (c >= p.channels) return;
  const int64_t channels = p.channels;
  const int hist = p.width - 1;
  float taps[kW][kVec];
  if constexpr (kVec >
                1) {  // p.width == kW: rows c .. c + kVec - 1 of w [C, W] are kVec · kW consecutive taps
    float flat[kVec * kW];
    if (p.w.bf16) {
      load_floats(static_cast<const __nv_bfloat16*>(p.w.p) + static_cast<int64_t>(c) * kW, flat);
    } else {
      load_floats(static_cast<const float*>(p.w.p) + static_cast<int64_t>(c) * kW, flat);
    }
#pragma unroll
    for (int j = 0; j < kW; ++j) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) taps[j][v] = flat[v * kW + j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < kW; ++j)
      taps[j][0] = j < p.width ? p.w.load(c * static_cast<int64_t>(p.width) + j) : 0.0f;
  }
  const int plane = c / p.plane_channels;  // kVec divides plane_channels: the thread's channels share it
  __nv_bfloat16* y =
      p.y + plane * p.rows * p.plane_channels + (c - plane * p.plane_channels);  // + row · C/planes

  const int rows_here = static_cast<int>(min(static_cast<int64_t>(p.rows_per_cta), p.rows - row0));
  float in[kW][kVec] = {};  // the window of the row before, when it was this sequence's previous row
  for (int i0 = 0; i0 < rows_here; i0 += kAhead) {
    RawVec<XT, kVec> ahead[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) ahead[u].load(p.x + (row0 + min(i0 + u, rows_here - 1)) * channels + c);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int i = i0 + u;
      if (i >= rows_here) break;
      const int t = row_pos[i];
      float acc[kVec] = {};
      if (t >= 0) {
        const int64_t begin = row0 + i - t;  // the sequence's first new row
        const int64_t cache =
            (row_slot[i] * channels + c) * hist + hist;   // + v · hist + p: channel c + v, position p < 0
        if (t > 0 && i > 0 && row_pos[i - 1] == t - 1) {  // the row before is this sequence's previous one
          float newest[kVec];
          ahead[u].to_floats(newest);
#pragma unroll
          for (int j = 0; j < kW; ++j) {
            // (The guard on j + 1 keeps every index a constant inside the array, so `in` stays in registers.)
#pragma unroll
            for (int v = 0; v < kVec; ++v) {
              if (j < p.width) in[j][v] = j + 1 < p.width ? in[j + 1 < kW ? j + 1 : j][v] : newest[v];
            }
          }
        } else {
          // The window's rows, loaded together: those before the sequence (taken from the cache) and taps
          // past the width load rows of the sequence that exist, and are not used.
          RawVec<XT, kVec> raw[kW];
#pragma unroll
          for (int j = 0; j < kW; ++j)
            raw[j].load(p.x + (begin + max(t - hist + min(j, hist), 0)) * channels + c);
#pragma unroll
          for (int j = 0; j < kW; ++j) {
            const int pos = t - hist + j;  // stream position of tap j, relative to the first new token
            float f[kVec];
            raw[j].to_floats(f);
#pragma unroll
            for (int v = 0; v < kVec; ++v) {
              if (j < p.width) in[j][v] = pos >= 0 ? f[v] : p.state.load(cache + v * hist + pos);
            }
          }
        }
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
#pragma unroll
          for (int j = 0; j < kW; ++j) {
            if (j < p.width) acc[v] += taps[j][v] * in[j][v];
          }
          acc[v] = silu_fast(acc[v]);
        }
        if (p.state_inline) {  // t == 0: the cache becomes the window's last W-1 inputs
#pragma unroll
          for (int j = 1; j < kW; ++j) {
#pragma unroll
            for (int v = 0; v < kVec; ++v) {
              if (j < p.width) p.state.store(cache + v * hist - hist + j - 1, in[j][v]);
            }
          }
        }
      }
      store_floats(y + (row0 + i) * p.plane_channels, acc);
    }
  }
}

constexpr int kStateThreads = 256;

// A thread per (sequence, channel): the cache becomes the last W-1 inputs of [cache | new inputs]. Every new
// value is read before any is written, so a sequence with fewer than W-1 new tokens shifts its old inputs
// correctly in place.
template <class XT>
__global__ void __launch_bounds__(kStateThreads) short_conv_state_kernel(ShortConvParams<XT> p) {
  pdl_wait();
  pdl_trigger();
  const int c = blockIdx.x * kStateThreads + threadIdx.x;
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
  const unsigned row_blocks = blocks_for(p.rows, p.rows_per_cta);
  // Rows and plane starts stay aligned to a thread's vector when the bases are 16-byte aligned and a plane's
  // width is a multiple of kConvVec.
  // Decode steps (a row per CTA) keep a channel per thread: with 8, a thread's serial chain of cache loads
  // and stores is 8 times longer.
  const bool vec = std::is_same_v<XT, __nv_bfloat16> && p.rows_per_cta > 1 && p.width == kConvVecWidth &&
                   p.plane_channels % kConvVec == 0 && aligned16(p.x) && aligned16(p.y) && aligned16(p.w.p);
  if constexpr (std::is_same_v<XT, __nv_bfloat16>) {
    if (vec) {
      constexpr int threads = conv_threads(kConvVec);
      launch_pdl(short_conv_kernel<XT, kConvVec, kConvVecWidth>,
                 dim3(blocks_for(p.channels, threads * kConvVec), row_blocks), threads, 0, stream, p);
    }
  }
  if (!vec) {
    // The models' width 4 keeps the window in 4 registers where up to 8 would be.
    const dim3 grid(blocks_for(p.channels, conv_threads(1)), row_blocks);
    if (p.width <= kConvVecWidth) {
      launch_pdl(short_conv_kernel<XT, 1, kConvVecWidth>, grid, conv_threads(1), 0, stream, p);
    } else {
      launch_pdl(short_conv_kernel<XT, 1, kMaxConvWidth>, grid, conv_threads(1), 0, stream, p);
    }
  }
  HLM_CHECK_LAUNCH("short_conv_kernel");
  if (p.num_spans == 0 || p.width == 1 || p.state_inline) return;  // no cache, or rewritten above
  const dim3 state_grid(blocks_for(p.channels, kStateThreads), p.num_spans);
  launch_pdl(short_conv_state_kernel<XT>, state_grid, kStateThreads, 0, stream, p);
  HLM_CHECK_LAUNCH("short_conv_state_kernel");
}

constexpr int kGateThreads = 256;
constexpr int kGateRows = 16;  // rows per CTA of kda_gate_kernel, where the batch has enough of them
constexpr int kGateVec = 4;    // columns per thread of the vector kernel: 16-byte stores of the F32 output

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

// Grid (H*K / (256 · kVec), T / kRows): a thread takes kVec consecutive columns and kRows rows, so that the
// columns' dt_bias and exp(a_log) are loaded and computed once, and the rows' inputs are loaded, raw and
// unconditionally (the last row repeated past the end), before the first output is computed. Measured with
// ncu on an H200, an 8K-token prefill chunk of the 48B model, per layer: a thread per element, with a 64-bit
// index taken modulo the width for its column, 168 µs (1.2 TB/s); a thread per column and 16 rows, each
// row's load converted inside its guard, 92 µs; 4 columns and 16 rows as here, 73 µs (2.65 TB/s).
template <class GT, int kVec, int kRows>
__global__ void __launch_bounds__(kGateThreads) kda_gate_kernel(KdaGateParams<GT> p) {
  pdl_wait();
  pdl_trigger();
  const int c = (blockIdx.x * kGateThreads + threadIdx.x) * kVec;
  if (c >= p.width) return;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRows;
  float bias[kVec], rate[kVec];
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    bias[v] = p.dt_bias.load(c + v);
    rate[v] = expf(p.a_log.load((c + v) / p.head_dim));
  }
  RawVec<GT, kVec> z[kRows];
#pragma unroll
  for (int u = 0; u < kRows; ++u) z[u].load(p.graw + min(row0 + u, p.rows - 1) * p.width + c);
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    if (row0 + u >= p.rows) break;
    float g[kVec];
    z[u].to_floats(g);
#pragma unroll
    for (int v = 0; v < kVec; ++v) g[v] = kda_gate_value(g[v] + bias[v], rate[v], p.lower_bound);
    store_floats(p.g + (row0 + u) * p.width + c, g);
  }
}

template <class GT, int kVec, int kRows>
void launch_kda_gate_rows(const KdaGateParams<GT>& p, cudaStream_t stream) {
  const dim3 grid(blocks_for(p.width, kGateThreads * kVec), blocks_for(p.rows, kRows));
  launch_pdl(kda_gate_kernel<GT, kVec, kRows>, grid, kGateThreads, 0, stream, p);
}

template <class GT, int kVec>
void launch_kda_gate_vec(const KdaGateParams<GT>& p, int sm_count, cudaStream_t stream) {
  // kGateRows rows per CTA where that still gives every SM two CTAs; a row each in smaller batches (a
  // decode step of 64 sequences had 16 CTAs of 16 rows: 16 µs per layer, against 6 for a row per thread).
  const int64_t tall_ctas = int64_t{blocks_for(p.width, kGateThreads * kVec)} * blocks_for(p.rows, kGateRows);
  if (tall_ctas >= 2 * int64_t{sm_count}) {
    launch_kda_gate_rows<GT, kVec, kGateRows>(p, stream);
  } else {
    launch_kda_gate_rows<GT, kVec, 1>(p, stream);
  }
}

template <class GT>
void launch_kda_gate(const KdaGateParams<GT>& p, int sm_count, cudaStream_t stream) {
  if (p.width % kGateVec == 0 && aligned16(p.g) && aligned_to(p.graw, kGateVec * sizeof(GT))) {
    launch_kda_gate_vec<GT, kGateVec>(p, sm_count, stream);
  } else {
    launch_kda_gate_vec<GT, 1>(p, sm_count, stream);
  }
  HLM_CHECK_LAUNCH("kda_gate_kernel");
}

constexpr int kNormThreads = 256;
constexpr int kNormRowsPerBlock = kNormThreads / 32;
constexpr int kNormVec = 4;  // elements per lane and pass of the vector kernel

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

// A warp per (token, head) row, a lane per kVec consecutive elements and pass: the sum of squares is a warp
// reduction. The first pass's o and gate are loaded together (one round trip for a row of up to 32 · kVec
// elements, V = 128 with kVec = 4) and kept for the output; further passes (wider rows) re-read theirs from
// L1, so any V works with no shared memory.
template <class OT, class GT, int kVec>
__global__ void __launch_bounds__(kNormThreads) gated_rms_norm_kernel(GatedRmsNormParams<OT, GT> p) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kNormRowsPerBlock + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const OT* o = p.o + row * p.dim;
  const GT* gate = p.gate + row * p.dim;
  constexpr int kStride = 32 * kVec;
  const int first = lane * kVec;
  const int first_in = min(first, p.dim - kVec);  // loaded by every lane, used by those with first < dim
  RawVec<OT, kVec> o_first;
  RawVec<GT, kVec> gate_first;
  o_first.load(o + first_in);
  gate_first.load(gate + first_in);
  float x_first[kVec];
  o_first.to_floats(x_first);
  float sum_sq = 0.0f;
  if (first < p.dim) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum_sq += x_first[e] * x_first[e];
  }
  auto load_o = [&](int i, float(&x)[kVec]) {
    RawVec<OT, kVec> raw;
    raw.load(o + i);
    raw.to_floats(x);
  };
  for (int i = first + kStride; i < p.dim; i += kStride) {
    float x[kVec];
    load_o(i, x);
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum_sq += x[e] * x[e];
  }
  sum_sq = warp_sum(sum_sq);
  const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(p.dim) + p.eps);
  // Weight before gate, no (1 + w), sigmoid gate (docs/MODEL.md §5.7).
  auto store = [&](int i, const float(&x)[kVec], const RawVec<GT, kVec>& gate_raw) {
    float g[kVec], value[kVec];
    gate_raw.to_floats(g);
#pragma unroll
    for (int e = 0; e < kVec; ++e) value[e] = p.w.load(i + e) * (x[e] * inv) * logistic(g[e]);
    store_floats(p.y + row * p.dim + i, value);
  };
  if (first < p.dim) store(first, x_first, gate_first);
  for (int i = first + kStride; i < p.dim; i += kStride) {
    RawVec<GT, kVec> gate_raw;
    gate_raw.load(gate + i);
    float x[kVec];
    load_o(i, x);
    store(i, x, gate_raw);
  }
}

template <class OT, class GT>
void launch_gated_rms_norm(const GatedRmsNormParams<OT, GT>& p, cudaStream_t stream) {
  const unsigned blocks = blocks_for(p.rows, kNormRowsPerBlock);
  // Row starts stay aligned to a lane's vector when the bases are and V is a multiple of kNormVec.
  const bool vec = p.dim % kNormVec == 0 && aligned_to(p.o, kNormVec * sizeof(OT)) &&
                   aligned_to(p.gate, kNormVec * sizeof(GT)) &&
                   aligned_to(p.y, kNormVec * sizeof(__nv_bfloat16));
  if (vec) {
    launch_pdl(gated_rms_norm_kernel<OT, GT, kNormVec>, blocks, kNormThreads, 0, stream, p);
  } else {
    launch_pdl(gated_rms_norm_kernel<OT, GT, 1>, blocks, kNormThreads, 0, stream, p);
  }
  HLM_CHECK_LAUNCH("gated_rms_norm_kernel");
}

}  // namespace

Tensor short_conv(CudaContext& ctx, const Tensor& x, const Tensor& w, const SeqBatch& seqs, Tensor& state,
                  int64_t planes) {
  const char* op = planes == 1 ? "short_conv" : "short_conv_planes";
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
  HLM_CHECK(planes >= 1 && channels % planes == 0,
            "{}: the channel count {} of x [T, C] must be a multiple of the plane count {}", op, channels,
            planes);
  check_seq_batch(seqs, rows, state.dim(0), op);

  Tensor y = planes == 1 ? ctx.empty({rows, channels}, DType::kBF16)                    // [T, C]
                         : ctx.empty({planes, rows, channels / planes}, DType::kBF16);  // [P, T, C/P]
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
                                static_cast<int>(channels / planes),
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
    launch_kda_gate(p, ctx.sm_count(), ctx.stream());
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
