#include "runtime/tool_call_prefix.h"

#include <algorithm>

#include "base/error.h"
#include "runtime/sorted_narrow.h"

namespace hlm {

namespace {

// What the output parser's id pattern reads as a name: \w (Unicode's, so any UTF-8 beyond ASCII is let
// through here) and '.'.
bool name_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c >= 0x80;
}

}  // namespace

ToolCallGrammar::ToolCallGrammar(Markers m, std::vector<Tool> t, bool one)
    : markers(m), tools(std::move(t)), one_call(one) {
  HLM_CHECK(!tools.empty(), "a tool-call constraint needs at least one tool");
  for (int32_t id : {m.section_begin, m.call_begin, m.argument_begin, m.call_end, m.section_end}) {
    HLM_CHECK(id >= 0, "the tokenizer lacks one of the five tool-call markers");
  }
  std::sort(tools.begin(), tools.end(), [](const Tool& a, const Tool& b) { return a.name < b.name; });
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string& name = tools[i].name;
    HLM_CHECK(
        !name.empty() && std::all_of(name.begin(), name.end(),
                                     [](char c) { return name_byte(static_cast<unsigned char>(c)); }),
        "tool \"{}\": a forced call needs a name of letters, digits, '_' and '.' (what Kimi's tool-call "
        "parser reads back)",
        name);
    HLM_CHECK(i == 0 || tools[i - 1].name != name, "tool \"{}\" is declared twice", name);
    HLM_CHECK(tools[i].parameters != nullptr, "tool \"{}\" has no parameters schema", name);
    id_heads.push_back("functions." + name + ":");
  }
}

bool ToolCallGrammar::is_marker(int32_t id) const {
  return id == markers.section_begin || id == markers.call_begin || id == markers.argument_begin ||
         id == markers.call_end || id == markers.section_end;
}

bool ToolCallPrefix::marker_allowed(int32_t id) const {
  const ToolCallGrammar::Markers& m = grammar_->markers;
  switch (phase_) {
    case Phase::kSectionBegin:
      return id == m.section_begin;
    case Phase::kCallBegin:
      return id == m.call_begin;
    case Phase::kIndex:
      return id == m.argument_begin && matched_ > 0;
    case Phase::kArguments:
      return id == m.call_end && arguments_->complete();
    case Phase::kAfterCall:
      return id == m.section_end || (id == m.call_begin && !grammar_->one_call);
    default:
      return false;
  }
}

bool ToolCallPrefix::marker(int32_t id) {
  if (!marker_allowed(id)) return false;
  const ToolCallGrammar::Markers& m = grammar_->markers;
  if (id == m.section_begin) {
    phase_ = Phase::kCallBegin;
  } else if (id == m.call_begin) {
    phase_ = Phase::kId;
    lo_ = 0;
    hi_ = static_cast<uint32_t>(grammar_->tools.size());
    matched_ = 0;
  } else if (id == m.argument_begin) {
    phase_ = Phase::kArguments;
    arguments_.emplace(*grammar_->tools[lo_].parameters);
  } else if (id == m.call_end) {
    arguments_.reset();
    phase_ = Phase::kAfterCall;
  } else {
    phase_ = Phase::kDone;
  }
  return true;
}

void ToolCallPrefix::append_key(std::string& key) const {
  const auto put = [&key](const auto& v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(phase_);
  put(lo_);
  put(hi_);
  put(matched_);
  if (arguments_) arguments_->append_key(key);
}

bool ToolCallPrefix::feed(unsigned char c) {
  switch (phase_) {
    case Phase::kId: {
      const auto& heads = grammar_->id_heads;
      const auto [lo, hi] =
          narrow(lo_, hi_, matched_, c, [&heads](uint32_t j) -> const std::string& { return heads[j]; });
      if (lo == hi) return false;
      lo_ = lo;
      hi_ = hi;
      // A head ends in ':', which no name holds, so a whole head is the only candidate left.
      if (++matched_ == heads[lo].size()) {
        phase_ = Phase::kIndex;
        matched_ = 0;
      }
      return true;
    }
    case Phase::kIndex:
      if (c < '0' || c > '9' || matched_ >= kMaxIndexDigits) return false;
      ++matched_;
      return true;
    case Phase::kArguments:
      return arguments_->feed(c);
    default:
      return false;
  }
}

}  // namespace hlm
