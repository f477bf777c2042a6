// The CUDA sampler against the CPU one (ops/cpu/sampling.cc): greedy must agree exactly; temperature /
// top-k / top-p draws must agree on every row whose draw is not within a small margin of a boundary.
//
// Why a margin: both backends form w_i = exp((x_i − max)/T) from the same float argument; the GPU rounds an
// exact double exp once (correctly rounded), the CPU's expf is within 0.502 ulp, so the two w_i differ by
// at most 1 ulp (2^-23 relative) and usually not at all. Sums of kept weights then differ by at most 2^-23
// of the total, the GPU's top-p masses by another ~2^-41 per element (fixed point), and summation orders
// by ~1e-15. So a draw can differ only where, on the CPU side, u·total lies within 2^-22 of the total from
// the running sum before or after the chosen token, where p·total lies that close to the kept mass at or
// above the top-p cut (or above it), or where a weight of a different logit lies within a few ulps of a
// threshold. The test computes these margins from the CPU's own quantities (with 2^-21, twice the bound)
// and requires such near-ties to be rare (< 1% of rows) so that the comparison is not vacuous.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "gpu_test_util.h"
#include "ops/random_hash.h"

namespace hlm::test {
namespace {

constexpr double kBand = 1.0 / (1 << 21);  // relative margin: twice the 2^-22 bound derived above

struct RowCheck {
  int32_t id = -1;    // the CPU algorithm's draw, recomputed here
  bool near = false;  // a boundary or threshold within the margin
};

// The CPU sampler's steps on one row (ops/cpu/sampling.cc, same expressions), keeping the quantities the
// margins need.
RowCheck analyze(const float* x, int64_t n, const SampleParams& p) {
  RowCheck r;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return r;
  }
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  if (p.temperature == 0.0f) {
    r.id = static_cast<int32_t>(best);
    return r;
  }
  const float inv_t = 1.0f / p.temperature;
  std::vector<float> w(n);
  for (int64_t i = 0; i < n; ++i) w[i] = std::exp((x[i] - x[best]) * inv_t);
  // Whether a weight of another logit lies within the band around threshold v (of logit xv).
  auto crowded = [&](float v, float xv) {
    for (int64_t i = 0; i < n; ++i) {
      if (x[i] != xv && std::abs(static_cast<double>(w[i]) - v) <= kBand * v) return true;
    }
    return false;
  };
  auto logit_of = [&](float v) { return x[std::find(w.begin(), w.end(), v) - w.begin()]; };
  float tau = 0.0f;
  if (p.top_k > 0 && p.top_k < n) {
    std::vector<float> sorted = w;
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(), std::greater<float>());
    tau = sorted[p.top_k - 1];
    r.near = r.near || crowded(tau, logit_of(tau));
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
    const double goal = static_cast<double>(p.top_p) * total;
    double acc = 0.0;
    for (float v : kept) {
      acc += v;
      if (acc >= goal) {
        double at_or_above = 0.0, above = 0.0;  // kept mass >= v and > v
        for (float k : kept) {
          if (k >= v) at_or_above += k;
          if (k > v) above += k;
        }
        const double margin = kBand * total + static_cast<double>(kept.size()) * 0x1p-40;
        r.near = r.near || std::abs(at_or_above - goal) <= margin || std::abs(above - goal) <= margin ||
                 crowded(v, logit_of(v));
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
  for (int64_t i = 0; i < n; ++i) {
    if (w[i] < tau) continue;
    const double before = acc;
    acc += w[i];
    r.id = static_cast<int32_t>(i);
    if (acc > target) {
      r.near = r.near || target - before <= kBand * total || acc - target <= kBand * total;
      return r;
    }
  }
  return r;
}

class CudaSampling : public ::testing::Test {
 protected:
  // Compares the backends on every row; returns the number of near-tie rows (where a difference is
  // allowed). Also checks this file's replica of the CPU algorithm against the CPU op.
  int64_t compare(Ops& gpu, const Tensor& logits, const std::vector<SampleParams>& params, int64_t* drawn) {
    const std::vector<int32_t> want = cpu_->sample(logits, params);
    const std::vector<int32_t> got = gpu.sample(gpu.upload(logits), params);
    EXPECT_EQ(gpu.sample(gpu.upload(logits), params), got) << "repeated calls must draw the same ids";
    const int64_t n = logits.dim(1);
    int64_t near = 0, mismatches = 0;
    for (size_t r = 0; r < params.size(); ++r) {
      const RowCheck c = analyze(logits.data<float>() + r * n, n, params[r]);
      EXPECT_EQ(c.id, want[r]) << "the test's replica of the CPU sampler disagrees on row " << r;
      if (c.near) {
        ++near;
        continue;
      }
      if (got[r] != want[r] && ++mismatches <= 10) {
        ADD_FAILURE() << "row " << r << " (T " << params[r].temperature << ", top_k " << params[r].top_k
                      << ", top_p " << params[r].top_p << "): GPU " << got[r] << ", CPU " << want[r];
      }
      if (drawn != nullptr && params[r].temperature > 0.0f) ++*drawn;
    }
    EXPECT_EQ(mismatches, 0);
    return near;
  }

  // Logits of one row: normal with a random spread, some rows quantized to steps of 1/4 (exact ties).
  void fill_row(float* x, int64_t n, float min_spread = 0.5f, float max_spread = 4.0f) {
    std::uniform_real_distribution<float> spread(min_spread, max_spread);
    std::normal_distribution<float> normal(0.0f, spread(rng_));
    const bool quantized = std::bernoulli_distribution(0.25)(rng_);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = normal(rng_);
      if (quantized) x[i] = std::round(x[i] * 4.0f) / 4.0f;
    }
  }

  SampleParams random_params(uint64_t row) {
    const float temps[] = {0.25f, 0.7f, 1.0f, 1.3f};
    const int64_t ks[] = {0, 0, 1, 7, 50, 2047, 3000};
    const float ps[] = {1.0f, 1.0f, 0.95f, 0.8f, 0.5f, 0.05f};
    SampleParams p;
    p.temperature = temps[rng_() % 4];
    p.top_k = ks[rng_() % 7];
    p.top_p = ps[rng_() % 6];
    p.seed = rng_();
    p.stream = row;
    p.counter = rng_() % 1000;
    return p;
  }

  std::mt19937 rng_{91};
  std::unique_ptr<Ops> cpu_ = make_cpu_ops();
};

// Greedy: the first index of the maximum, exactly, at the real vocabulary size and at tiny ones.
TEST_F(CudaSampling, GreedyPicksTheFirstMaximum) {
  HLM_GPU_OR_SKIP(gpu);
  for (int64_t n : {163840, 3, 1}) {
    Tensor logits = random_f32({4, n}, rng_, -5.0f, 5.0f);
    float* x = logits.data<float>();
    if (n > 3) {
      x[17] = x[90000] = x[163839] = 9.0f;  // row 0: ties at the top
      std::fill_n(x + n, n, -2.5f);         // row 1: all equal
      x[2 * n + n - 1] = 7.0f;              // row 2: the last index
    }
    std::vector<SampleParams> params(4);
    const std::vector<int32_t> got = gpu->sample(gpu->upload(logits), params);
    EXPECT_EQ(got, cpu_->sample(logits, params)) << "vocab " << n;
    if (n > 3) {
      EXPECT_EQ(got[0], 17);
      EXPECT_EQ(got[1], 0);
      EXPECT_EQ(got[2], n - 1);
    }
  }
}

// A row holding NaN or ±inf gives -1, whatever its parameters; the other rows are unaffected.
TEST_F(CudaSampling, NonFiniteRowsGiveMinusOne) {
  HLM_GPU_OR_SKIP(gpu);
  const int64_t n = 5000;
  Tensor logits = random_f32({6, n}, rng_, -3.0f, 3.0f);
  float* x = logits.data<float>();
  x[0 * n + 123] = std::numeric_limits<float>::quiet_NaN();
  x[1 * n + 4999] = std::numeric_limits<float>::infinity();
  x[2 * n + 0] = -std::numeric_limits<float>::infinity();
  x[3 * n + 77] = std::numeric_limits<float>::quiet_NaN();
  std::vector<SampleParams> params(6);
  for (size_t r = 0; r < params.size(); ++r) {
    params[r].temperature = r % 2 == 0 ? 0.0f : 0.8f;
    params[r].top_k = r == 5 ? 1 : 0;  // row 5: top-k 1 draws the argmax
    params[r].seed = 1234;
    params[r].stream = r;
  }
  const std::vector<int32_t> got = gpu->sample(gpu->upload(logits), params);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(got[r], -1) << r;
  const std::vector<int32_t> want = cpu_->sample(logits, params);
  EXPECT_EQ(got[4], want[4]);
  EXPECT_EQ(got[5], want[5]);
}

// Many random rows (vocabulary 2048) over the parameter grid, ties included: equal to the CPU except at
// near-ties, which stay under 1% of the rows.
TEST_F(CudaSampling, RandomRowsMatchTheCpuDraws) {
  HLM_GPU_OR_SKIP(gpu);
  const int64_t rows = 250, n = 2048;
  int64_t near = 0, total = 0, drawn = 0, not_argmax = 0;
  for (int batch = 0; batch < 8; ++batch) {
    Tensor logits = Tensor::empty({rows, n}, DType::kF32);
    std::vector<SampleParams> params;
    for (int64_t r = 0; r < rows; ++r) {
      fill_row(logits.data<float>() + r * n, n);
      params.push_back(random_params(static_cast<uint64_t>(batch * rows + r)));
    }
    near += compare(*gpu, logits, params, &drawn);
    const std::vector<int32_t> ids = cpu_->sample(logits, params);
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = logits.data<float>() + r * n;
      not_argmax += x[ids[r]] < *std::max_element(x, x + n);
    }
    total += rows;
  }
  EXPECT_LT(near * 100, total) << near << " near-ties in " << total << " rows";
  EXPECT_GT(drawn, total / 2) << "most rows must be compared exactly";
  EXPECT_GT(not_argmax * 5, total) << "the draws must often pick other tokens than the argmax";
}

// The real vocabulary size (163840: 20 scan tiles of 8192) with truncations and peaked logits (as a
// trained model's are), so the kept sets stay small and near-ties rare (each kept token adds ~2^-20 to a
// row's chance of one). 16 rows: the most whose parameters go inside the kernels' parameters (more are
// uploaded, as in the tests of 32 and 250 rows).
TEST_F(CudaSampling, FullVocabularyRows) {
  HLM_GPU_OR_SKIP(gpu);
  const int64_t rows = 16, n = 163840;
  Tensor logits = Tensor::empty({rows, n}, DType::kF32);
  std::vector<SampleParams> params;
  for (int64_t r = 0; r < rows; ++r) {
    fill_row(logits.data<float>() + r * n, n, 3.0f, 5.0f);
    SampleParams p;
    p.temperature = r % 4 == 0 ? 0.6f : 1.0f;
    p.top_k = r % 3 == 0 ? 50 : r % 3 == 1 ? 1000 : 0;
    p.top_p = r % 2 == 0 ? 0.9f : r % 3 == 2 ? 0.5f : 1.0f;
    p.seed = 77;
    p.stream = static_cast<uint64_t>(r);
    p.counter = 3;
    params.push_back(p);
  }
  const int64_t near = compare(*gpu, logits, params, nullptr);
  EXPECT_LE(near, 2) << "near-ties in " << rows << " rows";
}

// top_k = 1 keeps the maximum (and its ties): every temperature draws the argmax, exactly.
TEST_F(CudaSampling, TopKOneIsTheArgmax) {
  HLM_GPU_OR_SKIP(gpu);
  const int64_t rows = 32, n = 3000;
  Tensor logits = random_f32({rows, n}, rng_, -4.0f, 4.0f);
  std::vector<SampleParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r].temperature = 0.1f + 0.1f * static_cast<float>(r);
    params[r].top_k = 1;
    params[r].seed = static_cast<uint64_t>(r);
  }
  const std::vector<int32_t> got = gpu->sample(gpu->upload(logits), params);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits.data<float>() + r * n;
    EXPECT_EQ(got[r], std::max_element(x, x + n) - x) << r;
  }
}

TEST_F(CudaSampling, RejectsBadParameters) {
  HLM_GPU_OR_SKIP(gpu);
  const Tensor logits = gpu->upload(random_f32({2, 10}, rng_));
  std::vector<SampleParams> params(2);
  EXPECT_NO_THROW(gpu->sample(logits, params));
  params[1].top_p = 0.0f;
  EXPECT_THROW(gpu->sample(logits, params), Error);
  params[1].top_p = 1.0f;
  params[1].temperature = -1.0f;
  EXPECT_THROW(gpu->sample(logits, params), Error);
  EXPECT_THROW(gpu->sample(logits, std::vector<SampleParams>(3)), Error);
}

}  // namespace
}  // namespace hlm::test
