#include "runtime/output_constraint.h"

#include <algorithm>
#include <bit>
#include <bitset>

#include "base/error.h"
#include "base/utf8.h"

namespace hlm {

namespace {

// The second-byte table is built (256 feeds per first byte) only when this few first bytes pass.
constexpr size_t kSecondByteFirsts = 16;

// Characters of `b` as string content: whole, well-formed UTF-8 characters, none of them '"', '\\' or below
// 0x20 (what JsonSchemaPrefix takes inside a string without escapes); -1 when `b` is not that.
int32_t plain_string_chars(std::string_view b) {
  int32_t chars = 0;
  for (size_t i = 0; i < b.size(); ++chars) {
    const auto c = static_cast<unsigned char>(b[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == '"' || c == '\\') return -1;
      ++i;
      continue;
    }
    const size_t n = utf8_sequence_length(b.substr(i));
    if (n == 0) return -1;
    i += n;
  }
  return chars;
}

}  // namespace

ConstraintVocab::ConstraintVocab(std::vector<std::string> token_bytes, std::vector<uint8_t> text)
    : bytes(std::move(token_bytes)), is_text(std::move(text)) {
  HLM_CHECK(bytes.size() == is_text.size(), "a constraint vocabulary of {} ids with {} text flags",
            bytes.size(), is_text.size());
  const size_t n = bytes.size();
  string_chars.assign(n, -1);
  length.assign(n, 0);
  plain_bits.assign((n + 63) / 64, 0);
  std::vector<size_t> other_groups[256];  // the text ids that are not plain, by first byte
  std::vector<std::vector<size_t>> pairs(256 * 257);
  for (size_t id = 0; id < n; ++id) {
    const std::string& b = bytes[id];
    length[id] = static_cast<uint16_t>(std::min<size_t>(b.size(), UINT16_MAX));
    if (!is_text[id] || b.empty()) {
      non_text.push_back(static_cast<int32_t>(id));
      continue;
    }
    string_chars[id] = plain_string_chars(b);
    const auto c = static_cast<unsigned char>(b[0]);
    pairs[c * 257 + (b.size() > 1 ? static_cast<unsigned char>(b[1]) : 256)].push_back(id);
    if (string_chars[id] >= 0) {
      plain_bits[id / 64] |= uint64_t{1} << (id % 64);
      max_plain_chars = std::max(max_plain_chars, string_chars[id]);
    } else {
      other_groups[c].push_back(id);
    }
  }
  other_offsets.assign(257, 0);
  for (size_t c = 0; c < 256; ++c) {
    other_offsets[c + 1] = other_offsets[c] + static_cast<uint32_t>(other_groups[c].size());
    for (size_t id : other_groups[c]) other_by_first.push_back(static_cast<int32_t>(id));
  }
  pair_offsets.assign(pairs.size() + 1, 0);
  for (size_t p = 0; p < pairs.size(); ++p) {
    pair_offsets[p + 1] = pair_offsets[p] + static_cast<uint32_t>(pairs[p].size());
    for (size_t id : pairs[p]) by_pair.push_back(static_cast<int32_t>(id));
  }
}

void validate(const OutputConstraint& c, int64_t vocab) {
  if (!c && !c.vocab) return;
  HLM_CHECK(c.vocab != nullptr && static_cast<bool>(c),
            "an output constraint needs a vocabulary and a JSON schema or a tool-call grammar");
  HLM_CHECK(int{c.json != nullptr} + int{c.tool_calls != nullptr} + int{c.choice != nullptr} == 1,
            "an output is constrained to JSON, to tool calls or to a choice: one of them");
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
  if (c_.choice) choice_.emplace(*c_.choice);
}

void ConstrainedOutput::observe(int32_t id) {
  const ConstraintVocab& v = *c_.vocab;
  const bool text = id >= 0 && static_cast<size_t>(id) < v.bytes.size() && v.is_text[id];
  if (json_ && text) json_->feed(v.bytes[id]);
  if (choice_ && text) choice_->feed(v.bytes[id]);
  if (tools_) {
    if (text) {
      tools_->feed(v.bytes[id]);
    } else {
      tools_->marker(id);
    }
  }
}

void ConstrainedOutput::mask(float* logits, int64_t vocab, float masked) const {
  std::string key;
  key.append(reinterpret_cast<const char*>(&vocab), sizeof(vocab));
  if (json_) json_->append_key(key);
  if (tools_) tools_->append_key(key);
  if (choice_) choice_->append_key(key);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    if (cache_.size() >= kCachedMasks) cache_.clear();
    const auto no_marker = [](int32_t) { return false; };
    const auto tool_marker = [this](int32_t id) { return tools_->marker_allowed(id); };
    Bits bits;
    if (json_) bits = allowed(*json_, no_marker, vocab);
    if (choice_) bits = allowed(*choice_, no_marker, vocab);
    if (tools_) bits = allowed(*tools_, tool_marker, vocab);
    it = cache_.emplace(std::move(key), std::move(bits)).first;
  }
  apply(it->second, logits, vocab, masked);
}

