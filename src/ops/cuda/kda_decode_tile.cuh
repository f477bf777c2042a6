// The one-token KDA recurrence as the tiled decode kernels run it (kda_decode.cu, kda_decode_layer.cu): how
// a head's [D, D] fp32 state is split over CTAs and threads, the recurrence on a thread's registers, the
// l2norm factors of q and k, and the gated RMSNorm across the CTAs of a head (a thread-block cluster).
// Both kernels keep a thread's share of the state in registers from load to store, so each state element
// is read and written exactly once.
#pragma once

#include <cooperative_groups.h>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kda_common.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

// How a decode kernel splits one head's [D, D] state: each CTA takes all D key rows of kCols value
// columns; inside it a thread owns one float4 of columns on kRows key rows strided by kRowGroups.
template <int D>
struct DecodeTile {
  static constexpr int kCols = D < 32 ? D : 32;  // value columns per CTA (one 128-byte segment per row)
  static constexpr int kSplits = D / kCols;      // CTAs per (token, head): 4 at D = 128
  static constexpr int kQuads = kCols / 4;       // threads along a row, a float4 each
  static constexpr int kRowGroups = 16;          // threads along the key rows
  static constexpr int kThreads = kQuads * kRowGroups;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRows = D / kRowGroups;  // key rows per thread: 8 float4 = 32 registers at D = 128
  static_assert(D % kCols == 0 && kCols % 4 == 0 && kThreads % 32 == 0 && D % kRowGroups == 0);
};

__device__ __forceinline__ float4 operator*(float4 a, float s) {
  return {a.x * s, a.y * s, a.z * s, a.w * s};
}
__device__ __forceinline__ float4& operator+=(float4& a, float4 b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
  return a;
}

template <class XT>
__device__ __forceinline__ float4 load4(const XT* p) {
  return {to_float(p[0]), to_float(p[1]), to_float(p[2]), to_float(p[3])};
}
__device__ __forceinline__ void store4_bf16(__nv_bfloat16* p, float4 v) {
  reinterpret_cast<__nv_bfloat162*>(p)[0] = __floats2bfloat162_rn(v.x, v.y);
  reinterpret_cast<__nv_bfloat162*>(p)[1] = __floats2bfloat162_rn(v.z, v.w);
}

// Where a thread of a decode-tile grid (kSplits, H, T) works: its CTA's head and batch row, its column
// quad and row group, the first of its 4 value columns, and the index of (row, h) in [T, H, ...].
struct DecodeThread {
  int h;
  int64_t row;
  int quad, row_group, col;
  int64_t token_head;
};
template <class Tile>
__device__ __forceinline__ DecodeThread decode_thread(int heads) {
  const int quad = threadIdx.x % Tile::kQuads;
  return {static_cast<int>(blockIdx.y),
          static_cast<int64_t>(blockIdx.z),
          quad,
          static_cast<int>(threadIdx.x / Tile::kQuads),
          static_cast<int>(blockIdx.x) * Tile::kCols + quad * 4,
          static_cast<int64_t>(blockIdx.z) * heads + blockIdx.y};
}

// The thread's share of the state of (slot, head h) in states [slots, H, D, D]: key rows
// row_group + kRowGroups·i of its 4 columns from `col`, loaded into s. Returns where they live (D rows of
// stride D from column col), for store_state.
template <class Tile, int D>
__device__ __forceinline__ float* load_state(float* states, int slot, int heads, int h, int col,
                                             int row_group, float4 (&s)[Tile::kRows]) {
  float* state = states + (static_cast<int64_t>(slot) * heads + h) * D * D + col;
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i)
    s[i] = *reinterpret_cast<const float4*>(state + (row_group + Tile::kRowGroups * i) * D);
  return state;
}
template <class Tile, int D>
__device__ __forceinline__ void store_state(float* state, int row_group, const float4 (&s)[Tile::kRows]) {
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i)
    *reinterpret_cast<float4*>(state + (row_group + Tile::kRowGroups * i) * D) = s[i];
}

// A batch row of no sequence (padding): no state, zero output, written after the wait like every output.
__device__ __forceinline__ void finish_empty_row(__nv_bfloat16* out, int row_group) {
  pdl_wait();
  pdl_trigger();
  if (row_group == 0) store4_bf16(out, {0.0f, 0.0f, 0.0f, 0.0f});
}

// Sum of a float4 over the kRowGroups threads that share a column quad; every thread gets its quad's sum.
// Those threads are lanes kQuads apart within a warp (butterfly), then one partial per warp in `scratch`
// ([kWarps][kQuads]).
template <class Tile>
__device__ __forceinline__ float4 sum_over_rows(float4 v, float4* scratch) {
#pragma unroll
  for (int offset = Tile::kQuads; offset < 32; offset <<= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
    v.z += __shfl_xor_sync(0xffffffffu, v.z, offset);
    v.w += __shfl_xor_sync(0xffffffffu, v.w, offset);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane < Tile::kQuads) scratch[warp * Tile::kQuads + lane] = v;
  __syncthreads();
  float4 total = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int w = 0; w < Tile::kWarps; ++w) total += scratch[w * Tile::kQuads + lane % Tile::kQuads];
  return total;
}

