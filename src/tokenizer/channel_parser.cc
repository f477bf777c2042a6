// The marker-driven streaming engine and the OutputParser facade (see channel_parser.h).
#include "tokenizer/channel_parser.h"

#include <algorithm>

namespace hlm {

namespace {

// The length of the longest suffix of `s` that is a proper prefix of one of `markers`.
size_t held_back(std::string_view s, const std::vector<std::string>& markers) {
  size_t hold = 0;
  for (const std::string& m : markers) {
    for (size_t k = std::min(m.size() - 1, s.size()); k > hold; --k) {
      if (s.substr(s.size() - k) == std::string_view(m).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

void OutputParser::Impl::process(ParsedDelta& out, bool final) {
  for (;;) {
    const std::vector<std::string>& ms = markers();
    size_t at = std::string::npos, which = 0;
    for (size_t i = 0; i < ms.size(); ++i) {
      const size_t p = buf_.find(ms[i]);
      if (p < at || (p == at && p != std::string::npos && ms[i].size() > ms[which].size())) {
        at = p;
        which = i;
      }
    }
    if (at != std::string::npos) {
      const std::string marker = ms[which];
      if (at > 0) on_text(std::string_view(buf_).substr(0, at), out);
      buf_.erase(0, at + marker.size());
      on_marker(marker, out);
      continue;
    }
    const size_t keep = final ? 0 : held_back(buf_, ms);
    if (buf_.size() > keep) on_text(std::string_view(buf_).substr(0, buf_.size() - keep), out);
    buf_.erase(0, buf_.size() - keep);
    return;
  }
}

void OutputParser::Impl::push(std::string_view text, ParsedDelta& out) {
  buf_.append(text);
  process(out, false);
}

void OutputParser::Impl::finish(ParsedDelta& out) {
  process(out, true);
  on_finish(out);
}

void OutputParser::Impl::emit_call(std::string name, std::string arguments, ParsedDelta& out) {
  std::string id = "functions." + name + ":" + std::to_string(calls_);
  emit_call_with_id(std::move(id), std::move(name), std::move(arguments), out);
}

void OutputParser::Impl::emit_call_with_id(std::string id, std::string name, std::string arguments,
                                           ParsedDelta& out) {
  out.tool_calls.push_back(ToolCall{std::move(id), std::move(name), std::move(arguments)});
  ++calls_;
}

OutputParser::OutputParser(ChatFormat format, bool parse_tools, bool parse_reasoning)
    : impl_(format == ChatFormat::kK3 ? make_k3_output_parser(parse_tools, parse_reasoning)
                                      : make_kimi_output_parser(parse_tools, parse_reasoning)) {}
OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

ParsedDelta OutputParser::push(std::string_view text) {
  ParsedDelta out;
  impl_->push(text, out);
  return out;
}

ParsedDelta OutputParser::finish() {
  ParsedDelta out;
  impl_->finish(out);
  return out;
}

int OutputParser::tool_call_count() const { return impl_->tool_call_count(); }

}  // namespace hlm
