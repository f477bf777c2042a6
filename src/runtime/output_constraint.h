// Constrained decoding: what the output must be (an OutputConstraint, shared by every sequence of a
// request) and where a sequence stands in it (ConstrainedOutput). response_format asks for one instance of a
// JSON schema (json_schema.h); tool_choice "required" or a named function for one tool-call section in
// Kimi Linear's format (tool_call_prefix.h); vLLM's guided choice for one of a list of strings
// (choice_prefix.h). Each draw, every id of the vocabulary that cannot continue the
// output is cut, and once the output is complete only the end ids remain. The logits processor applies it
// first, before logit_bias and the penalties.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/choice_prefix.h"
#include "runtime/json_schema_prefix.h"
#include "runtime/tool_call_prefix.h"

namespace hlm {

// What a constrained sequence may emit: the bytes of every id (by id), and whether the id is text (special
// and other added tokens are not: only a tool-call section's markers may appear among them). Built once
// per model and shared, with the indexes the mask reads instead of the bytes.
struct ConstraintVocab {
  ConstraintVocab(std::vector<std::string> token_bytes, std::vector<uint8_t> text);

  std::vector<std::string> bytes;
  std::vector<uint8_t> is_text;
  // Text ids grouped by their first two bytes: by_pair[pair_offsets[p], pair_offsets[p + 1]) for p =
  // 257 * first + second, the second 256 for a one-byte id; so those beginning with byte c are
  // by_pair[pair_offsets[257 * c], pair_offsets[257 * (c + 1)]).
  std::vector<uint32_t> pair_offsets;
  std::vector<int32_t> by_pair;
  // Text ids that are not plain string content (string_chars < 0), grouped by first byte:
  // other_by_first[other_offsets[c], other_offsets[c + 1]) begin with c. And the plain ones as bits, with the
  // most characters one of them adds: inside a string with that much room, the plain ids are allowed at once
  // and only these are tried.
  std::vector<uint32_t> other_offsets;
  std::vector<int32_t> other_by_first;
  std::vector<uint64_t> plain_bits;
  int32_t max_plain_chars = 0;
  std::vector<int32_t> non_text;  // the ids that are not text
  std::vector<uint16_t> length;   // each id's byte length, at most 65535
  // Inside an open string, the characters the id adds when its bytes are whole UTF-8 characters none of
  // which is '"', '\\' or a control character (it is then string content wherever a string is open, which
  // spares the recognizer most of the vocabulary inside strings); -1 otherwise.
  std::vector<int32_t> string_chars;
};

// Set: `vocab`, and one of `json`, `tool_calls` and `choice`.
struct OutputConstraint {
  std::shared_ptr<const ConstraintVocab> vocab;
  std::shared_ptr<const JsonSchema> json;             // the output is one instance
  std::shared_ptr<const ToolCallGrammar> tool_calls;  // the output is one tool-call section
  std::shared_ptr<const Choices> choice;              // the output is one of these strings
  explicit operator bool() const { return json != nullptr || tool_calls != nullptr || choice != nullptr; }
};

// Checks that a set constraint is whole and its vocabulary no larger than the model's.
void validate(const OutputConstraint& c, int64_t vocab);

class ConstrainedOutput {
 public:
  // end_ids: what may follow a complete output (at least one: otherwise the sequence could not end).
  ConstrainedOutput(OutputConstraint c, std::vector<int32_t> end_ids);

  // A token the sequence produced (one the mask let through).
  void observe(int32_t id);
  // logits: [vocab]; every id that cannot continue the output becomes `masked`.
  void mask(float* logits, int64_t vocab, float masked) const;

 private:
  // Bit i: id i may come next.
  using Bits = std::vector<uint64_t>;
  // Sets `masked` where `bits` is 0, touching only the fewer of the allowed and the refused.
  static void apply(const Bits& bits, float* logits, int64_t vocab, float masked);
  // Masks computed in this sequence, by the recognizer's key (append_key): an output revisits its states
  // (a string's next character, the next item of an array), and a hit costs a pass over bits instead of
  // the vocabulary's bytes. At most kCachedMasks (a few hundred KB), then it starts over.
  static constexpr size_t kCachedMasks = 32;

  template <class Prefix, class MarkerAllowed>
  Bits allowed(const Prefix& state, MarkerAllowed marker_allowed, int64_t vocab) const;

  OutputConstraint c_;
  std::vector<int32_t> end_ids_;
  std::optional<JsonSchemaPrefix> json_;
  std::optional<ToolCallPrefix> tools_;
  std::optional<ChoicePrefix> choice_;
  mutable std::unordered_map<std::string, Bits> cache_;
};

}  // namespace hlm
