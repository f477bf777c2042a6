// Tokenizer behaviour on the real Kimi ids of kimi_sparse/ (published ids that pip tiktoken reproduces:
// tools/make_tokenizer_goldens.py), special-token handling, decoding and streaming, UTF-8 repair, and the
// errors for malformed tokenizer files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/utf8.h"
#include "stress_strings.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"

namespace hlm {
namespace {

const std::string kFixtures = HLM_FIXTURES_DIR;
const std::string kSparse = kFixtures + "/tokenizer/kimi_sparse";
const std::string kScratch = HLM_SCRATCH_DIR;

const Tokenizer& kimi() {
  static const Tokenizer tok = Tokenizer::load(kSparse);
  return tok;
}

TEST(Tokenizer, RealKimiIdsMatchPublishedValues) {
  std::ifstream in(kSparse + "/expected.json");
  const auto cases = nlohmann::json::parse(in);
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    const auto text = c["text"].get<std::string>();
    EXPECT_EQ(kimi().encode(text, c["allow_special"].get<bool>()), c["ids"].get<std::vector<int32_t>>())
        << text;
  }
}

TEST(Tokenizer, VocabularyAndAddedTokens) {
  const Tokenizer& tok = kimi();
  EXPECT_EQ(tok.vocab_size(), 163840);
  EXPECT_EQ(tok.special_id("<|im_end|>"), 163586);
  EXPECT_EQ(tok.special_id("<|im_middle|>"), 163601);
  EXPECT_EQ(tok.special_id("[PAD]"), 163839);
  // Ids the config does not list are named as tokenization_kimi.py names them.
  EXPECT_EQ(tok.special_id("<|reserved_token_163600|>"), 163600);
  EXPECT_TRUE(tok.is_special(163600));
  EXPECT_EQ(tok.special_id("<|im_end"), std::nullopt);
  // The tool-call markers are added tokens but not "special": skip_special_tokens keeps them.
  const int32_t call_begin = *tok.special_id("<|tool_call_begin|>");
  EXPECT_EQ(call_begin, 163597);
  EXPECT_FALSE(tok.is_special(call_begin));
  EXPECT_TRUE(tok.is_added(call_begin));
  EXPECT_TRUE(tok.is_special(163586));
  EXPECT_FALSE(tok.is_added(19180));
  EXPECT_TRUE(tok.contains(19180));
  EXPECT_FALSE(tok.contains(5000));  // a gap of the sparse rank table
  EXPECT_FALSE(tok.contains(-1));
  EXPECT_FALSE(tok.contains(163840));
  EXPECT_EQ(tok.bos_id(), 163584);
  EXPECT_EQ(tok.eos_id(), 163586);
}

TEST(Tokenizer, SpecialTokensAreTextUnlessAllowed) {
  const Tokenizer& tok = kimi();
  const std::string text = "Hello<|im_end|>";
  EXPECT_EQ(tok.encode(text, true), (std::vector<int32_t>{19180, 163586}));
  const std::vector<int32_t> plain = tok.encode(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 163586), 0);
  EXPECT_EQ(tok.decode(plain), text);
  // Near misses stay text even when allowed; reserved names are special tokens too.
  EXPECT_EQ(tok.encode("<|im_end|", true), tok.encode("<|im_end|"));
  EXPECT_EQ(tok.encode("<|reserved_token_163700|>", true), (std::vector<int32_t>{163700}));
}

