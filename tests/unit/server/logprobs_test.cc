// Log-probability fields with the Kimi fixture tokenizer, fed one byte token at a time so characters
// split across tokens: `bytes` are each token's own bytes (not those of U+FFFD), and /v1/completions'
// text_offset is where each token's text starts in the returned text, in characters, also after text
// that was held back (a character not yet complete, a possible stop string).
#include <gtest/gtest.h>

#include "server/openai_response.h"

namespace hlm {
namespace {

const std::string kTokenizerDir = std::string(HLM_FIXTURES_DIR) + "/tokenizer/kimi_sparse";

class LogprobsTest : public ::testing::Test {
 protected:
  LogprobsTest()
      : tok_(Tokenizer::load(kTokenizerDir)),
        chat_(tok_, ChatFormat::kKimiLinear),
        ctx_{"kimi", 4096, tok_.vocab_size(), &tok_, &chat_} {}

  // The id whose token is the single byte `b`.
  int32_t byte_id(unsigned char b) const {
    for (int32_t id = 0; id < tok_.vocab_size(); ++id) {
      if (tok_.contains(id) && tok_.token_bytes(id) == std::string(1, static_cast<char>(b))) return id;
    }
    ADD_FAILURE() << "no token for byte " << int(b);
    return 0;
  }
  // One token per byte of `text`, each with itself and the next byte's token as alternatives.
  std::vector<SeqOutput> script(const std::string& text) const {
    std::vector<SeqOutput> outs;
    for (size_t i = 0; i < text.size(); ++i) {
      const int32_t id = byte_id(static_cast<unsigned char>(text[i]));
      const int32_t other = byte_id(static_cast<unsigned char>(text[(i + 1) % text.size()]));
      SeqOutput o;
      o.token = SampledToken{id, -0.25f, {{id, -0.25f}, {other, -2.0f}}};
      if (i + 1 == text.size()) o.finish = FinishReason::kLength;
      outs.push_back(o);
    }
    return outs;
  }
  GenerationRequest request(Endpoint endpoint, std::vector<std::string> stop = {}) const {
    GenerationRequest r;
    r.endpoint = endpoint;
    r.choices = {SeqRequest{}};
    r.choices[0].prompt = {1, 2};
    r.choices[0].top_logprobs = 2;
    r.report_logprobs = true;
    r.stop = std::move(stop);
    return r;
  }

  Tokenizer tok_;
  ChatTemplate chat_;
  ServingContext ctx_;
};

TEST_F(LogprobsTest, BytesAreTheTokensOwn) {
  // "é" is C3 A9: each token alone is half a character.
  GenerationResponse g(request(Endpoint::kCompletions), ctx_, "cmpl-1", 1);
  for (const SeqOutput& o : script("\xC3\xA9")) g.push(0, o);
  const nlohmann::json r = g.result();
  EXPECT_EQ(r["choices"][0]["text"], "\xC3\xA9");
  const nlohmann::json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], (std::vector<std::string>{"\xEF\xBF\xBD", "\xEF\xBF\xBD"}));

  // Chat's entries carry the bytes.
  GenerationResponse c(request(Endpoint::kChat), ctx_, "chatcmpl-1", 1);
  for (const SeqOutput& o : script("\xC3\xA9")) c.push(0, o);
  const nlohmann::json chat = c.result();
  const nlohmann::json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(content[0]["bytes"], (std::vector<int>{0xC3}));
  EXPECT_EQ(content[1]["bytes"], (std::vector<int>{0xA9}));
  EXPECT_EQ(content[0]["top_logprobs"][0]["bytes"], (std::vector<int>{0xC3}));
  EXPECT_EQ(content[0]["top_logprobs"][1]["bytes"], (std::vector<int>{0xA9}));
  EXPECT_EQ(content[1]["top_logprobs"][1]["bytes"], (std::vector<int>{0xC3}));
}

TEST_F(LogprobsTest, TextOffsetCountsCharactersOfTheReturnedText) {
  // a, é (two tokens), 世 (three), b: offsets in characters; the second half of a character starts
  // where the character does.
  for (const bool stream : {false, true}) {
    GenerationRequest req = request(Endpoint::kCompletions);
    req.stream = stream;
    GenerationResponse g(req, ctx_, "cmpl-1", 1);
    std::vector<int64_t> streamed;
    for (const SeqOutput& o : script("a\xC3\xA9\xE4\xB8\x96"
                                     "b")) {
      for (const nlohmann::json& c : g.push(0, o)) {
        for (const nlohmann::json& x : c["choices"][0]["logprobs"]["text_offset"]) streamed.push_back(x);
      }
    }
    const std::vector<int64_t> expected = {0, 1, 1, 2, 2, 2, 3};
    if (stream) {
      EXPECT_EQ(streamed, expected);
    } else {
      const nlohmann::json r = g.result();
      EXPECT_EQ(r["choices"][0]["text"],
                "a\xC3\xA9\xE4\xB8\x96"
                "b");
      EXPECT_EQ(r["choices"][0]["logprobs"]["text_offset"], expected);
    }
  }
}

TEST_F(LogprobsTest, TextOffsetCountsTextHeldForAStopString) {
  // "x" is held (it may begin "xy") until "b" shows it does not; "b" still starts at character 2.
  GenerationResponse g(request(Endpoint::kCompletions, {"xy"}), ctx_, "cmpl-1", 1);
  for (const SeqOutput& o : script("axb")) g.push(0, o);
  const nlohmann::json r = g.result();
  EXPECT_EQ(r["choices"][0]["text"], "axb");
  EXPECT_EQ(r["choices"][0]["logprobs"]["text_offset"], (std::vector<int64_t>{0, 1, 2}));
}

}  // namespace
}  // namespace hlm
