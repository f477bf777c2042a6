// Pretokenizer: splits text into the pieces BPE encodes, with a PCRE2 pattern compiled once with JIT.
// Matching is leftmost-first from a start offset, as tiktoken's find_iter; characters no alternative
// matches are skipped (the Kimi pattern matches every character, so none are). Safe to call from many
// threads: the match scratch space (match data, JIT stack) is per thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

struct pcre2_real_code_8;

namespace hlm {

class Pretokenizer {
 public:
  // Compiles `pattern` with PCRE2_UTF | PCRE2_UCP; a bad pattern is an error naming the offset.
  explicit Pretokenizer(const std::string& pattern);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // The next piece [*begin, *end) at or after `from` in `text` (valid UTF-8, `from` on a character
  // boundary); false when there is none.
  bool next(std::string_view text, size_t from, size_t* begin, size_t* end) const;

  bool jit() const { return jit_; }

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace hlm
