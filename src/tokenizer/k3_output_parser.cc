// Output parser for the Kimi K3 format, the behaviour of vLLM's K3 tool parser on a stream. Text is
// routed by channel: the think channel is reasoning (generation starts inside it when the prompt opened
// it), the response channel is content, and the tools channel holds calls
//   <|open|>call tool="f" index="1"<|sep|><|open|>argument key="k" type="string"<|sep|>v
//   <|close|>argument<|sep|>…<|close|>call<|sep|>
// whose arguments become a JSON object: string values raw, other types parsed as JSON (raw text when
// they do not parse), written as Python's json.dumps does; a <|open|>json…<|sep|> block is taken as the
// arguments text itself. Attribute values are unescaped (&quot; then &amp;). Structural markers outside
// the channels (<|close|>message<|sep|>, <|end_of_msg|>) are dropped. A malformed call (no tool name, an
// argument without a key) yields no tool call; like all of the tools channel, its text is not content.
#include "tokenizer/channel_parser.h"
#include "tokenizer/prompt_builder.h"

namespace hlm {

namespace {

const std::string kThinkOpen = "<|open|>think<|sep|>";
const std::string kThinkClose = "<|close|>think<|sep|>";
const std::string kResponseOpen = "<|open|>response<|sep|>";
const std::string kResponseClose = "<|close|>response<|sep|>";
const std::string kToolsOpen = "<|open|>tools<|sep|>";
const std::string kToolsClose = "<|close|>tools<|sep|>";
const std::string kMessageClose = "<|close|>message<|sep|>";
const std::string kEndOfMessage = "<|end_of_msg|>";
const std::string kCallOpen = "<|open|>call";
const std::string kCallClose = "<|close|>call<|sep|>";
const std::string kArgOpen = "<|open|>argument";
const std::string kArgClose = "<|close|>argument<|sep|>";
const std::string kJsonOpen = "<|open|>json";
const std::string kJsonClose = "<|close|>json<|sep|>";
const std::string kSep = "<|sep|>";

std::string unescape_attr(std::string v) {
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"&quot;", "\""}, {"&amp;", "&"}}) {
    for (size_t p = v.find(from); p != std::string::npos; p = v.find(from, p + to.size()))
      v.replace(p, from.size(), to);
  }
  return v;
}

// The value of `key` among the head's `name="value"` attributes (unescaped), or "". Values never hold a
// '"' (the template escapes it), so the attributes are read left to right.
std::string attr(const std::string& head, const std::string& key) {
  size_t i = 0;
  while (i < head.size()) {
    i = head.find_first_not_of(" \t\r\n", i);
    if (i == std::string::npos) return "";
    const size_t eq = head.find('=', i);
    if (eq == std::string::npos || eq + 1 >= head.size() || head[eq + 1] != '"') return "";
    const size_t close = head.find('"', eq + 2);
    if (close == std::string::npos) return "";
    if (std::string_view(head).substr(i, eq - i) == key)
      return unescape_attr(head.substr(eq + 2, close - eq - 2));
    i = close + 1;
  }
  return "";
}

class K3OutputParser : public OutputParser::Impl {
 public:
  K3OutputParser(bool parse_tools, bool parse_reasoning)
      : reasoning_(parse_reasoning), state_(parse_reasoning ? State::kThink : State::kResponse) {
    top_markers_ = {kThinkOpen, kResponseOpen, kMessageClose, kEndOfMessage};
    // A channel that opens while the response is open ends it (the model skipped the close marker).
    response_markers_ = {kResponseClose, kMessageClose, kEndOfMessage, kThinkOpen, kResponseOpen};
    if (parse_tools) {
      top_markers_.push_back(kToolsOpen);
      response_markers_.push_back(kToolsOpen);
    }
  }

 protected:
  enum class State {
    kTop,
    kThink,
    kResponse,
    kTools,
    kCallHead,
    kCallBody,
    kArgHead,
    kArgValue,
    kJsonHead,
    kJsonValue
  };

  const std::vector<std::string>& markers() const override {
    switch (state_) {
      case State::kTop:
        return top_markers_;
      case State::kThink:
        return think_markers_;
      case State::kResponse:
        return response_markers_;
      case State::kTools:
        return tools_markers_;
      case State::kCallBody:
        return body_markers_;
      case State::kArgValue:
        return arg_markers_;
      case State::kJsonValue:
        return json_markers_;
      case State::kCallHead:
      case State::kArgHead:
      case State::kJsonHead:
        return head_markers_;
    }
    return top_markers_;
  }

