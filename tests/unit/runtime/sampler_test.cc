#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <map>

#include "base/error.h"

namespace hlm {
namespace {

Tensor logits(std::vector<float> v) { return Tensor::from_vector({static_cast<int64_t>(v.size())}, v); }

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  Sampler s(SamplingParams{}, 0);
  EXPECT_EQ(s.sample(logits({0.1f, 3.0f, -1.0f, 3.0f})), 1);
}

TEST(Sampler, TemperaturesTooSmallToInvertAreGreedy) {
  // 1e-40 is a denormal: 1 / T is infinite, and the softmax over logits * (1 / T) was NaN, which took the
  // last index; the sampler now passes such rows on as greedy (temperature 0) to every backend.
  Tensor x = logits({0.1f, 3.0f, -1.0f, 2.0f});
  for (float t : {1e-40f, 1e-30f, 9e-6f}) {
    Sampler s(SamplingParams{t, 0, 1.0f, 7}, 0);
    EXPECT_EQ(s.next().temperature, 0.0f) << t;
    EXPECT_EQ(s.sample(x), 1) << t;
  }
  Sampler at_bound(SamplingParams{kGreedyBelowTemperature, 0, 1.0f, 7}, 0);
  EXPECT_EQ(at_bound.next().temperature, kGreedyBelowTemperature);
  EXPECT_EQ(at_bound.sample(x), 1);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  Tensor x = logits({0.5f, 0.2f, 2.0f, 1.9f});
  Sampler k1(SamplingParams{1.0f, 1, 1.0f, 3}, 0);
  Sampler p0(SamplingParams{1.0f, 0, 1e-6f, 3}, 0);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(k1.sample(x), 2);
    EXPECT_EQ(p0.sample(x), 2);
  }
}

TEST(Sampler, FollowsTheSoftmaxAndIsReproducible) {
  Tensor x = logits({0.0f, std::log(3.0f)});  // p = 1/4, 3/4
  Sampler a(SamplingParams{1.0f, 0, 1.0f, 42}, 5);
  Sampler b(SamplingParams{1.0f, 0, 1.0f, 42}, 5);
  int ones = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const int32_t t = a.sample(x);
    EXPECT_EQ(t, b.sample(x));
    ones += t;
  }
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.03);
}

TEST(Sampler, TopKNeverPicksOutsideTheTopK) {
  Tensor x = logits({1.0f, 5.0f, 4.9f, 0.0f, 4.8f});
  Sampler s(SamplingParams{10.0f, 2, 1.0f, 1}, 0);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 200; ++i) ++seen[s.sample(x)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(1) && seen.count(2));
}

TEST(Sampler, ValidateNamesTheFlag) {
  EXPECT_THROW(validate(SamplingParams{-1.0f, 0, 1.0f, 0}), Error);
  EXPECT_THROW(validate(SamplingParams{1.0f, -2, 1.0f, 0}), Error);
  try {
    validate(SamplingParams{1.0f, 0, 0.0f, 0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--top-p"), std::string::npos);
  }
}

}  // namespace
}  // namespace hlm
