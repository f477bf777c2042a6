// LogitsProcessor against hand-computed values of vLLM's formulas: logit_bias and min_tokens first, then
// the repetition penalty over prompt and output ids, the frequency and presence penalties over the output,
// and min_p as a cut at the sampling temperature; and the sampler never draws a cut token.
#include "runtime/logits_processor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "base/error.h"
#include "runtime/sampler.h"

namespace hlm {
namespace {

TEST(LogitsProcessor, InactiveByDefault) {
  EXPECT_FALSE(LogitsAdjustments{}.active());
  LogitsProcessor p(LogitsAdjustments{}, {1, 2}, {0});
  EXPECT_FALSE(p.needed());
}

TEST(LogitsProcessor, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfSeenIds) {
  LogitsAdjustments a;
  a.repetition_penalty = 2.0f;
  LogitsProcessor p(a, /*prompt=*/{1}, {});
  p.observe(2);
  std::vector<float> x = {1.0f, 3.0f, -1.0f, 4.0f};
  p.apply(x.data(), 4, 1.0f);
  EXPECT_EQ(x, (std::vector<float>{1.0f, 1.5f, -2.0f, 4.0f}));
}

TEST(LogitsProcessor, FrequencyAndPresencePenaltiesCountTheOutputOnly) {
  LogitsAdjustments a;
  a.frequency_penalty = 0.5f;
  a.presence_penalty = 0.25f;
  LogitsProcessor p(a, /*prompt=*/{0}, {});
  p.observe(2);
  p.observe(2);
  p.observe(3);
  std::vector<float> x = {1.0f, 1.0f, 1.0f, 1.0f};
  p.apply(x.data(), 4, 1.0f);
  EXPECT_EQ(x, (std::vector<float>{1.0f, 1.0f, 1.0f - 2 * 0.5f - 0.25f, 1.0f - 0.5f - 0.25f}));
}

TEST(LogitsProcessor, BiasAndMinTokensComeFirst) {
  LogitsAdjustments a;
  a.logit_bias = {{1, 10.0f}, {3, -5.0f}};
  a.min_tokens = 2;
  a.repetition_penalty = 2.0f;  // a held-back end id stays held back whatever the penalty does
  LogitsProcessor p(a, /*prompt=*/{0}, /*end_ids=*/{0, 2});
  std::vector<float> x = {1.0f, 1.0f, 1.0f, 1.0f};
  p.apply(x.data(), 4, 1.0f);
  EXPECT_EQ(x, (std::vector<float>{kMaskedLogit, 11.0f, kMaskedLogit, -4.0f}));
  p.observe(1);
  p.observe(1);
  EXPECT_TRUE(p.needed());
  x = {1.0f, 1.0f, 1.0f, 1.0f};
  p.apply(x.data(), 4, 1.0f);
  EXPECT_EQ(x, (std::vector<float>{0.5f, 5.5f, 1.0f, -4.0f}));  // 1 + 10 halved: the output holds id 1
  LogitsAdjustments only_min_tokens;
  only_min_tokens.min_tokens = 1;
  LogitsProcessor q(only_min_tokens, {}, {0});
  EXPECT_TRUE(q.needed());
  q.observe(3);
  EXPECT_FALSE(q.needed());  // reached: the sequence may go back to the device's sampler
}

TEST(LogitsProcessor, MinPCutsTokensLessLikelyThanItsShareOfTheLikeliest) {
  LogitsAdjustments a;
  a.min_p = 0.1f;
  LogitsProcessor p(a, {}, {});
  // At T = 1, p_i / p_max = exp(x_i - 2): 1, exp(-2) = 0.135, exp(-2.5) = 0.082, exp(-1) = 0.37.
  std::vector<float> x = {2.0f, 0.0f, -0.5f, 1.0f};
  p.apply(x.data(), 4, 1.0f);
  EXPECT_EQ(x, (std::vector<float>{2.0f, 0.0f, kMaskedLogit, 1.0f}));
  // At T = 0.5 the ratios are squared: exp(-4) = 0.018 falls below 0.1 too.
  x = {2.0f, 0.0f, -0.5f, 1.0f};
  p.apply(x.data(), 4, 0.5f);
  EXPECT_EQ(x, (std::vector<float>{2.0f, kMaskedLogit, kMaskedLogit, 1.0f}));
  // Greedy keeps the likeliest anyway: nothing is cut.
  x = {2.0f, 0.0f, -0.5f, 1.0f};
  p.apply(x.data(), 4, 0.0f);
  EXPECT_EQ(x, (std::vector<float>{2.0f, 0.0f, -0.5f, 1.0f}));
}

TEST(LogitsProcessor, TheSamplerNeverDrawsACutToken) {
  LogitsAdjustments a;
  a.min_p = 0.5f;
  LogitsProcessor p(a, {}, {});
  std::vector<float> x = {3.0f, 2.9f, -1.0f, 0.0f, 2.95f};
  p.apply(x.data(), 5, 1.0f);
  const Tensor t = Tensor::from_vector({5}, x);
  Sampler s(SamplingParams{1.0f, 0, 1.0f, 11}, 0);
  for (int i = 0; i < 500; ++i) {
    const int32_t id = s.sample(t);
    EXPECT_TRUE(id == 0 || id == 1 || id == 4) << id;
  }
}

TEST(LogitsProcessor, AJsonObjectConstraintLeavesOnlyIdsThatKeepTheOutputAnObjectPrefix) {
  auto vocab = std::make_shared<ConstraintVocab>(
      std::vector<std::string>{"{", "}", "\"a\"", ":", " 1", "x", "<|im_end|>", "<eos>", " "},
      std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 0, 0, 1});
  LogitsAdjustments a;
  a.constraint.vocab = vocab;
  a.constraint.json = JsonSchema::any_object();
  LogitsProcessor p(a, {}, /*end_ids=*/{7});
  EXPECT_TRUE(p.needed());
  auto allowed = [&p] {
    std::vector<float> x(9, 1.0f);
    p.apply(x.data(), 9, 1.0f);
    std::vector<int> ids;
    for (int i = 0; i < 9; ++i) {
      if (x[i] != kMaskedLogit) ids.push_back(i);
    }
    return ids;
  };
  EXPECT_EQ(allowed(), (std::vector<int>{0, 8}));  // '{' or whitespace; never a special id
  p.observe(0);
  EXPECT_EQ(allowed(), (std::vector<int>{1, 2, 8}));
  p.observe(2);
  EXPECT_EQ(allowed(), (std::vector<int>{3, 8}));
  p.observe(3);
  EXPECT_EQ(allowed(), (std::vector<int>{0, 2, 4, 8}));  // a value: an object, a string, a number
  p.observe(4);
  EXPECT_EQ(allowed(),
            (std::vector<int>{1, 8}));  // " 1" may go on with digits, but none is in this vocabulary
  p.observe(1);
  EXPECT_EQ(allowed(), (std::vector<int>{7}));      // complete: only the end
  EXPECT_THROW(LogitsProcessor(a, {}, {}), Error);  // no end id: the sequence could never end
}

// The processor decides most ids by their first byte, or as plain text inside a string; the mask must be
// the one that feeding every id's bytes to a copy of the recognizer gives. Checked along sampled
// outputs of a schema with length bounds, over a vocabulary of random pieces of JSON.
TEST(LogitsProcessor, ASchemaConstraintMasksExactlyTheIdsTheRecognizerAccepts) {
  const auto schema = JsonSchema::compile(nlohmann::ordered_json::parse(R"({"type": "object",
      "properties": {"s": {"type": "string", "maxLength": 5}, "n": {"type": "integer"},
                     "v": {"type": "array", "items": {"enum": ["ab", 1, null]}}, "o": {}},
      "required": ["s", "v"], "additionalProperties": false})"),
                                          "schema");
  // Every byte the schema's keys spell is a piece, as a byte-level BPE vocabulary has every byte.
  const std::string pieces = R"({}[]",: \abnulsvo1-.e)"
                             "\n\xc3\xa9";
  std::mt19937 rng(3);
  std::vector<std::string> bytes = {"<eos>"};
  std::vector<uint8_t> text = {0};
  for (int id = 1; id < 3000; ++id) {
    std::string t;
    for (size_t n = 1 + rng() % 4; n > 0; --n) t += pieces[rng() % pieces.size()];
    bytes.push_back(t);
    text.push_back(1);
  }
  const auto vocab = std::make_shared<ConstraintVocab>(bytes, text);
  const auto v = static_cast<int64_t>(bytes.size());
  for (int walk = 0; walk < 20; ++walk) {
    LogitsAdjustments a;
    a.constraint.vocab = vocab;
    a.constraint.json = schema;
    LogitsProcessor p(a, {}, /*end_ids=*/{0});
    JsonSchemaPrefix state(*schema);
    std::string out;
    for (int step = 0; step < 60; ++step) {
      std::vector<float> x(static_cast<size_t>(v), 1.0f);
      p.apply(x.data(), v, 1.0f);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < v; ++id) {
        JsonSchemaPrefix next = state;
        const bool want = state.complete() ? id == 0 : text[id] && next.feed(bytes[id]);
        ASSERT_EQ(x[id] != kMaskedLogit, want) << "id " << id << " '" << bytes[id] << "' at step " << step;
        if (want) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty()) << out;
      const int32_t id = allowed[rng() % allowed.size()];
      if (id == 0) break;
      p.observe(id);
      ASSERT_TRUE(state.feed(bytes[id]));
      out += bytes[id];
    }
  }
}

TEST(LogitsProcessor, RefusesOutOfRangeAdjustments) {
  auto with = [](auto set) {
    LogitsAdjustments a;
    set(a);
    return a;
  };
  EXPECT_THROW(validate(with([](LogitsAdjustments& a) { a.repetition_penalty = 0.0f; }), 10), Error);
  EXPECT_THROW(validate(with([](LogitsAdjustments& a) { a.min_p = 1.5f; }), 10), Error);
  EXPECT_THROW(validate(with([](LogitsAdjustments& a) { a.min_tokens = -1; }), 10), Error);
  EXPECT_THROW(validate(with([](LogitsAdjustments& a) { a.frequency_penalty = NAN; }), 10), Error);
  EXPECT_THROW(validate(with([](LogitsAdjustments& a) { a.logit_bias = {{10, 1.0f}}; }), 10), Error);
  EXPECT_NO_THROW(validate(with([](LogitsAdjustments& a) { a.logit_bias = {{9, -100.0f}}; }), 10));
}

}  // namespace
}  // namespace hlm