void ConstrainedOutput::apply(const Bits& bits, float* x, int64_t vocab, float masked) {
  const auto words = static_cast<int64_t>(bits.size());
  int64_t set = 0;
  for (uint64_t w : bits) set += std::popcount(w);
  if (2 * set >= vocab) {  // mostly allowed: visit the refused
    for (int64_t w = 0; w < words; ++w) {
      for (uint64_t refused = ~bits[static_cast<size_t>(w)]; refused != 0; refused &= refused - 1) {
        const int64_t id = w * 64 + std::countr_zero(refused);
        if (id < vocab) x[id] = masked;
      }
    }
    return;
  }
  // Mostly refused: keep the allowed logits, mask everything, put them back.
  std::vector<std::pair<int64_t, float>> kept;
  kept.reserve(static_cast<size_t>(set));
  for (int64_t w = 0; w < words; ++w) {
    for (uint64_t ok = bits[static_cast<size_t>(w)]; ok != 0; ok &= ok - 1) {
      const int64_t id = w * 64 + std::countr_zero(ok);
      kept.emplace_back(id, x[id]);
    }
  }
  std::fill(x, x + vocab, masked);
  for (const auto& [id, value] : kept) x[id] = value;
}

// Only the text ids whose first byte the recognizer takes are visited (the vocabulary groups them by first
// byte), and where few first bytes pass (between JSON tokens) only those whose first two bytes it takes.
// Of those, an id is decided without a copy of the recognizer when it is one or two bytes, or plain string
// content inside a string (by its length in characters); the rest are fed to a copy, as deep as the
// output's nesting.
template <class Prefix, class MarkerAllowed>
ConstrainedOutput::Bits ConstrainedOutput::allowed(const Prefix& state, MarkerAllowed marker_allowed,
                                                   int64_t vocab) const {
  const ConstraintVocab& v = *c_.vocab;
  Bits bits(static_cast<size_t>((vocab + 63) / 64), 0);
  auto allow = [&bits](int64_t id) { bits[static_cast<size_t>(id >> 6)] |= uint64_t{1} << (id & 63); };
  if (state.complete()) {
    for (int32_t id : end_ids_) {
      if (id >= 0 && id < vocab) allow(id);
    }
    // A complete output ends, unless it may still grow (a choice that a longer one extends).
    if (!state.extends()) return bits;
  }
  for (int32_t id : v.non_text) {
    if (id < vocab && marker_allowed(id)) allow(id);
  }
  std::bitset<256> first;
  for (int c = 0; c < 256; ++c) {
    Prefix next = state;
    first[c] = next.feed(static_cast<unsigned char>(c));
  }
  std::vector<std::bitset<256>> second;
  if (first.count() <= kSecondByteFirsts) {
    second.resize(256);
    for (int c = 0; c < 256; ++c) {
      if (!first[c]) continue;
      Prefix after = state;
      after.feed(static_cast<unsigned char>(c));
      for (int d = 0; d < 256; ++d) {
        Prefix next = after;
        second[c][d] = next.feed(static_cast<unsigned char>(d));
      }
    }
  }
  Prefix next = state;
  // Few first bytes pass: visit only the ids whose first two bytes pass (a one-byte id passes whole).
  if (!second.empty()) {
    for (int c = 0; c < 256; ++c) {
      if (!first[c]) continue;
      for (int d = 0; d <= 256; ++d) {
        if (d < 256 && !second[c][d]) continue;
        const size_t p = static_cast<size_t>(c) * 257 + static_cast<size_t>(d);
        for (uint32_t i = v.pair_offsets[p]; i < v.pair_offsets[p + 1]; ++i) {
          const int32_t id = v.by_pair[i];
          if (id >= vocab) continue;
          if (d < 256 && v.length[id] > 2) {
            next = state;
            if (!next.feed(v.bytes[id])) continue;
          }
          allow(id);
        }
      }
    }
    return bits;
  }
  // Inside a string, a plain id is allowed exactly when it fits; with room for any, the plain ids are
  // allowed as a block and only the others tried.
  const int64_t room = state.string_room();
  const bool plain_block = room >= v.max_plain_chars && room > 0;
  if (plain_block) {
    for (size_t w = 0; w < bits.size() && w < v.plain_bits.size(); ++w) bits[w] = v.plain_bits[w];
    if (vocab % 64 != 0 && bits.size() <= v.plain_bits.size())
      bits.back() &= (uint64_t{1} << (vocab % 64)) - 1;
  }
  const std::vector<int32_t>& ids = plain_block ? v.other_by_first : v.by_pair;
  for (int c = 0; c < 256; ++c) {
    if (!first[c]) continue;
    const uint32_t lo = plain_block ? v.other_offsets[c] : v.pair_offsets[257 * c];
    const uint32_t hi = plain_block ? v.other_offsets[c + 1] : v.pair_offsets[257 * (c + 1)];
    for (uint32_t i = lo; i < hi; ++i) {
      const int32_t id = ids[i];
      if (id >= vocab) continue;
      const int32_t chars = v.string_chars[id];
      bool ok = false;
      if (room >= 0 && chars >= 0) {
        ok = chars <= room;
      } else if (v.length[id] == 1) {
        ok = true;
      } else {
        next = state;
        ok = next.feed(v.bytes[id]);
      }
      if (ok) allow(id);
    }
  }
  return bits;
}

}  // namespace hlm
