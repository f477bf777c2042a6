// TextOutput: a sequence's tokens as response text. Detokenizes incrementally (a UTF-8 character split
// across tokens is held until complete), leaves out special tokens when asked and the id that stopped
// the sequence, and applies the request's stop strings: text is released only once no stop string can
// begin in it, and a match ends the output right before the stop string (as vLLM and OpenAI do). Without
// a tokenizer there is no text: every call returns "".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace hlm {

class TextOutput {
 public:
  // include_stop: the stop string that matched, and the text of a stop id, stay in the output (vLLM's
  // include_stop_str_in_output).
  TextOutput(const Tokenizer* tokenizer, std::vector<std::string> stop, bool skip_special_tokens,
             bool include_stop = false);

  // The text this token releases. After a stop-string match, stopped() is true and later calls return "".
  std::string push(int32_t id, bool stop_token);
  // The end of the sequence: whatever was held back.
  std::string finish();
  bool stopped() const { return stopped_; }

  // The text of one token on its own, for log-probability entries (invalid UTF-8 replaced).
  std::string token_text(int32_t id) const;
  // The bytes of one token as the tokenizer has them (a piece of a UTF-8 character stays a piece);
  // nullopt without a tokenizer.
  std::optional<std::string> token_bytes(int32_t id) const;
  // Characters (code points) decoded so far, text held back for a stop string included: where the text
  // of the next token starts in the output.
  int64_t decoded_chars() const { return decoded_chars_; }

 private:
  std::string release(std::string text);

  const Tokenizer* tokenizer_;
  std::optional<StreamDecoder> decoder_;
  std::vector<std::string> stop_;
  bool skip_special_;
  bool include_stop_;
  std::string held_;  // decoded text that may be the start of a stop string
  int64_t decoded_chars_ = 0;
  bool stopped_ = false;
};

}  // namespace hlm
