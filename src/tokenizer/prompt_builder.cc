// PromptBuilder and Python-compatible JSON text (see prompt_builder.h).
#include "tokenizer/prompt_builder.h"

#include "base/error.h"

namespace hlm {

void PromptBuilder::marker(std::string_view token) {
  const std::optional<int32_t> id = tok_.special_id(token);
  HLM_CHECK(id.has_value(), "the chat format needs the token '{}', which this tokenizer does not have",
            token);
  flush();
  ids_.push_back(*id);
  str_.append(token);
}

void PromptBuilder::marker_or_text(std::string_view token) {
  if (tok_.special_id(token)) {
    marker(token);
  } else {
    text(token);
  }
}

void PromptBuilder::flush() {
  if (pending_.empty()) return;
  const std::vector<int32_t> ids = tok_.encode(pending_, /*allow_special=*/false);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  str_.append(pending_);
  pending_.clear();
}

std::vector<int32_t> PromptBuilder::ids() {
  flush();
  return ids_;
}

const std::string& PromptBuilder::str() {
  flush();
  return str_;
}

namespace {

std::string scalar_json(const nlohmann::ordered_json& v) {
  return v.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::replace);
}

void append_json(std::string& out, const nlohmann::ordered_json& v, bool compact) {
  const char* item_sep = compact ? "," : ", ";
  const char* key_sep = compact ? ":" : ": ";
  if (v.is_object()) {
    out.push_back('{');
    bool first = true;
    for (const auto& [key, item] : v.items()) {
      if (!first) out.append(item_sep);
      first = false;
      out.append(scalar_json(key));
      out.append(key_sep);
      append_json(out, item, compact);
    }
    out.push_back('}');
  } else if (v.is_array()) {
    out.push_back('[');
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out.append(item_sep);
      append_json(out, v[i], compact);
    }
    out.push_back(']');
  } else {
    out.append(scalar_json(v));
  }
}

}  // namespace

std::string python_json(const nlohmann::ordered_json& value, bool compact) {
  std::string out;
  append_json(out, value, compact);
  return out;
}

}  // namespace hlm
