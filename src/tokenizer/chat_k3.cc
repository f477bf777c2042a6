// The Kimi K3 chat format ("XTML"), written from its published description (ECOSYSTEM.md §3) and the
// public renderings of it (llama.cpp models/templates/Kimi-K3.jinja, vLLM's K3 renderer and tool parser):
//   <|open|>message role="user"<|sep|>…<|close|>message<|sep|><|end_of_msg|>
// Assistant turns hold a think channel (when thinking is on), a response channel and, for calls, a tools
// channel of <|open|>call tool="f" index="1"<|sep|> blocks with one argument block per key (strings raw,
// other values as JSON). Tool results follow their calls' order when every result names its call.
// Tool schemas are declared with sorted keys. Not rendered: images, response_format, dynamic tool
// declarations in system messages.
#include <algorithm>

#include "base/error.h"
#include "tokenizer/chat_formats.h"

namespace hlm {

namespace {

std::string escape_attr(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

using Attrs = std::vector<std::pair<std::string, std::string>>;

void open_tag(PromptBuilder& out, const std::string& tag, const Attrs& attrs = {}) {
  out.marker("<|open|>");
  std::string head = tag;
  for (const auto& [k, v] : attrs) head += " " + k + "=\"" + escape_attr(v) + "\"";
  out.text(head);
  out.marker("<|sep|>");
}

void close_tag(PromptBuilder& out, const std::string& tag) {
  out.marker("<|close|>");
  out.text(tag);
  out.marker("<|sep|>");
}

void end_message(PromptBuilder& out) {
  close_tag(out, "message");
  out.marker("<|end_of_msg|>");
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1);
}

void internal_system_message(PromptBuilder& out, const std::string& type, const std::string& body) {
  open_tag(out, "message", {{"role", "system"}, {"type", type}});
  out.text(trim(body));
  end_message(out);
}

Attrs message_attrs(const std::string& role, const ChatMessage& m) {
  Attrs a = {{"role", role}};
  if (!m.name.empty()) a.emplace_back("name", m.name);
  return a;
}

std::string xtml_type(const nlohmann::ordered_json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

void render_call(PromptBuilder& out, const ToolCall& call, size_t index) {
  open_tag(out, "call", {{"tool", call.name}, {"index", std::to_string(index)}});
  const nlohmann::ordered_json args = nlohmann::ordered_json::parse(call.arguments, nullptr, false);
  if (args.is_object()) {
    for (const auto& [key, value] : args.items()) {
      open_tag(out, "argument", {{"key", key}, {"type", xtml_type(value)}});
      out.text(value.is_string() ? value.get<std::string>() : python_json(value, /*compact=*/false));
      close_tag(out, "argument");
    }
  } else if (!trim(call.arguments).empty()) {
    open_tag(out, "json", {{"type", "object"}});
    out.text(call.arguments);
    close_tag(out, "json");
  }
  close_tag(out, "call");
}

void render_assistant(PromptBuilder& out, const ChatMessage& m, size_t index, bool thinking) {
  open_tag(out, "message", message_attrs("assistant", m));
  if (thinking) {
    open_tag(out, "think");
    if (!trim(m.reasoning_content).empty()) out.text(m.reasoning_content);
    close_tag(out, "think");
  }
  open_tag(out, "response");
  out.text(m.content);
  close_tag(out, "response");
  if (!m.tool_calls.empty()) {
    open_tag(out, "tools");
    for (size_t c = 0; c < m.tool_calls.size(); ++c) {
      HLM_CHECK(!m.tool_calls[c].name.empty(),
                "messages[{}].tool_calls[{}]: Kimi K3 tool calls need a function name", index, c);
      render_call(out, m.tool_calls[c], c + 1);
    }
    close_tag(out, "tools");
  }
  end_message(out);
}

// A run of tool results after an assistant turn: in the calls' order when every result names a call
// of that turn by id, else as given; the tool name comes from the matching call, the message's name,
// or the call at the same position.
void render_tool_results(PromptBuilder& out, const std::vector<ChatMessage>& messages, size_t begin,
                         size_t end, const std::vector<ToolCall>& calls) {
  auto call_of = [&](const ChatMessage& m) -> const ToolCall* {
    for (const ToolCall& c : calls) {
      if (!m.tool_call_id.empty() && c.id == m.tool_call_id) return &c;
    }
    return nullptr;
  };
  std::vector<size_t> order;
  for (size_t i = begin; i < end; ++i) order.push_back(i);
  const bool all_resolved =
      std::all_of(order.begin(), order.end(), [&](size_t i) { return call_of(messages[i]); });
  if (all_resolved) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return call_of(messages[a]) - calls.data() < call_of(messages[b]) - calls.data();
    });
  }
  for (size_t k = 0; k < order.size(); ++k) {
    const ChatMessage& m = messages[order[k]];
    std::string name;
    if (const ToolCall* c = call_of(m)) {
      name = c->name;
    } else if (!m.name.empty()) {
      name = m.name;
    } else if (k < calls.size()) {
      name = calls[k].name;
    }
    HLM_CHECK(!name.empty(),
              "messages[{}]: a Kimi K3 tool result needs a tool name: a tool_call_id of the "
              "preceding assistant turn's calls, or `name`",
              order[k]);
    open_tag(out, "message", {{"role", "tool"}, {"tool", name}, {"index", std::to_string(k + 1)}});
    out.text(m.content);
    end_message(out);
  }
}

}  // namespace

void render_k3(PromptBuilder& out, const std::vector<ChatMessage>& messages,
               const nlohmann::ordered_json& tools, bool add_generation_prompt, const K3Options& options) {
  const std::string& effort = options.thinking_effort;
  HLM_CHECK(effort.empty() || effort == "low" || effort == "medium" || effort == "high" || effort == "max",
            "thinking_effort '{}': Kimi K3 supports low, medium, high and max", effort);
  if (has_tools(tools)) {
    open_tag(out, "message", {{"role", "system"}, {"type", "tool-declare"}});
    // Sorted keys at every level: nlohmann::json's own order.
    out.text(
        "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" +
        nlohmann::json::parse(tools.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace))
            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
        "\n```");
    end_message(out);
  }
  if (options.thinking && !effort.empty()) {
    internal_system_message(
        out, "thinking-effort",
        "`thinking_effort` guides on how much to think in your thinking channel (not including "
        "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
        "Now the system is invoked with `thinking_effort=" +
            effort + "`.");
  }
  const std::vector<ToolCall> no_calls;
  const std::vector<ToolCall>* calls = &no_calls;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string role = checked_role(m, i);
    if (role == "assistant") {
      render_assistant(out, m, i, options.thinking);
      calls = &m.tool_calls;
    } else if (role == "tool") {
      size_t end = i;
      while (end < messages.size() && checked_role(messages[end], end) == "tool") ++end;
      render_tool_results(out, messages, i, end, *calls);
      i = end - 1;
    } else {
      open_tag(out, "message", message_attrs(role, m));
      out.text(m.content);
      end_message(out);
    }
  }
  if (options.tool_choice == "required") {
    internal_system_message(
        out, "tool-choice",
        "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next "
        "message.");
  } else if (options.tool_choice == "none") {
    internal_system_message(
        out, "tool-choice",
        "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next "
        "message.");
  }
  if (add_generation_prompt) {
    open_tag(out, "message", {{"role", "assistant"}});
    open_tag(out, options.thinking ? "think" : "response");
  }
}

}  // namespace hlm
