// The one-token KDA recurrence as the tiled decode kernels run it (kda_decode.cu, kda_decode_layer.cu): how
// a head's [D, D] fp32 state is split over CTAs and threads, the recurrence on a thread's registers, the
// l2norm factors of q and k, and the gated RMSNorm across the CTAs of a head (a thread-block cluster).
// Both kernels keep a thread's share of the state in registers from load to store, so each state element
// is read and written exactly once.
#pragma once

#include <cooperative_groups.h>

#include "ops/cuda/cluster_barrier.cuh"
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
__device__ __forceinline__ float4 load4(FloatIn t, int64_t i) {
  return {t.load(i), t.load(i + 1), t.load(i + 2), t.load(i + 3)};
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

// Sums of N float4 over the kRowGroups threads that share a column quad; every thread gets its quad's sums.
// Those threads are lanes kQuads apart within a warp (butterfly), then one partial per warp in `scratch`
// ([kWarps][kQuads][N]) behind one barrier.
template <class Tile, int N>
__device__ __forceinline__ void sum_over_rows(float4 (&v)[N], float4* scratch) {
#pragma unroll
  for (int offset = Tile::kQuads; offset < 32; offset <<= 1) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      v[n].x += __shfl_xor_sync(0xffffffffu, v[n].x, offset);
      v[n].y += __shfl_xor_sync(0xffffffffu, v[n].y, offset);
      v[n].z += __shfl_xor_sync(0xffffffffu, v[n].z, offset);
      v[n].w += __shfl_xor_sync(0xffffffffu, v[n].w, offset);
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane < Tile::kQuads) {
#pragma unroll
    for (int n = 0; n < N; ++n) scratch[(warp * Tile::kQuads + lane) * N + n] = v[n];
  }
  __syncthreads();
#pragma unroll
  for (int n = 0; n < N; ++n) {
    v[n] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) v[n] += scratch[(w * Tile::kQuads + lane % Tile::kQuads) * N + n];
  }
}

// The values of the thread's key rows row_group + kRowGroups·i the recurrence needs: raw q and k (their
// l2norm factors apply on use) and the decays exp(g).
template <class Tile>
struct RowInputs {
  float q[Tile::kRows], k[Tile::kRows], decay[Tile::kRows];
};

// float4 slots of the scratch recur() needs, per (warp, column quad).
constexpr int kRecurSums = 3;

// The recurrence for one (token, head) on the thread's state values s (rows row_group + kRowGroups·i of
// its 4 columns): decay first, kv = S^T k̂ of the decayed state, u = b·(v − kv), S += k̂ uᵀ, and returns
// o = S^T q̂ of the updated state (every thread of a quad gets it). With kStoreRows each updated row goes
// back to `state` ([D] rows of stride D, at the thread's columns) at once.
// One reduction over the CTA's key rows gives everything that needs one: with S_d the decayed state,
// Σ S_d k and Σ S_d q per column, and Σ q², Σ k², Σ k·q. The l2norm factors of q and k are scalars, so they
// apply after the sums, and the output of the updated state is S^T q̂ = q̂_f·(Σ S_d q + k̂_f·u·Σ k q), so
// no second reduction waits for the update. `scratch` holds [kWarps][kQuads][kRecurSums] float4.
template <class Tile, int D, bool kStoreRows>
__device__ __forceinline__ float4 recur(float4 (&s)[Tile::kRows], const RowInputs<Tile>& in, float4 v,
                                        float b, int row_group, float* state, float4* scratch) {
  float4 sums[kRecurSums] = {};  // Σ S_d k, Σ S_d q per column; {Σ q², Σ k², Σ k·q, 0}
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) {
    s[i] = s[i] * in.decay[i];
    sums[0] += s[i] * in.k[i];
    sums[1] += s[i] * in.q[i];
    sums[2].x += in.q[i] * in.q[i];
    sums[2].y += in.k[i] * in.k[i];
    sums[2].z += in.k[i] * in.q[i];
  }
  sum_over_rows<Tile, kRecurSums>(sums, scratch);
  const float q_factor = l2_factor(sums[2].x, 1.0f / sqrtf(static_cast<float>(D)));
  const float k_factor = l2_factor(sums[2].y, 1.0f);
  const float4 kv = sums[0] * k_factor;
  const float4 ku = {k_factor * (b * (v.x - kv.x)), k_factor * (b * (v.y - kv.y)),
                     k_factor * (b * (v.z - kv.z)), k_factor * (b * (v.w - kv.w))};  // k̂_f·u
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) {
    s[i] += ku * in.k[i];
    if constexpr (kStoreRows)
      *reinterpret_cast<float4*>(state + (row_group + Tile::kRowGroups * i) * D) = s[i];
  }
  const float kq = sums[2].z;
  return {q_factor * (sums[1].x + ku.x * kq), q_factor * (sums[1].y + ku.y * kq),
          q_factor * (sums[1].z + ku.z * kq), q_factor * (sums[1].w + ku.w * kq)};
}

// The gated RMSNorm of one head's output: the thread's 4 columns of o, normalized over all D columns of the
// head, which the kSplits CTAs of the cluster hold between them, times the norm weight (norm_w, loaded by
// the caller before its PDL wait: a weight) and sigmoid(gate) of those columns (weight before gate, no (1 +
// w): docs/MODEL.md §5.7, as gated_rms_norm). Every thread of the cluster calls it; the row_group 0 threads
// (warp 0's first kQuads lanes, one per column quad) hold o. With a cluster it returns after arriving at the
// final barrier; the caller waits there (cluster_wait) before it exits, so no CTA frees the shared memory a
// peer still reads.
template <class Tile, int D>
__device__ __forceinline__ float4 gated_norm(float4 o, float4 gate, float4 norm_w, float eps,
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
  return {norm_w.x * (o.x * inv) * logistic(gate.x), norm_w.y * (o.y * inv) * logistic(gate.y),
          norm_w.z * (o.z * inv) * logistic(gate.z), norm_w.w * (o.w * inv) * logistic(gate.w)};
}

}  // namespace hlm::cuda
