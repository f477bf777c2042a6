// The LL16 one-shot kernels (protocol in ll_kernels.h). Each kernel runs in two phases over a grid-stride
// loop: push (read this rank's data, store LL16 lines into the peers' buffers of the call's set) and
// receive (poll this rank's buffer, combine in rank order, write the output), then the last CTA to finish
// advances the call number. Data may have any alignment and any byte length: whole 8-byte words go as one
// load or store, the ragged tail and misaligned words byte by byte.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "base/cuda_check.h"
#include "parallel/cuda/ll_kernels.h"

namespace hlm::ll {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr uint32_t kPollsPerClockCheck = 1024;  // volatile polls between deadline checks

// --- LL16 lines ---------------------------------------------------------------------------------------
__device__ __forceinline__ void store_line(Line* p, uint2 v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(flag), "r"(v.y),
               "r"(flag)
               : "memory");
}

__device__ __forceinline__ Line load_line(const Line* p) {
  Line l;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(l.data0), "=r"(l.flag0), "=r"(l.data1), "=r"(l.flag1)
               : "l"(p)
               : "memory");
  return l;
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// --- payload words ------------------------------------------------------------------------------------
// Bytes [off, off + 8) of a buffer of `total` bytes, zero past its end.
__device__ __forceinline__ uint2 load8(const void* base, int64_t off, int64_t total) {
  const auto* p = static_cast<const unsigned char*>(base) + off;
  const int64_t valid = total - off;
  if (valid >= 8 && (reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint2*>(p);
  uint64_t w = 0;
  for (int k = 0; k < 8 && k < valid; ++k) w |= static_cast<uint64_t>(p[k]) << (8 * k);
  return make_uint2(static_cast<uint32_t>(w), static_cast<uint32_t>(w >> 32));
}

// Writes the bytes of v that fall inside a buffer of `total` bytes at [off, off + 8).
__device__ __forceinline__ void store8(void* base, int64_t off, int64_t total, uint2 v) {
  auto* p = static_cast<unsigned char*>(base) + off;
  const int64_t valid = total - off;
  if (valid >= 8 && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    *reinterpret_cast<uint2*>(p) = v;
    return;
  }
  const uint64_t w = static_cast<uint64_t>(v.x) | static_cast<uint64_t>(v.y) << 32;
  for (int k = 0; k < 8 && k < valid; ++k) p[k] = static_cast<unsigned char>(w >> (8 * k));
}

// --- calls --------------------------------------------------------------------------------------------
struct Call {
  uint64_t number;
  uint32_t flag;
  int set;
  bool failed;  // a wait of an earlier call gave up: this one waits for nothing
};

__device__ __forceinline__ Call begin_call(const ChannelView& ch) {
  const uint64_t c = ch.state->calls;
  const bool failed = *reinterpret_cast<volatile int*>(ch.error.device_code) != 0;
  return Call{c, 2u + static_cast<uint32_t>(c % ch.period), static_cast<int>(c & 1), failed};
}

// Slot `member` of set `set` in a receive buffer.
__device__ __forceinline__ Line* slot(Line* buffer, const ChannelView& ch, int set, int member) {
  return buffer + (static_cast<int64_t>(set) * ch.n + member) * ch.slot_lines;
}

__device__ void give_up(const ChannelView& ch, CallKind kind, int peer) {
  const int code = kErrorBit | static_cast<int>(kind) << 16 | ch.group << 8 | peer;
  if (atomicCAS(ch.error.device_code, 0, code) == 0) {
    *ch.error.host_code = code;
    __threadfence_system();
  }
}

// Polls `line` until it carries the call's flag and returns its data; zeros once this rank has given up
// (here at the deadline, or in any earlier wait), so that a failed call drains instead of hanging.
__device__ uint2 wait_line(const Line* line, const Call& call, const ChannelView& ch, CallKind kind,
                           int peer) {
  if (call.failed) return make_uint2(0, 0);
  uint64_t start = 0;
  for (uint32_t polls = 1;; ++polls) {
    const Line v = load_line(line);
    if (v.flag0 == call.flag && v.flag1 == call.flag) return make_uint2(v.data0, v.data1);
    if (polls % kPollsPerClockCheck != 0) continue;
    if (*reinterpret_cast<volatile int*>(ch.error.device_code) != 0) return make_uint2(0, 0);
    const uint64_t now = global_ns();
    if (start == 0) {
      start = now;
    } else if (now - start > static_cast<uint64_t>(*ch.error.timeout_ns)) {
      give_up(ch, kind, peer);
      return make_uint2(0, 0);
    }
  }
}

// The last CTA to get here (all lines of the call have then arrived and been read) zeroes the call's set
// at the end of a flag period and advances the call number for the next launch.
__device__ void finish_call(const ChannelView& ch, const Call& call) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&ch.state->done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  if (call.number % ch.period >= ch.period - 2) {
    Line* set = slot(ch.recv, ch, call.set, 0);
    const int64_t lines = ch.n * ch.slot_lines;
    for (int64_t i = threadIdx.x; i < lines; i += blockDim.x) set[i] = Line{0, 0, 0, 0};
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    ch.state->done = 0;
    ch.state->calls = call.number + 1;
  }
}

__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// --- all-reduce ---------------------------------------------------------------------------------------
// The four bf16 or two f32 values of a payload word, in memory order (little-endian halves).
__device__ __forceinline__ void unpack(uint2 w, bool bf16, float (&x)[4]) {
  if (bf16) {
    x[0] = __uint_as_float(w.x << 16);
    x[1] = __uint_as_float(w.x & 0xffff0000u);
    x[2] = __uint_as_float(w.y << 16);
    x[3] = __uint_as_float(w.y & 0xffff0000u);
  } else {
    x[0] = __uint_as_float(w.x);
    x[1] = __uint_as_float(w.y);
    x[2] = x[3] = 0.0f;
  }
}

__device__ __forceinline__ uint2 pack(const float (&x)[4], bool bf16) {
  if (!bf16) return make_uint2(__float_as_uint(x[0]), __float_as_uint(x[1]));
  uint32_t h[4];
  for (int k = 0; k < 4; ++k) h[k] = __bfloat16_as_ushort(__float2bfloat16_rn(x[k]));
  return make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
}

// Thread t owns payload words t, t + threads, ...: it pushes them to every peer, then sums each word's
// values over members 0..n-1 (its own from the input) in fp32 and writes the word of the output.
__global__ void __launch_bounds__(kThreads) all_reduce_kernel(const AllReduceParams p) {
  const ChannelView& ch = p.ch;
  const Call call = begin_call(ch);
  const int64_t lines = ll_lines(p.bytes);
  for (int64_t i = thread_index(); i < lines; i += thread_count()) {
    const uint2 v = load8(p.in, 8 * i, p.bytes);
    for (int k = 1; k < ch.n; ++k) {
      const int peer = (ch.me + k) % ch.n;
      store_line(slot(ch.peer_recv[peer], ch, call.set, ch.me) + i, v, call.flag);
    }
  }
  for (int64_t i = thread_index(); i < lines; i += thread_count()) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, x[4];
    for (int r = 0; r < ch.n; ++r) {
      const uint2 v = r == ch.me
                          ? load8(p.in, 8 * i, p.bytes)
                          : wait_line(slot(ch.recv, ch, call.set, r) + i, call, ch, CallKind::kAllReduce, r);
      unpack(v, p.bf16, x);
      for (int k = 0; k < 4; ++k) acc[k] = r == 0 ? x[k] : acc[k] + x[k];
    }
    store8(p.out, 8 * i, p.bytes, pack(acc, p.bf16));
  }
  finish_call(ch, call);
}

