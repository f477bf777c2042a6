// PromptBuilder: assembles a chat prompt from marker tokens and text. Markers become their special ids;
// consecutive text pieces are joined and encoded together with special tokens disallowed, exactly as
// tiktoken encodes the text between two special tokens of the rendered template, so typed marker
// strings stay text. It also keeps the prompt as a string (markers as their text) for logs and tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace hlm {

class PromptBuilder {
 public:
  explicit PromptBuilder(const Tokenizer& tok) : tok_(tok) {}

  // A special token by its text; an error naming it when the vocabulary has no such token.
  void marker(std::string_view token);
  // A marker when the vocabulary has it as an added token, text otherwise (e.g. <think>).
  void marker_or_text(std::string_view token);
  void text(std::string_view s) { pending_.append(s); }

  std::vector<int32_t> ids();  // the whole prompt so far
  const std::string& str();    // the same as text

 private:
  void flush();

  const Tokenizer& tok_;
  std::string pending_;  // text not yet encoded
  std::vector<int32_t> ids_;
  std::string str_;
};

// JSON text as Python's json.dumps(value, ensure_ascii=False) writes it (what transformers' `tojson`
// filter emits): keys in the object's order, separators (',', ':') when compact, else (', ', ': ').
// Strings that are not valid UTF-8 have their bad bytes replaced by U+FFFD.
std::string python_json(const nlohmann::ordered_json& value, bool compact);

}  // namespace hlm