// The l2norm factors of q (with its K^-0.5 scale) and of k from their [kd] values in shared memory; the
// whole block takes part. Each thread sums the elements d = tid, tid + blockDim, ..., so a thread that wrote
// exactly those needs no barrier before the call. `scratch` holds 32 float2.
__device__ __forceinline__ float2 l2_factors(const float* q_sh, const float* k_sh, int kd, float2* scratch) {
  float q_sq = 0.0f, k_sq = 0.0f;
  for (int d = threadIdx.x; d < kd; d += blockDim.x) {
    q_sq += q_sh[d] * q_sh[d];
    k_sq += k_sh[d] * k_sh[d];
  }
  q_sq = warp_sum(q_sq);
  k_sq = warp_sum(k_sq);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = {q_sq, k_sq};
  __syncthreads();
  q_sq = 0.0f;
  k_sq = 0.0f;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) {
    q_sq += scratch[w].x;
    k_sq += scratch[w].y;
  }
  return {l2_factor(q_sq, 1.0f / sqrtf(static_cast<float>(kd))), l2_factor(k_sq, 1.0f)};
}

// The recurrence for one (token, head) on the thread's state values s (rows row_group + kRowGroups·i of
// its 4 columns): decay first, kv = S^T k̂ of the decayed state, u = b·(v − kv), S += k̂ uᵀ, and returns
// o = S^T q̂ of the updated state (summed over the CTA's rows; every thread of a quad gets it). q_sh, k_sh
// and decay_sh hold the head's raw q, k and exp(g) [D]; the norm factors apply on use. With kStoreRows
// each updated row goes back to `state` ([D] rows of stride D, at the thread's columns) at once.
template <class Tile, int D, bool kStoreRows>
__device__ __forceinline__ float4 recur(float4 (&s)[Tile::kRows], const float* q_sh, const float* k_sh,
                                        const float* decay_sh, float2 factors, float4 v, float b,
                                        int row_group, float* state, float4* kv_scratch, float4* o_scratch) {
  const float q_factor = factors.x, k_factor = factors.y;
  float4 kv = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) {
    const int d = row_group + Tile::kRowGroups * i;
    s[i] = s[i] * decay_sh[d];
    kv += s[i] * (k_sh[d] * k_factor);
  }
  kv = sum_over_rows<Tile>(kv, kv_scratch);
  const float4 u = {b * (v.x - kv.x), b * (v.y - kv.y), b * (v.z - kv.z), b * (v.w - kv.w)};
  float4 o = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) {
    const int d = row_group + Tile::kRowGroups * i;
    s[i] += u * (k_sh[d] * k_factor);
    if constexpr (kStoreRows) *reinterpret_cast<float4*>(state + d * D) = s[i];
    o += s[i] * (q_sh[d] * q_factor);
  }
  return sum_over_rows<Tile>(o, o_scratch);
}

// Cluster barrier halves (PTX barrier.cluster). The release arrive orders this CTA's earlier writes (its
// shared-memory values the peers read) before the peers' acquire wait; the relaxed arrive orders nothing,
// which is all the final barrier needs: the peers' reads of this CTA's shared memory have completed (their
// values are in use) when they arrive.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The gated RMSNorm of one head's output: the thread's 4 columns of o (from `col`), normalized over all D
// columns of the head, which the kSplits CTAs of the cluster hold between them, times the norm weight and
// sigmoid(gate) of those columns (weight before gate, no (1 + w): docs/MODEL.md §5.7, as gated_rms_norm).
// Every thread of the cluster calls it; the row_group 0 threads (warp 0's first kQuads lanes, one per
// column quad) hold o. With a cluster it returns after arriving at the final barrier; the caller waits there
// (cluster_wait) before it exits, so no CTA frees the shared memory a peer still reads.
template <class Tile, int D>
__device__ __forceinline__ float4 gated_norm(float4 o, float4 gate, FloatIn o_norm, float eps, int col,
                                             float* sum_sq_sh) {
  if (threadIdx.x < 32) {
    const float sq = threadIdx.x < Tile::kQuads ? o.x * o.x + o.y * o.y + o.z * o.z + o.w * o.w : 0.0f;
    const float total = warp_sum(sq);
    if (threadIdx.x == 0) *sum_sq_sh = total;
  }
  float sum_sq = 0.0f;
  if constexpr (Tile::kSplits > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster_arrive_release();
    cluster_wait();
#pragma unroll
    for (int r = 0; r < Tile::kSplits; ++r) sum_sq += *cluster.map_shared_rank(sum_sq_sh, r);
    cluster_arrive_relaxed();
  } else {
    __syncthreads();
    sum_sq = *sum_sq_sh;
  }
  const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(D) + eps);
  return {o_norm.load(col) * (o.x * inv) * logistic(gate.x),
          o_norm.load(col + 1) * (o.y * inv) * logistic(gate.y),
          o_norm.load(col + 2) * (o.z * inv) * logistic(gate.z),
          o_norm.load(col + 3) * (o.w * inv) * logistic(gate.w)};
}

}  // namespace hlm::cuda
