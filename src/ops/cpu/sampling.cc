// Token sampling on the host (the reference for every backend's `sample` op): greedy, or temperature /
// top-k / top-p over one row of logits with the uniform number of ops/random_hash.h (see SampleParams in
// ops/ops.h). Truncations are thresholds on the unnormalized probabilities w_i = exp((x_i - max) / T), so
// tied values are kept together, and the draw walks the kept tokens in index order; a device kernel can do
// the same with a few reductions and one scan, without sorting the vocabulary.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_kernels.h"
#include "ops/random_hash.h"

namespace hlm::cpu {

int32_t sample_row(const float* x, int64_t n, const SampleParams& p) {
  if (n <= 0) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return -1;
  }
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  if (p.temperature == 0.0f) return static_cast<int32_t>(best);

  const float inv_t = 1.0f / p.temperature;
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[i] = std::exp((x[i] - x[best]) * inv_t);
  float tau = 0.0f;
  if (p.top_k > 0 && p.top_k < n) {
    std::vector<float> sorted = w;
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(), std::greater<float>());
    tau = sorted[p.top_k - 1];
  }
  if (p.top_p < 1.0f) {
    std::vector<float> kept;
    double total = 0.0;
    for (float v : w) {
      if (v >= tau) {
        kept.push_back(v);
        total += v;
      }
    }
    std::sort(kept.begin(), kept.end(), std::greater<float>());
    double acc = 0.0;
    for (float v : kept) {
      acc += v;
      if (acc >= static_cast<double>(p.top_p) * total) {
        tau = std::max(tau, v);
        break;
      }
    }
  }
  double total = 0.0;
  for (float v : w) {
    if (v >= tau) total += v;
  }
  const double target = static_cast<double>(uniform01(p.seed, p.stream, p.counter)) * total;
  double acc = 0.0;
  int64_t last = best;
  for (int64_t i = 0; i < n; ++i) {
    if (w[i] < tau) continue;
    acc += w[i];
    last = i;
    if (acc > target) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);
}

std::vector<int32_t> sample(const Tensor& logits, const std::vector<SampleParams>& rows) {
  expect_tensor(logits, "sample", "logits", DType::kF32, 2, "[R, V]");
  HLM_CHECK(static_cast<int64_t>(rows.size()) == logits.dim(0),
            "sample: {} rows of sampling parameters for logits {}", rows.size(), logits.describe());
  for (const SampleParams& p : rows) {
    HLM_CHECK(p.temperature >= 0.0f && p.top_k >= 0 && p.top_p > 0.0f && p.top_p <= 1.0f,
              "sample: invalid parameters (temperature {}, top_k {}, top_p {})", p.temperature, p.top_k,
              p.top_p);
  }
  const int64_t vocab = logits.dim(1);
  std::vector<int32_t> ids(rows.size());
#pragma omp parallel for
  for (int64_t r = 0; r < static_cast<int64_t>(rows.size()); ++r) {
    ids[r] = sample_row(logits.data<float>() + r * vocab, vocab, rows[r]);
  }
  return ids;
}

}  // namespace hlm::cpu
