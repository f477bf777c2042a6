#include "runtime/output_constraint.h"

#include <algorithm>
#include <bitset>

#include "base/error.h"

namespace hlm {

ConstraintVocab::ConstraintVocab(std::vector<std::string> token_bytes, std::vector<uint8_t> text)
    : bytes(std::move(token_bytes)), is_text(std::move(text)) {
  HLM_CHECK(bytes.size() == is_text.size(), "a constraint vocabulary of {} ids with {} text flags",
            bytes.size(), is_text.size());
  plain.resize(bytes.size());
  for (size_t id = 0; id < bytes.size(); ++id) {
    plain[id] = is_text[id] && std::all_of(bytes[id].begin(), bytes[id].end(), [](char c) {
                  return c >= 0x20 && c < 0x7F && c != '"' && c != '\\';
                });
  }
}

void validate(const OutputConstraint& c, int64_t vocab) {
  if (!c && !c.vocab) return;
  HLM_CHECK(c.vocab != nullptr && static_cast<bool>(c),
            "an output constraint needs a vocabulary and a JSON schema or a tool-call grammar");
  HLM_CHECK(!c.json || !c.tool_calls, "an output is constrained to JSON or to tool calls, not both");
  HLM_CHECK(static_cast<int64_t>(c.vocab->bytes.size()) <= vocab,
            "output constraint: a vocabulary of {} entries for a model of {} ids", c.vocab->bytes.size(),
            vocab);
}

ConstrainedOutput::ConstrainedOutput(OutputConstraint c, std::vector<int32_t> end_ids)
    : c_(std::move(c)), end_ids_(std::move(end_ids)) {
  HLM_CHECK(c_.vocab && static_cast<bool>(c_), "an output constraint without a vocabulary or a grammar");
  // A complete output leaves only the end ids: without one the sequence could not end.
  HLM_CHECK(!end_ids_.empty(), "a constrained sequence needs an end id (eos, or a stop id) to end on");
  if (c_.json) json_.emplace(*c_.json);
  if (c_.tool_calls) tools_.emplace(*c_.tool_calls);
}

void ConstrainedOutput::observe(int32_t id) {
  const ConstraintVocab& v = *c_.vocab;
  const bool text = id >= 0 && static_cast<size_t>(id) < v.bytes.size() && v.is_text[id];
  if (json_ && text) json_->feed(v.bytes[id]);
  if (tools_) {
    if (text) {
      tools_->feed(v.bytes[id]);
    } else {
      tools_->marker(id);
    }
  }
}

void ConstrainedOutput::mask(float* logits, int64_t vocab, float masked) const {
  if (json_)
    mask_with(
        *json_, [](int32_t) { return false; }, logits, vocab, masked);
  if (tools_) {
    mask_with(
        *tools_, [this](int32_t id) { return tools_->marker_allowed(id); }, logits, vocab, masked);
  }
}

// Every text id is tried on a copy of the recognizer (as deep as the output's nesting), unless cheaper tests
// decide it: its first byte, tried once for all 256; or, inside a string, plain text that fits.
template <class Prefix, class MarkerAllowed>
void ConstrainedOutput::mask_with(const Prefix& state, MarkerAllowed marker_allowed, float* x, int64_t vocab,
                                  float masked) const {
  const ConstraintVocab& v = *c_.vocab;
  const bool done = state.complete();
  Prefix next = state;
  std::bitset<256> first;
  for (int c = 0; c < 256 && !done; ++c) {
    next = state;
    first[c] = next.feed(static_cast<unsigned char>(c));
  }
  const uint32_t room = state.string_room();
  for (int64_t id = 0; id < vocab; ++id) {
    bool ok = false;
    const bool text = static_cast<size_t>(id) < v.bytes.size() && v.is_text[id] && !v.bytes[id].empty();
    if (done) {
      ok = std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
    } else if (!text) {
      ok = marker_allowed(static_cast<int32_t>(id));
    } else {
      const std::string& b = v.bytes[id];
      if (!first[static_cast<unsigned char>(b[0])]) {
        ok = false;
      } else if (b.size() == 1 || (v.plain[id] && b.size() <= room)) {
        ok = true;
      } else {
        next = state;
        ok = next.feed(b);
      }
    }
    if (!ok) x[id] = masked;
  }
}

}  // namespace hlm
