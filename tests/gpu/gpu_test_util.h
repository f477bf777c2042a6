// Helpers shared by the GPU tests: the CUDA backend or a visible skip when this machine has none, host
// tensors rounded to bf16 (so the CPU reference and the GPU see identical inputs), and the relative L2
// error the tolerances are stated in.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>

#include "base/half.h"
#include "ops/backend.h"
#include "ops/cpu/cpu_ops.h"

namespace hlm::test {

// The CUDA backend on GPU 0, or nullptr with the reason (use HLM_GPU_OR_SKIP in a test body).
inline std::unique_ptr<Ops> cuda_ops(std::string* why) {
  if (cuda_device_count(why) == 0) return nullptr;
  return make_ops(Device::kCuda, BackendOptions{});
}

#define HLM_GPU_OR_SKIP(var)                                                  \
  std::string hlm_skip_reason_;                                               \
  std::unique_ptr<::hlm::Ops> var = ::hlm::test::cuda_ops(&hlm_skip_reason_); \
  if (var == nullptr) GTEST_SKIP() << "no GPU: " << hlm_skip_reason_

inline Tensor random_f32(const Shape& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

// F32 values rounded to the nearest bf16 (still F32), and the same as a BF16 host tensor.
inline Tensor round_bf16(const Tensor& f32) {
  Tensor t = f32.clone();
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
  return t;
}
inline Tensor as_bf16(const Tensor& f32) {
  Tensor t = Tensor::empty(f32.shape(), DType::kBF16);
  const float* src = f32.data<float>();
  uint16_t* dst = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = f32_to_bf16(src[i]);
  return t;
}

// ‖actual − expected‖₂ / ‖expected‖₂ over host F32 tensors of equal size; +inf for a NaN anywhere.
inline double rel_l2(const Tensor& actual, const Tensor& expected) {
  EXPECT_EQ(actual.numel(), expected.numel());
  double num = 0.0, den = 0.0;
  const float* a = actual.data<float>();
  const float* e = expected.data<float>();
  for (int64_t i = 0; i < actual.numel() && i < expected.numel(); ++i) {
    if (std::isnan(a[i]) || std::isnan(e[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - e[i]) * (static_cast<double>(a[i]) - e[i]);
    den += static_cast<double>(e[i]) * e[i];
  }
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Partial attention results of the GPU (out [R, V], stats [R, 2] as (max, sum), host F32) against the CPU's,
// row by row (R = rows · heads): a row the CPU gives no key must be exactly (-inf, 0) with zeros; any other
// row's max within max_tol·(1 + |max|), sum within sum_tol relative, and every out element within out_abs
// (NaN fails). Reports up to five bad rows; returns the number of rows without keys.
inline int64_t expect_attention_rows(const Tensor& out, const Tensor& stats, const Tensor& out_c,
                                     const Tensor& stats_c, int64_t heads, double max_tol, double sum_tol,
                                     double out_abs) {
  const int64_t rows = stats_c.numel() / 2, vd = out_c.numel() / rows;
  int64_t bad = 0, empty = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float m_c = stats_c.data<float>()[2 * r], s_c = stats_c.data<float>()[2 * r + 1];
    const float m_g = stats.data<float>()[2 * r], s_g = stats.data<float>()[2 * r + 1];
    const float* o_g = out.data<float>() + r * vd;
    const float* o_c = out_c.data<float>() + r * vd;
    bool ok = true;
    if (s_c == 0.0f) {
      ++empty;
      ok = m_g == -INFINITY && s_g == 0.0f;
      for (int64_t e = 0; e < vd; ++e) ok = ok && o_g[e] == 0.0f;
    } else {
      ok = std::abs(m_g - m_c) <= max_tol * (1.0 + std::abs(m_c)) && std::abs(s_g - s_c) <= sum_tol * s_c;
      for (int64_t e = 0; e < vd; ++e) ok = ok && std::abs(o_g[e] - o_c[e]) <= out_abs;
    }
    if (!ok && ++bad <= 5) {
      ADD_FAILURE() << "row " << r / heads << " head " << r % heads << ": stats (" << m_g << ", " << s_g
                    << ") vs CPU (" << m_c << ", " << s_c << "), out[0] " << o_g[0] << " vs " << o_c[0];
    }
  }
  EXPECT_EQ(bad, 0);
  return empty;
}

}  // namespace hlm::test
