// token_logprobs: the log-softmax of the raw logits, the n most likely best first, and vLLM's rank.
#include "runtime/logprobs.h"

#include <gtest/gtest.h>

#include <cmath>

namespace hlm {
namespace {

TEST(TokenLogprobs, LogSoftmaxTopAndRank) {
  const std::vector<float> x = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  const Tensor logits = Tensor::from_vector({5}, x);
  double z = 0.0;
  for (float v : x) z += std::exp(static_cast<double>(v));
  const SampledToken t = token_logprobs(logits, 2, 3);
  EXPECT_EQ(t.id, 2);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-6);
  EXPECT_EQ(t.rank, 3);  // ids 1 and 3 are likelier
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].id, 1);  // a tie goes to the lower id
  EXPECT_EQ(t.top[1].id, 3);
  EXPECT_EQ(t.top[2].id, 2);
  // A tie counts against the token (vLLM's count of logits at least as large): both maxima rank 2.
  EXPECT_EQ(token_logprobs(logits, 1, 0).rank, 2);
  EXPECT_EQ(token_logprobs(logits, 4, 0).rank, 5);
  EXPECT_TRUE(token_logprobs(logits, 4, 0).top.empty());
}

}  // namespace
}  // namespace hlm