// --- all-to-all ---------------------------------------------------------------------------------------
// Thread t owns payload words t, t + threads, ... of every chunk: it pushes word i of chunk j to member j,
// then collects word i of every member's chunk (its own copied from the input).
__global__ void __launch_bounds__(kThreads) all_to_all_kernel(const AllToAllParams p) {
  const ChannelView& ch = p.ch;
  const Call call = begin_call(ch);
  const int64_t lines = ll_lines(p.chunk);
  const auto* in = static_cast<const unsigned char*>(p.in);
  auto* out = static_cast<unsigned char*>(p.out);
  for (int64_t i = thread_index(); i < lines; i += thread_count()) {
    for (int k = 1; k < ch.n; ++k) {
      const int peer = (ch.me + k) % ch.n;
      const uint2 v = load8(in + peer * p.chunk, 8 * i, p.chunk);
      store_line(slot(ch.peer_recv[peer], ch, call.set, ch.me) + i, v, call.flag);
    }
  }
  for (int64_t i = thread_index(); i < lines; i += thread_count()) {
    for (int r = 0; r < ch.n; ++r) {
      const uint2 v = r == ch.me
                          ? load8(in + r * p.chunk, 8 * i, p.chunk)
                          : wait_line(slot(ch.recv, ch, call.set, r) + i, call, ch, CallKind::kAllToAll, r);
      store8(out + r * p.chunk, 8 * i, p.chunk, v);
    }
  }
  finish_call(ch, call);
}

