// Helpers shared by the ops tests: seeded random tensors, conversion to double for reference loops, and
// one closeness check. Reference loops are written in double; the check allows a relative error `rtol`
// per element measured against |expected| + rms(expected), so elements that cancel to near zero are
// judged on the tensor's scale rather than on their own tiny magnitude.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "base/tensor.h"

namespace hlm::test {

inline Tensor random_tensor(const Shape& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

inline std::vector<double> to_double(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<double>(p, p + t.numel());
}

inline ::testing::AssertionResult all_close(const Tensor& actual, const std::vector<double>& expected,
                                            double rtol) {
  if (actual.numel() != static_cast<int64_t>(expected.size())) {
    return ::testing::AssertionFailure() << "size " << actual.numel() << " vs expected " << expected.size();
  }
  double sum_sq = 0.0;
  for (double e : expected) sum_sq += e * e;
  const double rms = expected.empty() ? 0.0 : std::sqrt(sum_sq / static_cast<double>(expected.size()));
  const float* a = actual.data<float>();
  double worst = 0.0;
  int64_t worst_i = -1, failures = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double err = std::abs(static_cast<double>(a[i]) - expected[i]);
    const double allowed = rtol * (std::abs(expected[i]) + rms);
    if (!(err <= allowed)) ++failures;  // also catches NaN
    const double ratio = allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0.0);
    if (!(ratio <= worst) || std::isnan(ratio)) {
      worst = ratio;
      worst_i = static_cast<int64_t>(i);
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failures << " of " << expected.size() << " elements off; worst at "
                                       << worst_i << ": " << a[worst_i] << " vs " << expected[worst_i]
                                       << " (error / allowed = " << worst << ", rms " << rms << ")";
}

inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol) {
  return all_close(actual, to_double(expected), rtol);
}

}  // namespace hlm::test
