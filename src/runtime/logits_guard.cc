#include "runtime/logits_guard.h"

#include <cmath>

#include <fmt/format.h>

namespace hlm {

std::string non_finite_logits(const Tensor& row) {
  const float* x = row.data<float>();
  const int64_t n = row.numel();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  return fmt::format("logit {} of {} is {}{}", first, n, std::isnan(x[first]) ? "NaN" : "Inf",
                     bad > 1 ? fmt::format(" (and {} more non-finite)", bad - 1) : "");
}

}  // namespace hlm
