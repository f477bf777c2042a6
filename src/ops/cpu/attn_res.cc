// K3 block attention residuals (AttnRes, docs/MODEL.md §8.2): each token's layer input is a softmax mix
// of residual snapshots taken every few layers and the running sum. The mixing logits of the real model
// sit close together (margins ~0.02), so everything here is fp32 with double accumulators for the sums.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_kernels.h"

namespace hlm::cpu {

Tensor attn_res(const std::vector<Tensor>& candidates, const Tensor& proj, const Tensor& norm, float eps) {
  constexpr const char* op = "attn_res";
  HLM_CHECK(!candidates.empty(), "attn_res: needs at least one candidate");
  expect_tensor(candidates[0], op, "candidates[0]", DType::kF32, 2, "[T, D]");
  const int64_t rows = candidates[0].dim(0), dim = candidates[0].dim(1);
  for (const Tensor& c : candidates)
    expect_same_shape(c, candidates[0], op, "a candidate", "candidates[0]", "[T, D]");
  expect_tensor(proj, op, "proj", DType::kF32, 1, "[D]");
  expect_tensor(norm, op, "norm", DType::kF32, 1, "[D]");
  expect_dim(proj, 0, dim, op, "proj [D]", "the width of the candidates");
  expect_dim(norm, 0, dim, op, "norm [D]", "the width of the candidates");

  const auto n = static_cast<int64_t>(candidates.size());
  std::vector<const float*> src;
  for (const Tensor& c : candidates) src.push_back(c.data<float>());
  Tensor out = Tensor::empty({rows, dim}, DType::kF32);  // [T, D]
  const float* w_proj = proj.data<float>();
  const float* w_norm = norm.data<float>();
  float* y = out.data<float>();
#pragma omp parallel for
  for (int64_t t = 0; t < rows; ++t) {
    std::vector<double> score(n);
    double top = -INFINITY;
    for (int64_t c = 0; c < n; ++c) {
      const float* v = src[c] + t * dim;
      double sq = 0, dot = 0;
      for (int64_t d = 0; d < dim; ++d) {
        sq += static_cast<double>(v[d]) * v[d];
        dot += static_cast<double>(v[d]) * w_norm[d] * w_proj[d];
      }
      score[c] = dot / std::sqrt(sq / static_cast<double>(dim) + eps);
      top = std::max(top, score[c]);
    }
    double total = 0;
    for (double& s : score) total += (s = std::exp(s - top));
    for (int64_t d = 0; d < dim; ++d) {
      double acc = 0;
      for (int64_t c = 0; c < n; ++c) acc += score[c] * src[c][t * dim + d];
      y[t * dim + d] = static_cast<float>(acc / total);
    }
  }
  return out;
}

}  // namespace hlm::cpu
