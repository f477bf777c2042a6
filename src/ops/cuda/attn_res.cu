// K3's block attention residual mixing (docs/MODEL.md §8.2) on the GPU. Each candidate row (at most
// kMaxCandidates: 8 snapshots + the running sum) is reduced to its RMS and to its score
// Σ_d rmsnorm(v)[d]·norm[d]·proj[d]; a softmax over the candidates' scores weighs the raw candidates. fp32
// throughout, as the mixing logits are close together (margins ~0.02).
// Two kernels. Decode batches of rows up to kSliceCols·kMaxSlices wide (K3's 7168) take
// attn_res_slices_kernel: a token's columns are split over a thread-block cluster, each thread holds one
// 4-column vector of every candidate in registers from its one load to the weighted sum, and the cluster's
// CTAs add their partial sums through distributed shared memory. The K3 decode step calls it twice per
// layer, and one block per token read every candidate on one SM in a chain of dependent loads: 12 against
// 6.6 µs per call at batch 1 with 2 candidates (ncu on an H200). Prefill chunks, wider rows and rows not
// aligned for vectors take attn_res_kernel: one block per token, one pass over the columns for every
// candidate's sums, then a second for the mix. The two kernels' norm·proj, per-warp sums and softmax are
// written out in each: with them as shared helpers (every thread forming the weights in both kernels) K3's
// first 4 layers took 2.609-2.610 ms per batch-1 step against 2.581-2.591 (H200, alternating in one call).
#include <cooperative_groups.h>

#include <cmath>
#include <vector>

#include "ops/cuda/cluster_barrier.cuh"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

constexpr int kMaxCandidates = 16;
constexpr int kThreads = 512;                  // attn_res_kernel: K3's 7168 columns in 14 steps per thread
constexpr int kSliceThreads = 256;             // attn_res_slices_kernel: a 4-column vector per thread
constexpr int kSliceCols = kSliceThreads * 4;  // columns per CTA
constexpr int kMaxSlices = 8;                  // CTAs per token: a portable cluster

struct AttnResParams {
  const void* cand[kMaxCandidates];  // [T, D] each
  bool cand_bf16[kMaxCandidates];
  int num;
  const void* proj;  // [D]
  const void* norm;  // [D]
  bool proj_bf16, norm_bf16;
  float* out;  // [T, D]
  int64_t dim;
  float eps;
};