TEST(Tokenizer, DecodeConcatenatesBytesAndNamesBadIds) {
  const Tokenizer& tok = kimi();
  EXPECT_EQ(tok.decode({19180, 2695, 163586}), "Hello world<|im_end|>");
  EXPECT_EQ(tok.decode({160}), "\xE4");  // one byte of a three-byte character
  EXPECT_EQ(tok.token_bytes(2243), "\u4e16\u754c");
  try {
    tok.decode({19180, 5000});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("5000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok.decode({-3}), Error);
  EXPECT_THROW(tok.decode({163840}), Error);
}

TEST(Tokenizer, InvalidUtf8IsRepairedAsPythonDoes) {
  // CPython's bytes.decode("utf-8", "replace"): one U+FFFD per maximal ill-formed subpart.
  EXPECT_EQ(to_valid_utf8("a\xE4\xB8"
                          "b"),
            "a\uFFFD"
            "b");                                                  // truncated 3-byte sequence: one U+FFFD
  EXPECT_EQ(to_valid_utf8("\xE0\x80"), "\uFFFD\uFFFD");            // overlong start: two
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // surrogate: three
  EXPECT_EQ(to_valid_utf8("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // above U+10FFFF
  EXPECT_EQ(to_valid_utf8("\xC0\xAF\xFF"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98"), "\uFFFD");
  EXPECT_EQ(to_valid_utf8("ok \u00e9\u4e2d\U0001F600"), "ok \u00e9\u4e2d\U0001F600");
  const Tokenizer& tok = kimi();
  EXPECT_EQ(tok.encode("Hello\xFF"), tok.encode("Hello\uFFFD"));
}

TEST(StreamDecoder, HoldsBackIncompleteCharactersUntilComplete) {
  const Tokenizer& tok = kimi();
  StreamDecoder dec(tok);
  // 你 = E4 BD A0: the bytes arrive as ids 160 (E4), 121 (BD), 254 (A0).
  EXPECT_EQ(dec.push(19180), "Hello");
  EXPECT_EQ(dec.push(160), "");
  EXPECT_EQ(dec.push(121), "");
  EXPECT_EQ(dec.push(254), "\u4f60");
  EXPECT_EQ(dec.push(163586), "<|im_end|>");
  EXPECT_EQ(dec.push(160), "");
  EXPECT_EQ(dec.flush(), "\uFFFD");  // cut short at the end
  EXPECT_EQ(dec.flush(), "");
  // A byte that can never continue the held-back sequence releases it as U+FFFD at once.
  EXPECT_EQ(dec.push(160), "");
  EXPECT_EQ(dec.push(39), "\uFFFDH");
}

TEST(StreamDecoder, ConcatenationEqualsRepairedDecode) {
  const Tokenizer& tok = kimi();
  std::vector<int32_t> vocab;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.contains(id)) vocab.push_back(id);
  }
  test::SplitMix64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> ids;
    for (uint64_t n = 1 + rng.below(12); n > 0; --n) ids.push_back(vocab[rng.below(vocab.size())]);
    StreamDecoder dec(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = dec.push(id);
      EXPECT_TRUE(is_valid_utf8(piece));
      streamed += piece;
    }
    streamed += dec.flush();
    ASSERT_EQ(streamed, to_valid_utf8(tok.decode(ids))) << "trial " << trial;
  }
}

TEST(Tokenizer, TinyModelTokenizerFitsItsVocabulary) {
  const std::string dir = kFixtures + "/kimi-tiny-dense-first";  // models/kimi-linear-tiny
  const Tokenizer tok = Tokenizer::load(dir);
  std::ifstream config_file(dir + "/config.json");
  const auto config = nlohmann::json::parse(config_file);
  EXPECT_EQ(tok.vocab_size(), config["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok.bos_id(), config["bos_token_id"].get<int32_t>());
  EXPECT_EQ(tok.special_id("[EOS]"), config["eos_token_id"].get<int32_t>());
  EXPECT_EQ(tok.special_id("[PAD]"), config["pad_token_id"].get<int32_t>());
  std::ifstream in(kFixtures + "/tokenizer/tiny_expected.json");  // ids from pip tiktoken
  for (const auto& c : nlohmann::json::parse(in)) {
    const auto text = c["text"].get<std::string>();
    const std::vector<int32_t> ids = tok.encode(text, c["allow_special"].get<bool>());
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(tok.decode(ids), text);
  }
  for (int32_t id = 0; id < tok.vocab_size(); ++id) EXPECT_TRUE(tok.contains(id)) << id;
}

// Writes a tokenizer directory with the given files and returns the error that loading it raises.
std::string load_error(const std::string& name, const std::string& model, const std::string& config) {
  const std::string dir = kScratch + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tiktoken.model") << model;
  std::ofstream(dir + "/tokenizer_config.json") << config;
  try {
    Tokenizer::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string all_bytes_model() {
  std::string out;
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int b = 0; b < 256; ++b) {
    out += fmt::format("{}{}== {}\n", b64[b >> 2], b64[(b & 3) << 4], b);
  }
  return out;
}

TEST(TokenizerFiles, ErrorsNameTheFileAndLineOrField) {
  const std::string ok_model = all_bytes_model();
  const std::string ok_config =
      R"({"added_tokens_decoder": {"256": {"content": "<|end|>", "special": true}}})";
  EXPECT_EQ(load_error("ok", ok_model, ok_config), "");

  auto expect_error = [&](const std::string& name, const std::string& model, const std::string& config,
                          const std::vector<std::string>& parts) {
    const std::string err = load_error(name, model, config);
    for (const std::string& p : parts) EXPECT_NE(err.find(p), std::string::npos) << name << ": " << err;
  };
  expect_error("no_rank", ok_model + "SGk=\n", ok_config, {"tiktoken.model line 257", "base64 rank"});
  expect_error("bad_base64", ok_model + "S*k= 300\n", ok_config, {"line 257", "not valid base64"});
  expect_error("bad_rank", ok_model + "SGk= x12\n", ok_config, {"line 257", "rank 'x12'"});
  expect_error("huge_rank", ok_model + "SGk= 99999999999\n", ok_config, {"line 257", "0..16777215"});
  expect_error("dup_rank", ok_model + "SGk= 5\n", ok_config,
               {"line 257", "rank 5 is already used on line 6"});
  expect_error("dup_token", ok_model + "AA== 300\n", ok_config, {"line 257", "already has rank 0"});
  expect_error("missing_byte", ok_model.substr(ok_model.find('\n') + 1), ok_config, {"single byte 0x00"});
  expect_error("empty", "", ok_config, {"no tokens"});
  expect_error("json", ok_model, "{\"added_tokens_decoder\": ", {"tokenizer_config.json", "invalid JSON"});
  expect_error("key", ok_model, R"({"added_tokens_decoder": {"x1": {"content": "a"}}})",
               {"added_tokens_decoder[\"x1\"]", "token id"});
  expect_error("content", ok_model, R"({"added_tokens_decoder": {"300": {"content": ""}}})",
               {"added_tokens_decoder[\"300\"].content"});
  expect_error("special", ok_model, R"({"added_tokens_decoder": {"300": {"content": "a", "special": 1}}})",
               {"added_tokens_decoder[\"300\"].special"});
  expect_error("collide", ok_model, R"({"added_tokens_decoder": {"65": {"content": "<|x|>"}}})",
               {"reuses rank 65"});
  expect_error("same_content", ok_model,
               R"({"added_tokens_decoder": {"300": {"content": "<|x|>"}, "301": {"content": "<|x|>"}}})",
               {"same content '<|x|>'"});
  expect_error("eos", ok_model, R"({"added_tokens_decoder": {}, "eos_token": "<|nope|>"})",
               {"`eos_token` is '<|nope|>'"});
  EXPECT_NE(load_error("missing", "", "").find("tiktoken.model"), std::string::npos);
  EXPECT_THROW(Tokenizer::load(kScratch + "/does-not-exist"), Error);
}

TEST(TokenizerFiles, TheJinjaChatTemplateComesFromItsFileElseTheConfig) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(kScratch) / "jinja-template";
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_EQ(load_jinja_chat_template(dir.string()), std::nullopt);  // neither file
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{{ messages }}"})";
  EXPECT_EQ(load_jinja_chat_template(dir.string()), "{{ messages }}");
  std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}{{ m.content }}{% endfor %}";
  EXPECT_EQ(load_jinja_chat_template(dir.string()), "{% for m in messages %}{{ m.content }}{% endfor %}");
  fs::remove(dir / "chat_template.jinja");
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": [{"name": "default"}]})";
  EXPECT_EQ(load_jinja_chat_template(dir.string()), std::nullopt);  // a list of named templates: not one text
}

}  // namespace
}  // namespace hlm
