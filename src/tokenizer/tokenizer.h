// Tokenizer: tiktoken-style byte-level BPE over the Kimi vocabulary (docs/architecture.md, "Tokenizer").
// A model directory carries `tiktoken.model` (one `base64(bytes) rank` per line; a token's id is its
// rank) and `tokenizer_config.json` (`added_tokens_decoder`: the special and other added tokens with
// their ids). Encoding follows Moonshot's tokenization_kimi.py on top of tiktoken bit for bit: the text
// is cut into runs (at most 400,000 characters, and no run of more than 25,000 consecutive whitespace or
// non-whitespace characters), special tokens are found first when allowed, the gaps are split with the
// Kimi pre-tokenizer pattern (PCRE2, JIT), and each piece is merged by rank.
//
// Text that comes from users or tools is encoded with special tokens disallowed (the default): a typed
// "<|im_end|>" stays ordinary text. Only the chat formatter emits special ids.
//
// A Tokenizer is immutable after load, cheap to copy (it shares its tables) and safe to use from many
// threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hlm {

class Tokenizer {
 public:
  // Loads `dir`/tiktoken.model and `dir`/tokenizer_config.json; errors name the file and line or field.
  static Tokenizer load(const std::string& dir);
  // The same from two explicit paths (tests pair a rank file with a config kept elsewhere).
  static Tokenizer load_files(const std::string& model_file, const std::string& config_file);

  // Input that is not valid UTF-8 is first repaired as Python's bytes.decode("utf-8", "replace") does
  // (each maximal invalid subpart becomes U+FFFD), so encode(b) == tiktoken's encode(b.decode(...)).
  // allow_special: special-token strings in `text` become their ids (tiktoken allowed_special="all");
  // otherwise they are ordinary text.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  // The bytes of the ids concatenated; special and other added tokens decode to their text. The result
  // may end inside a UTF-8 sequence (use StreamDecoder or to_valid_utf8 for display). An id outside the
  // vocabulary is an error naming it.
  std::string decode(const std::vector<int32_t>& ids) const;

  // The id of an added token by its text, e.g. "<|im_end|>" (special or not).
  std::optional<int32_t> special_id(std::string_view token) const;
  // True for added tokens marked "special" in tokenizer_config.json (what skip_special_tokens removes).
  // The Kimi tool-call markers are added tokens with special=false: is_special is false for them.
  bool is_special(int32_t id) const;
  // True for every added token (special or not): ids that come from the config, not the rank file.
  bool is_added(int32_t id) const;
  // True when `id` decodes to something (a rank of tiktoken.model or an added token).
  bool contains(int32_t id) const;
  // The bytes one id decodes to; an id outside the vocabulary is an error naming it.
  std::string_view token_bytes(int32_t id) const;
  int64_t vocab_size() const;  // highest id + 1

  // tokenizer_config.json `bos_token` / `eos_token` when present and added tokens.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

// Streaming detokenization: push() returns the text that became complete with this id; a UTF-8 sequence
// split across ids is held back until its last byte arrives. Bytes that can never become valid UTF-8 are
// replaced by U+FFFD at once, so the concatenation of every push() and flush() equals
// to_valid_utf8(tok.decode(ids)).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok);
  std::string push(int32_t id);
  std::string flush();  // whatever is held back at the end (an incomplete sequence becomes U+FFFD)

 private:
  Tokenizer tok_;
  std::string pending_;
};

}  // namespace hlm
