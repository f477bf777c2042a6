// Output parser for the Kimi Linear / K2 format, the behaviour of vLLM's and SGLang's `kimi_k2` tool and
// reasoning parsers: reasoning is `<think>…</think>` at the start of the output (ended early by a
// tool-call section); calls are
//   <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
//   {"city": "Beijing"}<|tool_call_end|>…<|tool_calls_section_end|>
// The call id is kept as the model wrote it; the name is the id without its `functions.` prefix and `:n`
// suffix (what ^(?:functions\.)?([\w.]+):(\d+)$ captures). Arguments are the JSON text, trimmed.
#include "tokenizer/channel_parser.h"

namespace hlm {

namespace {

constexpr const char* kThinkOpen = "<think>";
constexpr const char* kThinkClose = "</think>";
constexpr const char* kSectionBegin = "<|tool_calls_section_begin|>";
constexpr const char* kSectionEnd = "<|tool_calls_section_end|>";
constexpr const char* kCallBegin = "<|tool_call_begin|>";
constexpr const char* kArgBegin = "<|tool_call_argument_begin|>";
constexpr const char* kCallEnd = "<|tool_call_end|>";

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1));
}

// The name in `functions.{name}:{index}`: the id without the `functions.` prefix and the `:{digits}`
// suffix (either may be missing).
std::string name_from_id(const std::string& id) {
  std::string name = id.rfind("functions.", 0) == 0 ? id.substr(10) : id;
  const size_t colon = name.rfind(':');
  if (colon != std::string::npos && colon + 1 < name.size() &&
      name.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
    name.resize(colon);
  }
  return name;
}

class KimiOutputParser : public OutputParser::Impl {
 public:
  KimiOutputParser(bool parse_tools, bool parse_reasoning)
      : state_(parse_reasoning ? State::kStart : State::kContent) {
    if (parse_tools) {
      reasoning_markers_ = {kThinkClose, kSectionBegin};
      content_markers_ = {kSectionBegin};
    } else {
      reasoning_markers_ = {kThinkClose};
    }
    // At the start a <think> may open reasoning; the content markers apply too, since text that
    // comes first moves the parser to kContent in the middle of a chunk.
    start_markers_.insert(start_markers_.end(), content_markers_.begin(), content_markers_.end());
  }

 protected:
  enum class State { kStart, kReasoning, kContent, kSection, kCallId, kCallArgs };

  const std::vector<std::string>& markers() const override {
    switch (state_) {
      case State::kStart:
        return start_markers_;
      case State::kReasoning:
        return reasoning_markers_;
      case State::kContent:
        return content_markers_;
      case State::kSection:
        return section_markers_;
      case State::kCallId:
        return id_markers_;
      case State::kCallArgs:
        return args_markers_;
    }
    return content_markers_;
  }

  void on_text(std::string_view text, ParsedDelta& out) override {
    switch (state_) {
      case State::kStart:  // text before any <think>: no reasoning block
        state_ = State::kContent;
        out.content.append(text);
        break;
      case State::kReasoning:
        out.reasoning_content.append(text);
        break;
      case State::kContent:
        out.content.append(text);
        break;
      case State::kSection:  // whitespace between calls
        break;
      case State::kCallId:
        id_.append(text);
        partial_.append(text);
        break;
      case State::kCallArgs:
        args_.append(text);
        partial_.append(text);
        break;
    }
  }

  void on_marker(const std::string& m, ParsedDelta& out) override {
    if (m == kThinkOpen) {
      // Reasoning only when <think> opens the output; later it is ordinary text.
      if (state_ == State::kStart) {
        state_ = State::kReasoning;
      } else {
        out.content.append(m);
      }
    } else if (m == kThinkClose) {
      state_ = State::kContent;
    } else if (m == kSectionBegin) {
      state_ = State::kSection;
    } else if (m == kSectionEnd) {
      state_ = State::kContent;
    } else if (m == kCallBegin) {
      state_ = State::kCallId;
      id_.clear();
      args_.clear();
      partial_ = m;
    } else if (m == kArgBegin) {
      state_ = State::kCallArgs;
      partial_.append(m);
    } else if (m == kCallEnd) {
      const std::string id = trim(id_);
      emit_call_with_id(id, name_from_id(id), trim(args_), out);
      state_ = State::kSection;
      partial_.clear();
    }
  }

  void on_finish(ParsedDelta& out) override {
    // An unfinished call (generation cut short) is returned as text rather than lost.
    if (state_ == State::kCallId || state_ == State::kCallArgs) out.content.append(partial_);
    partial_.clear();
  }

 private:
  State state_;
  std::vector<std::string> start_markers_ = {kThinkOpen};
  std::vector<std::string> reasoning_markers_;
  std::vector<std::string> content_markers_;
  std::vector<std::string> section_markers_ = {kCallBegin, kSectionEnd};
  std::vector<std::string> id_markers_ = {kArgBegin, kCallEnd};
  std::vector<std::string> args_markers_ = {kCallEnd};
  std::string id_, args_;
  std::string partial_;  // the raw text of the call being read
};

}  // namespace

std::unique_ptr<OutputParser::Impl> make_kimi_output_parser(bool parse_tools, bool parse_reasoning) {
  return std::make_unique<KimiOutputParser>(parse_tools, parse_reasoning);
}

}  // namespace hlm
