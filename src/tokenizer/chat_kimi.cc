// The Kimi Linear / K2 chat format (`im_*` tokens), written from the published templates: Kimi-K2's
// chat_template.jinja (tool declaration first, `name` replacing the role word, tool results as
// "## Return of {id}") and Kimi-K2-Thinking's (<think>…</think> before the content, ids
// `functions.{name}:{n}` for calls that carry none). Kimi Linear adds no default system prompt (its
// transformers ids, MODEL.md §10, start with <|im_user|>); the prompt is a setting.
#include "base/error.h"
#include "tokenizer/chat_formats.h"

namespace hlm {

namespace {

void open_turn(PromptBuilder& out, const std::string& role, const std::string& name) {
  out.marker(role == "user" ? "<|im_user|>" : role == "assistant" ? "<|im_assistant|>" : "<|im_system|>");
  out.text(name.empty() ? role : name);
  out.marker("<|im_middle|>");
}

}  // namespace

void render_kimi_linear(PromptBuilder& out, const std::vector<ChatMessage>& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const std::string& default_system_prompt) {
  if (has_tools(tools)) {
    out.marker("<|im_system|>");
    out.text("tool_declare");
    out.marker("<|im_middle|>");
    out.text(python_json(tools, /*compact=*/true));
    out.marker("<|im_end|>");
  }
  if (!default_system_prompt.empty() && (messages.empty() || checked_role(messages[0], 0) != "system")) {
    open_turn(out, "system", "");
    out.text(default_system_prompt);
    out.marker("<|im_end|>");
  }
  std::vector<std::string> pending_call_ids;  // calls not yet answered, for tool messages without an id
  int unnamed_calls = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string role = checked_role(m, i);
    open_turn(out, role, m.name);
    if (role == "assistant") {
      if (!m.reasoning_content.empty()) {
        out.marker_or_text("<think>");
        out.text(m.reasoning_content);
        out.marker_or_text("</think>");
      }
      out.text(m.content);
      if (!m.tool_calls.empty()) {
        out.marker("<|tool_calls_section_begin|>");
        for (size_t c = 0; c < m.tool_calls.size(); ++c) {
          const ToolCall& call = m.tool_calls[c];
          HLM_CHECK(!call.name.empty() || !call.id.empty(),
                    "messages[{}].tool_calls[{}]: a call needs a name or an id", i, c);
          const std::string id =
              call.id.empty() ? "functions." + call.name + ":" + std::to_string(unnamed_calls++) : call.id;
          pending_call_ids.push_back(id);
          out.marker("<|tool_call_begin|>");
          out.text(id);
          out.marker("<|tool_call_argument_begin|>");
          out.text(call.arguments.empty() ? "{}" : call.arguments);
          out.marker("<|tool_call_end|>");
        }
        out.marker("<|tool_calls_section_end|>");
      }
    } else if (role == "tool") {
      std::string id = m.tool_call_id;
      if (id.empty()) {
        HLM_CHECK(!pending_call_ids.empty(),
                  "messages[{}].tool_call_id is missing and no earlier tool call is "
                  "left to answer",
                  i);
        id = pending_call_ids.front();
      }
      std::erase(pending_call_ids, id);
      out.text("## Return of " + id + "\n" + m.content);
    } else {
      out.text(m.content);
    }
    out.marker("<|im_end|>");
  }
  if (add_generation_prompt) open_turn(out, "assistant", "");
}

}  // namespace hlm
