// Response text from token ids with a real tokenizer (the 301-rank Kimi fixture: single bytes plus real
// Kimi ranks and the Kimi added tokens): stop strings matched across token boundaries and held back
// only while they may still match, special tokens and stop ids left out, UTF-8 split across tokens.
#include "server/text_output.h"

#include <gtest/gtest.h>

namespace hlm {
namespace {

const std::string kTokenizerDir = std::string(HLM_FIXTURES_DIR) + "/tokenizer/kimi_sparse";

class TextOutputTest : public ::testing::Test {
 protected:
  TextOutputTest() : tok_(Tokenizer::load(kTokenizerDir)) {}
  // What a client sees: every push, then finish.
  std::string run(TextOutput& out, const std::vector<int32_t>& ids,
                  std::vector<std::string>* pieces = nullptr) {
    std::string text;
    for (int32_t id : ids) {
      const std::string piece = out.push(id, false);
      if (pieces) pieces->push_back(piece);
      text += piece;
    }
    return text + out.finish();
  }
  // One id per byte, so every stop string straddles tokens.
  std::vector<int32_t> bytes(const std::string& s) {
    std::vector<int32_t> ids;
    for (char c : s) {
      int32_t id = 0;
      while (!(tok_.contains(id) && tok_.token_bytes(id) == std::string(1, c))) ++id;
      ids.push_back(id);
    }
    return ids;
  }

  Tokenizer tok_;
};

TEST_F(TextOutputTest, WithoutStopsTheTextIsTheDecode) {
  TextOutput out(&tok_, {}, true);
  const std::vector<int32_t> ids = tok_.encode("Hello world, 你好世界");
  EXPECT_EQ(run(out, ids), "Hello world, 你好世界");
  EXPECT_FALSE(out.stopped());
}

TEST_F(TextOutputTest, AStopStringAcrossTokensCutsRightBeforeIt) {
  TextOutput out(&tok_, {"lo w", "zz"}, true);
  std::vector<std::string> pieces;
  EXPECT_EQ(run(out, bytes("Hello world"), &pieces), "Hel");
  EXPECT_TRUE(out.stopped());
  // Each "l", then "lo" and "lo " were held back (they could start "lo w"): nothing is sent and withdrawn.
  pieces.resize(7);
  EXPECT_EQ(pieces, (std::vector<std::string>{"H", "e", "", "l", "", "", ""}));
  EXPECT_EQ(out.push(tok_.encode("x")[0], false), "");
}

TEST_F(TextOutputTest, TheEarliestOfSeveralStopsWins) {
  TextOutput out(&tok_, {"world", "o"}, true);
  EXPECT_EQ(run(out, bytes("Hello world")), "Hell");
}

TEST_F(TextOutputTest, IncludeStopKeepsTheMatchedStringAndTheStopIdsText) {
  TextOutput out(&tok_, {"o w", "world"}, true, /*include_stop=*/true);
  EXPECT_EQ(run(out, bytes("Hello world")), "Hello w");
  EXPECT_TRUE(out.stopped());
  TextOutput by_id(&tok_, {}, true, /*include_stop=*/true);
  EXPECT_EQ(by_id.push(tok_.encode("x")[0], /*stop_token=*/true), "x");
}

TEST_F(TextOutputTest, HeldTextIsReleasedOnceItCannotMatch) {
  TextOutput out(&tok_, {"abc"}, true);
  std::vector<std::string> pieces;
  EXPECT_EQ(run(out, bytes("xabxab"), &pieces), "xabxab");
  EXPECT_EQ(pieces, (std::vector<std::string>{"x", "", "", "abx", "", ""}));
  EXPECT_FALSE(out.stopped());
}

TEST_F(TextOutputTest, Utf8SplitAcrossTokensIsHeldUntilComplete) {
  TextOutput out(&tok_, {}, true);
  std::vector<std::string> pieces;
  EXPECT_EQ(run(out, bytes("世"), &pieces), "世");
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "世"}));
}

TEST_F(TextOutputTest, SpecialTokensAndTheStopIdStayOut) {
  const int32_t im_end = *tok_.special_id("<|im_end|>");
  const int32_t call = *tok_.special_id("<|tool_call_begin|>");
  TextOutput skip(&tok_, {}, true);
  EXPECT_EQ(skip.push(im_end, false), "");
  // Tool-call markers are added but not special: they stay for the parser.
  EXPECT_EQ(skip.push(call, false), "<|tool_call_begin|>");
  TextOutput keep(&tok_, {}, false);
  EXPECT_EQ(keep.push(im_end, false), "<|im_end|>");
  EXPECT_EQ(keep.push(im_end, true), "");
  EXPECT_EQ(keep.token_text(im_end), "<|im_end|>");
}

TEST_F(TextOutputTest, NoTokenizerNoText) {
  TextOutput out(nullptr, {}, true);
  EXPECT_EQ(out.push(5, false), "");
  EXPECT_EQ(out.finish(), "");
  EXPECT_EQ(out.token_text(5), "token_id:5");
}

}  // namespace
}  // namespace hlm
