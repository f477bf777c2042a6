// K3's block attention residual mixing (docs/MODEL.md §8.2) on the GPU: one block per token. Each candidate
// row (at most kMaxCandidates: 8 snapshots + the running sum) is reduced to its RMS and to its score
// Σ_d rmsnorm(v)[d]·norm[d]·proj[d]; a softmax over the candidates' scores weighs the raw candidates.
// fp32 throughout, as the mixing logits are close together (margins ~0.02). One pass over the columns
// serves every candidate (per-thread sums in registers, one reduction for all of them): 22 µs per call at
// K3's width with 9 candidates on an H200, against 32 µs for a pass and two block reductions per
// candidate. One block per token is what remains slow at batch 1 (one SM reads all candidates).
#include <cmath>
#include <vector>

#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

constexpr int kMaxCandidates = 16;
constexpr int kThreads = 512;  // K3's 7168 columns in 14 steps per thread

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

// kVec = 4 where every candidate's rows keep 4-column vectors aligned (K3's 7168 columns); a column per
// thread held K3's mixing in an 8K-token prefill (8 calls, its first 4 layers) at 0.8 TB/s, 5.9 ms (ncu on
// an H200).
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
    if (vec) {
      launch_pdl(attn_res_kernel<4>, blocks, kThreads, 0, ctx.stream(), p);
    } else {
      launch_pdl(attn_res_kernel<1>, blocks, kThreads, 0, ctx.stream(), p);
    }
    HLM_CHECK_LAUNCH("attn_res");
  }
  return out;
}

}  // namespace hlm::cuda
