// libFuzzer target for the tokenizer's outside input: the first byte picks what the rest is.
//   0: a tiktoken.model file, 1: a tokenizer_config.json; either may only succeed or raise hlm::Error.
//   else: text for the tiny model's tokenizer (special tokens allowed when the byte is odd), which must
//   round-trip (decode(encode(x)) == to_valid_utf8(x)), stream-decode to the same text, and go through
//   both output parsers in two chunks without failing.
// Any other outcome (a crash, a sanitizer report, another exception, a broken invariant) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "base/utf8.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void fuzz_text(std::string_view text, bool allow_special) {
  static const hlm::Tokenizer tok =
      hlm::Tokenizer::load(std::string(HLM_FIXTURES_DIR) + "/kimi-tiny-dense-first");
  const std::vector<int32_t> ids = tok.encode(text, allow_special);
  const std::string valid = hlm::to_valid_utf8(text);
  check(tok.decode(ids) == valid);
  hlm::StreamDecoder dec(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += dec.push(id);
  streamed += dec.flush();
  check(streamed == valid);
  for (hlm::ChatFormat f : {hlm::ChatFormat::kKimiLinear, hlm::ChatFormat::kK3}) {
    hlm::OutputParser parser(f, true, true);
    const size_t cut = valid.size() / 2;
    parser.push(std::string_view(valid).substr(0, cut));
    parser.push(std::string_view(valid).substr(cut));
    parser.finish();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] == 0) {
      hlm::parse_rank_file(rest, "fuzz/tiktoken.model");
    } else if (data[0] == 1) {
      hlm::parse_tokenizer_config(rest, "fuzz/tokenizer_config.json");
    } else {
      fuzz_text(rest, data[0] & 1);
    }
  } catch (const hlm::Error&) {
  }
  return 0;
}