__device__ __forceinline__ float load(const void* p, bool is_bf16, int64_t i) {
  return is_bf16 ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// kVec consecutive columns of candidate c as floats, one vector load in its dtype (the branch is uniform:
// a candidate's dtype is the same for every thread).
template <int kVec>
__device__ __forceinline__ void load_cand(const AttnResParams& p, int c, int64_t i, float (&v)[kVec]) {
  if (p.cand_bf16[c]) {
    RawVec<bf16, kVec> raw;
    raw.load(static_cast<const bf16*>(p.cand[c]) + i);
    raw.to_floats(v);
  } else {
    RawVec<float, kVec> raw;
    raw.load(static_cast<const float*>(p.cand[c]) + i);
    raw.to_floats(v);
  }
}

// kVec = 4 where every candidate's rows keep 4-column vectors aligned (K3's prefill chunks); a column per
// thread held K3's mixing in an 8K-token prefill (8 calls, its first 4 layers) at 0.8 TB/s, 5.9 ms against
// 2.7 with kVec = 4 (ncu on an H200).
template <int kVec>
__global__ void __launch_bounds__(kThreads) attn_res_kernel(AttnResParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ float partial[2 * kMaxCandidates]
                          [kThreads / 32];  // per warp: Σv² and Σv·norm·proj per candidate
  __shared__ float weight[kMaxCandidates];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = blockIdx.x * p.dim;
  float sq[kMaxCandidates], dot[kMaxCandidates];
#pragma unroll
  for (int c = 0; c < kMaxCandidates; ++c) sq[c] = dot[c] = 0.0f;
  for (int64_t d = threadIdx.x * kVec; d < p.dim; d += kThreads * kVec) {
    float np[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      np[e] = load(p.norm, p.norm_bf16, d + e) * load(p.proj, p.proj_bf16, d + e);
#pragma unroll
    for (int c = 0; c < kMaxCandidates; ++c) {
      if (c < p.num) {
        float v[kVec];
        load_cand(p, c, row + d, v);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          sq[c] += v[e] * v[e];
          dot[c] += v[e] * np[e];
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kMaxCandidates; ++c) {
    if (c < p.num) {
      const float s = warp_sum(sq[c]), t = warp_sum(dot[c]);
      if (lane == 0) partial[2 * c][warp] = s, partial[2 * c + 1][warp] = t;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int c = 0; c < p.num; ++c) {
      float s = 0.0f, t = 0.0f;
      for (int w = 0; w < kThreads / 32; ++w) s += partial[2 * c][w], t += partial[2 * c + 1][w];
      weight[c] = t * rms_inv(s, p.dim, p.eps);
      m = fmaxf(m, weight[c]);
    }
    float sum = 0.0f;
    for (int c = 0; c < p.num; ++c) {
      weight[c] = expf(weight[c] - m);
      sum += weight[c];
    }
    for (int c = 0; c < p.num; ++c) weight[c] /= sum;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x * kVec; d < p.dim; d += kThreads * kVec) {
    float acc[kVec] = {};
    for (int c = 0; c < p.num; ++c) {
      float v[kVec];
      load_cand(p, c, row + d, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] += weight[c] * v[e];
    }
    store_floats(p.out + row + d, acc);
  }
}

// Grid (slices, T) in clusters of the `slices` CTAs of a token: CTA s takes columns [s·kSliceCols,
// (s+1)·kSliceCols), thread i the 4 at s·kSliceCols + 4i. The thread loads its vector of every candidate
// once (the norm and proj weights before the PDL wait) and keeps it; the CTA's Σv² and Σv·norm·proj per
// candidate go to shared memory, and behind one cluster barrier every CTA adds all the CTAs' sums in rank
// order, so all of them compute the same weights; each then writes its columns of the mix.
__global__ void __launch_bounds__(kSliceThreads) attn_res_slices_kernel(AttnResParams p) {
  namespace cg = cooperative_groups;
  __shared__ float warp_part[kSliceThreads / 32][2 * kMaxCandidates];  // per warp: Σv², Σv·norm·proj
  __shared__ float cta_part[2 * kMaxCandidates];  // the CTA's sums, which the cluster reads
  __shared__ float total[2 * kMaxCandidates];     // the token's sums
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kSliceCols + threadIdx.x * 4;
  const bool inside = d < p.dim;
  float np[4] = {};
  if (inside) {
#pragma unroll
    for (int e = 0; e < 4; ++e) np[e] = load(p.norm, p.norm_bf16, d + e) * load(p.proj, p.proj_bf16, d + e);
  }
  pdl_wait();
  pdl_trigger();
  const int64_t row = static_cast<int64_t>(blockIdx.y) * p.dim;
  float v[kMaxCandidates][4];
#pragma unroll
  for (int c = 0; c < kMaxCandidates; ++c) {
    v[c][0] = v[c][1] = v[c][2] = v[c][3] = 0.0f;
    if (c < p.num && inside) load_cand<4>(p, c, row + d, v[c]);
  }
#pragma unroll
  for (int c = 0; c < kMaxCandidates; ++c) {
    if (c < p.num) {
      float sq = 0.0f, dot = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sq += v[c][e] * v[c][e];
        dot += v[c][e] * np[e];
      }
      sq = warp_sum(sq);
      dot = warp_sum(dot);
      if (lane == 0) warp_part[warp][2 * c] = sq, warp_part[warp][2 * c + 1] = dot;
    }
  }
  __syncthreads();
  const int sums = 2 * p.num;
  if (threadIdx.x < sums) {
    float t = 0.0f;
    for (int w = 0; w < kSliceThreads / 32; ++w) t += warp_part[w][threadIdx.x];
    cta_part[threadIdx.x] = t;
  }
  const unsigned ranks = gridDim.x;  // the cluster spans the grid's x: the token's CTAs, rank blockIdx.x
  if (ranks > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster_arrive_release();
    cluster_wait();
    if (threadIdx.x < sums) {
      float t = 0.0f;
      for (unsigned r = 0; r < ranks; ++r) t += *cluster.map_shared_rank(&cta_part[threadIdx.x], r);
      total[threadIdx.x] = t;
    }
    cluster_arrive_relaxed();  // this CTA's reads of its peers are done
  } else if (threadIdx.x < sums) {
    total[threadIdx.x] = cta_part[threadIdx.x];
  }
  __syncthreads();
  // The softmax over the candidates' scores, in every thread (at most kMaxCandidates terms).
  float weight[kMaxCandidates];
  float m = -INFINITY;
#pragma unroll
  for (int c = 0; c < kMaxCandidates; ++c) {
    weight[c] = c < p.num ? total[2 * c + 1] * rms_inv(total[2 * c], p.dim, p.eps) : -INFINITY;
    m = fmaxf(m, weight[c]);
  }
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kMaxCandidates; ++c) {
    weight[c] = c < p.num ? expf(weight[c] - m) : 0.0f;
    sum += weight[c];
  }
  float acc[4] = {};
#pragma unroll
  for (int c = 0; c < kMaxCandidates; ++c) {
    if (c < p.num) {
      const float w = weight[c] / sum;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] += w * v[c][e];
    }
  }
  if (inside) store_floats(p.out + row + d, acc);
  if (ranks > 1) cluster_wait();  // no CTA leaves while a peer may still read its sums
}

}  // namespace