// --- all-to-all fused with the LSE combine ------------------------------------------------------------
// The message to member j: line l < rows is row l's stats (max, sum) of slice j; line rows + q is payload
// word q of slice j's parts (row q / (v/2), columns 2·(q % (v/2)) + {0, 1}). Push as above; then one warp
// per output row: every lane forms the weights w_r = s_r·exp(m_r − M) / Σ from the n stats lines (in rank
// order, as Ops::lse_combine), and lane l accumulates columns 2k, 2k + 1 for k = l, l + 32, ... over
// sources 0..n-1. Sources of weight 0 (no keys: (-inf, 0)) add nothing; a row without keys anywhere is 0.
__global__ void __launch_bounds__(kThreads) all_to_all_combine_kernel(const AllToAllCombineParams p) {
  const ChannelView& ch = p.ch;
  const Call call = begin_call(ch);
  const int half = p.v_dim / 2;
  const int64_t rows = p.rows, lines = combine_lines(rows, p.v_dim);
  const int64_t stats_bytes = rows * 8, parts_bytes = rows * p.v_dim * 4;
  auto stats_of = [&](int r) { return p.stats + static_cast<int64_t>(r) * rows * 2; };
  auto parts_of = [&](int r) { return p.parts + static_cast<int64_t>(r) * rows * p.v_dim; };
  for (int64_t l = thread_index(); l < lines; l += thread_count()) {
    for (int k = 1; k < ch.n; ++k) {
      const int peer = (ch.me + k) % ch.n;
      const uint2 v = l < rows ? load8(stats_of(peer), 8 * l, stats_bytes)
                               : load8(parts_of(peer), 8 * (l - rows), parts_bytes);
      store_line(slot(ch.peer_recv[peer], ch, call.set, ch.me) + l, v, call.flag);
    }
  }
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t row = blockIdx.x * kWarps + threadIdx.x / 32; row < rows; row += warps) {
    // Lane r < n fetches source r's stats; every lane then reads all of them in rank order.
    uint2 mine = make_uint2(0, 0);
    if (lane < ch.n) {
      mine = lane == ch.me ? load8(stats_of(lane), 8 * row, stats_bytes)
                           : wait_line(slot(ch.recv, ch, call.set, lane) + row, call, ch,
                                       CallKind::kAllToAllCombine, lane);
    }
    float m[kMaxRanks], w[kMaxRanks];
    float global_max = -INFINITY;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      m[r] = __uint_as_float(__shfl_sync(0xffffffffu, mine.x, r));
      w[r] = __uint_as_float(__shfl_sync(0xffffffffu, mine.y, r));  // the sum s_r, made a weight below
      if (r < ch.n) global_max = fmaxf(global_max, m[r]);
    }
    float denom = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      w[r] = r < ch.n && global_max != -INFINITY ? w[r] * expf(m[r] - global_max) : 0.0f;
      denom += w[r];
    }
    const bool empty = !(denom > 0.0f);
    float* out_row = p.out + row * p.v_dim;
    for (int k = lane; k < half; k += 32) {
      const int64_t word = row * half + k;
      float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxRanks; ++r) {
        if (r >= ch.n) break;
        const uint2 v = r == ch.me ? load8(parts_of(r), 8 * word, parts_bytes)
                                   : wait_line(slot(ch.recv, ch, call.set, r) + rows + word, call, ch,
                                               CallKind::kAllToAllCombine, r);
        if (w[r] != 0.0f) {
          a0 += w[r] / denom * __uint_as_float(v.x);
          a1 += w[r] / denom * __uint_as_float(v.y);
        }
      }
      if (empty) a0 = a1 = 0.0f;
      store8(out_row, 8 * k, 4 * static_cast<int64_t>(p.v_dim),
             make_uint2(__float_as_uint(a0), __float_as_uint(a1)));
    }
  }
  finish_call(ch, call);
}

unsigned grid_for(int64_t threads_wanted, int max_ctas) {
  const int64_t ctas = (threads_wanted + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(ctas, 1, max_ctas));
}

}  // namespace

void launch_all_reduce(const AllReduceParams& p, cudaStream_t stream) {
  const int64_t lines = ll_lines(p.bytes);
  if (lines == 0) return;
  all_reduce_kernel<<<grid_for(lines, p.ch.max_ctas), kThreads, 0, stream>>>(p);
  HLM_CHECK_LAUNCH("ll all_reduce");
}

void launch_all_to_all(const AllToAllParams& p, cudaStream_t stream) {
  const int64_t lines = ll_lines(p.chunk);
  if (lines == 0) return;
  all_to_all_kernel<<<grid_for(lines, p.ch.max_ctas), kThreads, 0, stream>>>(p);
  HLM_CHECK_LAUNCH("ll all_to_all");
}

void launch_all_to_all_combine(const AllToAllCombineParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  const int64_t threads = std::max(combine_lines(p.rows, p.v_dim), p.rows * 32);
  all_to_all_combine_kernel<<<grid_for(threads, p.ch.max_ctas), kThreads, 0, stream>>>(p);
  HLM_CHECK_LAUNCH("ll all_to_all_combine");
}

}  // namespace hlm::ll
