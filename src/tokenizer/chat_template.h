// Chat formats: native renderers of the Kimi chat templates into token ids (Debian has no Jinja engine).
// Markers are emitted as special ids; every piece of text from a user, a tool or a tool schema is
// encoded with special tokens disallowed, so a message cannot forge a marker.
//
// kKimiLinear (Kimi Linear / K2, `im_*` tokens):
//   [<|im_system|>tool_declare<|im_middle|>{tools JSON}<|im_end|>]
//   [<|im_system|>system<|im_middle|>{default system prompt}<|im_end|>]   when set and no system message
//   <|im_system|>system<|im_middle|>…<|im_end|>   <|im_user|>user<|im_middle|>…<|im_end|>
//   <|im_assistant|>assistant<|im_middle|>[<think>…</think>]…[tool calls]<|im_end|>
//   <|im_system|>tool<|im_middle|>## Return of {tool_call_id}\n…<|im_end|>
//   generation prompt <|im_assistant|>assistant<|im_middle|>; a message's `name` replaces the role word.
// kK3 (Kimi K3 "XTML"): <|open|>message role="user"<|sep|>…<|close|>message<|sep|><|end_of_msg|>, with
//   think/response/tools channels in assistant turns (chat_k3.cc describes the whole grammar).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace hlm {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool
  std::string content;
  std::string reasoning_content;     // assistant, optional
  std::vector<ToolCall> tool_calls;  // assistant, optional
  std::string tool_call_id;          // role tool
  std::string name;                  // optional
};

enum class ChatFormat { kKimiLinear, kK3 };

// Picks the format from the model directory: config.json `model_type` "kimi_k3", or K3's `<|open|>`
// marker among the added tokens of tokenizer_config.json, selects kK3; anything else (including a missing
// file) is Kimi Linear.
ChatFormat detect_chat_format(const std::string& model_dir);

const char* chat_format_name(ChatFormat format);

// K3 settings (ignored by Kimi Linear). thinking: the generation prompt opens the think channel (the
// model's default) and past assistant turns carry their think channel; thinking_effort: "low", "medium",
// "high", "max" or "" (no effort message); tool_choice: "required" or "none" add K3's instruction
// message, "" or "auto" add nothing.
struct K3Options {
  bool thinking = true;
  std::string thinking_effort = "max";
  std::string tool_choice;
};

class ChatTemplate {
 public:
  // Errors name the marker token the tokenizer lacks for `format`.
  ChatTemplate(const Tokenizer& tok, ChatFormat format, std::string default_system_prompt = "");

  // tools: the OpenAI `tools` array (nlohmann::json, may be null/empty). Bad messages (unknown role, a
  // tool call without a name, ...) are errors naming the message index and field.
  std::vector<int32_t> render(const std::vector<ChatMessage>& messages, const nlohmann::json& tools,
                              bool add_generation_prompt) const;
  // The same with the tools' keys in the client's order: Kimi Linear serializes the schemas as given
  // (transformers' tojson keeps insertion order), which nlohmann::json (sorted keys) cannot reproduce.
  // Parse the request with nlohmann::ordered_json and call this to match transformers byte for byte.
  std::vector<int32_t> render_ordered(const std::vector<ChatMessage>& messages,
                                      const nlohmann::ordered_json& tools, bool add_generation_prompt) const;
  // The rendered prompt as text (markers as their strings), for logs, /apply-template and tests.
  std::string render_text(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                          bool add_generation_prompt) const;

  std::vector<int32_t> stop_ids() const;  // ids that end an assistant turn (<|im_end|> / <|end_of_msg|>)

  ChatFormat format() const { return format_; }
  void set_k3_options(K3Options options) { k3_ = std::move(options); }
  const K3Options& k3_options() const { return k3_; }
  // Whether generated text starts inside a reasoning channel (K3 with thinking on); pass this as the
  // OutputParser's parse_reasoning so the parser's start state matches the prompt.
  bool generation_starts_in_reasoning() const { return format_ == ChatFormat::kK3 && k3_.thinking; }

 private:
  Tokenizer tok_;
  ChatFormat format_;
  std::string default_system_prompt_;
  K3Options k3_;
};

}  // namespace hlm