Tensor attn_res(CudaContext& ctx, const std::vector<Tensor>& candidates, const Tensor& proj,
                const Tensor& norm, float eps) {
  HLM_CHECK(!candidates.empty() && candidates.size() <= kMaxCandidates,
            "attn_res: {} candidates, expected 1 to {}", candidates.size(), kMaxCandidates);
  const Tensor& first = candidates[0];
  expect_cuda(first, "attn_res", "candidate 0", {DType::kF32, DType::kBF16}, 2, "[T, D]");
  expect_cuda(proj, "attn_res", "proj", {DType::kF32, DType::kBF16}, 1, "[D]");
  expect_cuda(norm, "attn_res", "norm", {DType::kF32, DType::kBF16}, 1, "[D]");
  expect_dim(proj, 0, first.dim(1), "attn_res", "proj [D]", "the width of the candidates");
  expect_dim(norm, 0, first.dim(1), "attn_res", "norm [D]", "the width of the candidates");
  AttnResParams p{};
  for (size_t c = 0; c < candidates.size(); ++c) {
    expect_cuda(candidates[c], "attn_res", "a candidate", {DType::kF32, DType::kBF16}, 2, "[T, D]");
    expect_same_shape(candidates[c], first, "attn_res", "a candidate", "candidate 0");
    p.cand[c] = candidates[c].raw();
    p.cand_bf16[c] = candidates[c].dtype() == DType::kBF16;
  }
  p.num = static_cast<int>(candidates.size());
  p.proj = proj.raw();
  p.norm = norm.raw();
  p.proj_bf16 = proj.dtype() == DType::kBF16;
  p.norm_bf16 = norm.dtype() == DType::kBF16;
  Tensor out = ctx.empty(first.shape(), DType::kF32);  // [T, D]
  p.out = static_cast<float*>(out.raw());
  p.dim = first.dim(1);
  p.eps = eps;
  bool vec = p.dim % 4 == 0 && aligned16(p.out);
  for (const Tensor& c : candidates) vec = vec && aligned_to(c.raw(), 4 * dtype_size(c.dtype()));
  if (first.dim(0) > 0) {
    const auto blocks = static_cast<unsigned>(first.dim(0));
    // The sliced kernel while its grid is one wave (two CTAs per SM): decode batches. A prefill chunk's
    // thousands of small CTAs, each a cluster barrier and one round of loads, ran K3's mixing at 0.48 TB/s
    // (9.7 ms for the 8 calls of an 8K-token prefill of its first 4 layers, against 2.7 ms for one block per
    // token; ncu on an H200).
    const int64_t slices = (p.dim + kSliceCols - 1) / kSliceCols;
    if (vec && slices <= kMaxSlices && first.dim(0) * slices <= 2 * static_cast<int64_t>(ctx.sm_count())) {
      launch_pdl(attn_res_slices_kernel, dim3(static_cast<unsigned>(slices), blocks), kSliceThreads, 0,
                 ctx.stream(), p, static_cast<unsigned>(slices));
    } else if (vec) {
      launch_pdl(attn_res_kernel<4>, blocks, kThreads, 0, ctx.stream(), p);
    } else {
      launch_pdl(attn_res_kernel<1>, blocks, kThreads, 0, ctx.stream(), p);
    }
    HLM_CHECK_LAUNCH("attn_res");
  }
  return out;
}

}  // namespace hlm::cuda
