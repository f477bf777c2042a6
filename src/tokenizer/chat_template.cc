// ChatTemplate: format detection, dispatch to the renderers, stop ids (see chat_template.h).
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "tokenizer/chat_formats.h"

namespace hlm {

namespace {

nlohmann::json read_json_or_null(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) return nullptr;
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return doc.is_discarded() ? nlohmann::json(nullptr) : doc;
}

const char* const kKimiMarkers[] = {"<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                                    "<|im_end|>"};
const char* const kK3Markers[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};

}  // namespace

std::string checked_role(const ChatMessage& m, size_t index) {
  if (m.role == "developer") return "system";
  HLM_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool",
            "messages[{}].role is '{}'; valid: system, user, assistant, tool (or developer)", index, m.role);
  HLM_CHECK(m.tool_calls.empty() || m.role == "assistant",
            "messages[{}].tool_calls: only assistant messages carry tool calls (this one is '{}')", index,
            m.role);
  return m.role;
}

bool has_tools(const nlohmann::ordered_json& tools) { return !tools.is_null() && !tools.empty(); }

ChatFormat detect_chat_format(const std::string& model_dir) {
  const nlohmann::json config = read_json_or_null(model_dir + "/config.json");
  if (config.is_object() && config.value("model_type", "") == "kimi_k3") return ChatFormat::kK3;
  const nlohmann::json tok = read_json_or_null(model_dir + "/tokenizer_config.json");
  if (tok.is_object() && tok.contains("added_tokens_decoder") && tok["added_tokens_decoder"].is_object()) {
    for (const auto& [id, t] : tok["added_tokens_decoder"].items()) {
      if (t.is_object() && t.value("content", "") == "<|open|>") return ChatFormat::kK3;
    }
  }
  return ChatFormat::kKimiLinear;
}

const char* chat_format_name(ChatFormat format) {
  return format == ChatFormat::kK3 ? "kimi_k3" : "kimi_linear";
}

ChatTemplate::ChatTemplate(const Tokenizer& tok, ChatFormat format, std::string default_system_prompt)
    : tok_(tok), format_(format), default_system_prompt_(std::move(default_system_prompt)) {
  auto check = [&](const auto& markers) {
    for (const char* m : markers) {
      HLM_CHECK(tok_.special_id(m).has_value(),
                "the {} chat format needs the token '{}', which this tokenizer "
                "does not have",
                chat_format_name(format_), m);
    }
  };
  if (format_ == ChatFormat::kK3) {
    check(kK3Markers);
  } else {
    check(kKimiMarkers);
  }
}

std::vector<int32_t> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                          const nlohmann::json& tools, bool add_generation_prompt) const {
  const std::string text = tools.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return render_ordered(messages, nlohmann::ordered_json::parse(text), add_generation_prompt);
}

namespace {

void render_into(PromptBuilder& out, ChatFormat format, const std::vector<ChatMessage>& messages,
                 const nlohmann::ordered_json& tools, bool add_generation_prompt,
                 const std::string& system_prompt, const K3Options& k3) {
  HLM_CHECK(tools.is_null() || tools.is_array(), "`tools` must be an array (found {})", tools.type_name());
  if (format == ChatFormat::kK3) {
    render_k3(out, messages, tools, add_generation_prompt, k3);
  } else {
    render_kimi_linear(out, messages, tools, add_generation_prompt, system_prompt);
  }
}

}  // namespace

std::vector<int32_t> ChatTemplate::render_ordered(const std::vector<ChatMessage>& messages,
                                                  const nlohmann::ordered_json& tools,
                                                  bool add_generation_prompt) const {
  PromptBuilder out(tok_);
  render_into(out, format_, messages, tools, add_generation_prompt, default_system_prompt_, k3_);
  return out.ids();
}

std::string ChatTemplate::render_text(const std::vector<ChatMessage>& messages,
                                      const nlohmann::ordered_json& tools, bool add_generation_prompt) const {
  PromptBuilder out(tok_);
  render_into(out, format_, messages, tools, add_generation_prompt, default_system_prompt_, k3_);
  return out.str();
}

std::vector<int32_t> ChatTemplate::stop_ids() const {
  std::vector<int32_t> ids = {*tok_.special_id(format_ == ChatFormat::kK3 ? "<|end_of_msg|>" : "<|im_end|>")};
  if (const auto eos = tok_.eos_id(); eos && *eos != ids[0]) ids.push_back(*eos);
  if (const auto eos = tok_.special_id("[EOS]");
      eos && std::find(ids.begin(), ids.end(), *eos) == ids.end()) {
    ids.push_back(*eos);
  }
  return ids;
}

}  // namespace hlm
