#include "runtime/sampler.h"

#include <cmath>

#include "base/error.h"
#include "ops/cpu/cpu_kernels.h"

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

Sampler::Sampler(const SamplingParams& params, uint64_t stream) : params_(params), stream_(stream) {
  if (params_.temperature < kGreedyBelowTemperature) params_.temperature = 0.0f;
}

SampleParams Sampler::next() {
  return SampleParams{params_.temperature, params_.top_k, params_.top_p, params_.seed, stream_, counter_++};
}

int32_t Sampler::sample(const Tensor& logits) {
  const SampleParams p = next();
  return cpu::sample_row(logits.data<float>(), logits.numel(), p);
}

}  // namespace hlm
