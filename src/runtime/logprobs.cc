#include "runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"

namespace hlm {

SampledToken token_logprobs(const Tensor& logits, int32_t id, int32_t top_n) {
  const int64_t n = logits.numel();
  const float* x = logits.data<float>();
  HLM_CHECK(id >= 0 && id < n, "token {} outside the {} logits", id, n);
  HLM_CHECK(top_n >= 0, "top_logprobs must be >= 0 (got {})", top_n);
  // log_softmax(x)_i = x_i - (max + log sum exp(x - max)), summed in double so the vocabulary size does
  // not cost precision.
  const float max = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
  const double log_z = max + std::log(sum);

  SampledToken out;
  out.id = id;
  out.logprob = static_cast<float>(x[id] - log_z);
  out.rank = std::count_if(x, x + n, [&](float v) { return v >= x[id]; });
  const int64_t k = std::min<int64_t>(top_n, n);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  for (int64_t i = 0; i < k; ++i) out.top.push_back({order[i], static_cast<float>(x[order[i]] - log_z)});
  return out;
}

}  // namespace hlm