  void on_text(std::string_view text, ParsedDelta& out) override {
    if (state_ == State::kThink) {
      (reasoning_ ? out.reasoning_content : out.content).append(text);
    } else if (state_ == State::kTop || state_ == State::kResponse) {
      out.content.append(text);
    } else if (in_call()) {
      partial_.append(text);
      if (state_ == State::kCallHead || state_ == State::kArgHead) head_.append(text);
      if (state_ == State::kArgValue || state_ == State::kJsonValue) value_.append(text);
    }
  }

  void on_marker(const std::string& m, ParsedDelta& out) override {
    if (in_call()) partial_.append(m);
    switch (state_) {
      case State::kTop:
      case State::kThink:
      case State::kResponse:
        if (m == kThinkOpen) {
          state_ = State::kThink;
        } else if (m == kResponseOpen) {
          state_ = State::kResponse;
        } else if (m == kToolsOpen) {
          state_ = State::kTools;
        } else {
          state_ = State::kTop;  // a channel or the message closed
        }
        break;
      case State::kTools:
        if (m == kCallOpen) {
          state_ = State::kCallHead;
          partial_ = m;
          head_.clear();
          args_ = nlohmann::ordered_json::object();
          json_block_.clear();
          malformed_ = false;
        } else {
          state_ = State::kTop;
        }
        break;
      case State::kCallHead:
        call_name_ = attr(head_, "tool");
        state_ = State::kCallBody;
        break;
      case State::kCallBody:
        if (m == kArgOpen) {
          state_ = State::kArgHead;
          head_.clear();
        } else if (m == kJsonOpen) {
          state_ = State::kJsonHead;
        } else {
          finish_call(out);
        }
        break;
      case State::kArgHead:
        arg_key_ = attr(head_, "key");
        arg_type_ = attr(head_, "type");
        value_.clear();
        state_ = State::kArgValue;
        break;
      case State::kArgValue:
        add_argument();
        state_ = State::kCallBody;
        break;
      case State::kJsonHead:
        value_.clear();
        state_ = State::kJsonValue;
        break;
      case State::kJsonValue:
        json_block_ = value_;
        state_ = State::kCallBody;
        break;
    }
  }

  void on_finish(ParsedDelta& out) override {
    // An unfinished call (generation cut short) is returned as text rather than lost.
    if (in_call()) out.content.append(partial_);
    partial_.clear();
  }

 private:
  bool in_call() const {
    return state_ != State::kTop && state_ != State::kThink && state_ != State::kResponse &&
           state_ != State::kTools;
  }

  void add_argument() {
    if (arg_key_.empty()) {
      malformed_ = true;
      return;
    }
    if (arg_type_.empty() || arg_type_ == "string") {
      args_[arg_key_] = value_;
      return;
    }
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(value_, nullptr, /*allow_exceptions=*/false);
    args_[arg_key_] = v.is_discarded() ? nlohmann::ordered_json(value_) : std::move(v);
  }

  void finish_call(ParsedDelta& out) {
    state_ = State::kTools;
    partial_.clear();
    if (call_name_.empty() || malformed_) return;  // dropped, as vLLM drops a call without a tool name
    std::string arguments = json_block_.empty() ? python_json(args_, /*compact=*/false) : json_block_;
    emit_call(call_name_, std::move(arguments), out);
  }

  bool reasoning_;
  State state_;
  std::vector<std::string> top_markers_, response_markers_;
  std::vector<std::string> think_markers_ = {kThinkClose, kMessageClose, kEndOfMessage};
  std::vector<std::string> tools_markers_ = {kCallOpen, kToolsClose};
  std::vector<std::string> body_markers_ = {kArgOpen, kJsonOpen, kCallClose};
  std::vector<std::string> head_markers_ = {kSep};
  std::vector<std::string> arg_markers_ = {kArgClose};
  std::vector<std::string> json_markers_ = {kJsonClose};
  std::string head_, value_, json_block_, call_name_, arg_key_, arg_type_;
  nlohmann::ordered_json args_ = nlohmann::ordered_json::object();
  bool malformed_ = false;  // the call being read has an argument without a key
  std::string partial_;     // the raw text of the call being read
};

}  // namespace

std::unique_ptr<OutputParser::Impl> make_k3_output_parser(bool parse_tools, bool parse_reasoning) {
  return std::make_unique<K3OutputParser>(parse_tools, parse_reasoning);
}

}  // namespace hlm
