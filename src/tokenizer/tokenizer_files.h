// Readers of the two tokenizer files of a model directory. Both are outside input: every error names the
// file and the line (tiktoken.model) or the field (tokenizer_config.json) at fault.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/rank_table.h"

namespace hlm {

// Ranks and added-token ids must stay below this (the Kimi vocabulary ends at 163,839); it bounds the
// tables a malformed file could make us allocate.
inline constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;

// tiktoken.model: one `base64(bytes) rank` per line (blank lines ignored), as tiktoken's
// load_tiktoken_bpe reads it. `source` names the file in errors.
RankTable parse_rank_file(std::string_view text, const std::string& source);
RankTable load_rank_file(const std::string& path);

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;  // HF's AddedToken default when the field is absent
};

struct TokenizerConfig {
  std::vector<AddedToken> added;  // added_tokens_decoder, by increasing id
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

// tokenizer_config.json: `added_tokens_decoder` ({"<id>": {"content": ..., "special": ...}}) and the
// `bos_token` / `eos_token` names (a string or {"content": ...}); other fields are ignored.
TokenizerConfig parse_tokenizer_config(std::string_view text, const std::string& source);
TokenizerConfig load_tokenizer_config(const std::string& path);

// The model's own Jinja chat template: `dir`/chat_template.jinja, else tokenizer_config.json's
// `chat_template` string; nullopt when neither exists. helixlm renders chats in C++ (chat_template.h); the
// text is for clients that render themselves (the server's /tokenizer_info).
std::optional<std::string> load_jinja_chat_template(const std::string& dir);

// The whole file, or an error naming it.
std::string read_text_file(const std::string& path);

}  // namespace hlm
