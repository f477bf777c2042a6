// Output parser for the Kimi Linear / K2 format, the behaviour of vLLM's and SGLang's `kimi_k2` tool and
// reasoning parsers: reasoning is `<think>…</think>` at the start of the output (ended early by a
// tool-call section); calls are
//   <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
//   {"city": "Beijing"}<|tool_call_end|>…<|tool_calls_section_end|>
// The call id is kept as the model wrote it; the name is what ^(?:functions\.)?([\w.]+):(\d+)$ captures
// in it. Arguments are the JSON text, trimmed. A malformed call (an id that does not match, no
// <|tool_call_argument_begin|>, or another call or the section's end before <|tool_call_end|>) yields no
// tool call, and its text is dropped like the rest of the section, as those parsers do.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>

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

// The name in a call id `functions.{name}:{index}` (the prefix is optional), or nullopt for an id of
// another shape. \w and \d are Unicode's, as in Python's re, so a name may be 你好.
std::optional<std::string> name_from_id(const std::string& id) {
  static const std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> re = [] {
    const char* pattern = R"(^(?:functions\.)?([\w.]+):(\d+)$)";
    int error = 0;
    PCRE2_SIZE offset = 0;
    return std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)>(
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error, &offset, nullptr),
        &pcre2_code_free);
  }();
  const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(re.get(), nullptr), &pcre2_match_data_free);
  // Invalid UTF-8 is an error code here, so it counts as no match.
  if (pcre2_match(re.get(), reinterpret_cast<PCRE2_SPTR>(id.data()), id.size(), 0, 0, match.get(), nullptr) <
      0)
    return std::nullopt;
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
  return id.substr(ov[2], ov[3] - ov[2]);
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
      state_ = State::kContent;  // a call still open is malformed: dropped
      partial_.clear();
    } else if (m == kCallBegin) {
      state_ = State::kCallId;  // likewise a call still open
      id_.clear();
      args_.clear();
      partial_ = m;
    } else if (m == kArgBegin) {
      state_ = State::kCallArgs;
      partial_.append(m);
    } else if (m == kCallEnd) {
      const std::string id = trim(id_);
      const std::optional<std::string> name = name_from_id(id);
      if (state_ == State::kCallArgs && name) emit_call_with_id(id, *name, trim(args_), out);
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
  std::vector<std::string> id_markers_ = {kArgBegin, kCallEnd, kCallBegin, kSectionEnd};
  std::vector<std::string> args_markers_ = {kCallEnd, kCallBegin, kSectionEnd};
  std::string id_, args_;
  std::string partial_;  // the raw text of the call being read
};

}  // namespace

std::unique_ptr<OutputParser::Impl> make_kimi_output_parser(bool parse_tools, bool parse_reasoning) {
  return std::make_unique<KimiOutputParser>(parse_tools, parse_reasoning);
}

}  // namespace hlm
