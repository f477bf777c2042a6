// The renderers behind ChatTemplate, one per format (chat_kimi.cc, chat_k3.cc).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/prompt_builder.h"

namespace hlm {

void render_kimi_linear(PromptBuilder& out, const std::vector<ChatMessage>& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const std::string& default_system_prompt);

void render_k3(PromptBuilder& out, const std::vector<ChatMessage>& messages,
               const nlohmann::ordered_json& tools, bool add_generation_prompt, const K3Options& options);

// A message's role with OpenAI's "developer" read as "system"; an unknown role, or tool calls on a
// message that is not the assistant's, is an error naming the message.
std::string checked_role(const ChatMessage& m, size_t index);

// Whether `tools` declares anything (null, an empty array or an empty object do not).
bool has_tools(const nlohmann::ordered_json& tools);

}  // namespace hlm
