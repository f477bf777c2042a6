// Log-probabilities of a sampled token and of the most likely alternatives, from the host logits of one
// position: a log-softmax over the raw logits (before temperature, top-k and top-p), as the OpenAI API
// and vLLM report them.
#pragma once

#include <cstdint>
#include <vector>

#include "base/tensor.h"

namespace hlm {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;           // set when log-probabilities were asked for
  std::vector<TokenLogprob> top;  // the n most likely, best first (lowest id on ties)
  // With them, its rank in the distribution: the tokens at least as likely, itself included (vLLM's, so 1
  // for the most likely; a tie counts against it).
  int64_t rank = 0;
};

// logits: host F32 [vocab]. top_n >= 0.
SampledToken token_logprobs(const Tensor& logits, int32_t id, int32_t top_n);

}  // namespace hlm
