#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/error.h"

namespace hlm {

void validate(const SamplingParams& p) {
  HLM_CHECK(p.temperature >= 0.0f && std::isfinite(p.temperature), "--temperature must be >= 0 (got {})",
            p.temperature);
  HLM_CHECK(p.top_k >= 0, "--top-k must be >= 0 (got {})", p.top_k);
  HLM_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "--top-p must be in (0, 1] (got {})", p.top_p);
}

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

namespace {

std::mt19937_64 seeded(uint64_t seed, uint64_t stream) {
  std::seed_seq seq{seed, stream};
  return std::mt19937_64(seq);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, uint64_t stream)
    : params_(params), rng_(seeded(params.seed, stream)) {}

int32_t Sampler::sample(const Tensor& logits) {
  const int64_t n = logits.numel();
  const float* x = logits.data<float>();
  if (params_.temperature == 0.0f) return argmax(x, n);

  // Candidates by descending logit; top-k keeps a prefix.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = params_.top_k > 0 ? std::min(params_.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  order.resize(k);

  std::vector<double> p(k);
  const double top = x[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp((x[order[i]] - top) / params_.temperature);
    sum += p[i];
  }
  // Nucleus: the smallest prefix whose probability reaches top_p.
  int64_t keep = k;
  if (params_.top_p < 1.0f) {
    double acc = 0;
    for (int64_t i = 0; i < k; ++i) {
      acc += p[i] / sum;
      if (acc >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  std::discrete_distribution<int64_t> pick(p.begin(), p.begin() + keep);
  return order[pick(rng_)];
}

}  // namespace hlm
