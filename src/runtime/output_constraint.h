// Constrained decoding: what the output must be (an OutputConstraint, shared by every sequence of a
// request) and where a sequence stands in it (ConstrainedOutput). response_format asks for one instance of a
// JSON schema (json_schema.h); tool_choice "required" or a named function for one tool-call section in
// Kimi Linear's format (tool_call_prefix.h). Each draw, every id of the vocabulary that cannot continue the
// output is cut, and once the output is complete only the end ids remain. The logits processor applies it
// first, before logit_bias and the penalties.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/json_schema_prefix.h"
#include "runtime/tool_call_prefix.h"

namespace hlm {

// What a constrained sequence may emit: the bytes of every id (by id), and whether the id is text (special
// and other added tokens are not: only a tool-call section's markers may appear among them). Built once
// per model and shared.
struct ConstraintVocab {
  ConstraintVocab(std::vector<std::string> token_bytes, std::vector<uint8_t> text);

  std::vector<std::string> bytes;
  std::vector<uint8_t> is_text;
  // The bytes are printable ASCII other than '"' and '\\': string content wherever a string is open, which
  // spares the recognizer most of the vocabulary inside strings.
  std::vector<uint8_t> plain;
};

// Set: `vocab`, and one of `json` and `tool_calls`.
struct OutputConstraint {
  std::shared_ptr<const ConstraintVocab> vocab;
  std::shared_ptr<const JsonSchema> json;             // the output is one instance
  std::shared_ptr<const ToolCallGrammar> tool_calls;  // the output is one tool-call section
  explicit operator bool() const { return json != nullptr || tool_calls != nullptr; }
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
  template <class Prefix, class MarkerAllowed>
  void mask_with(const Prefix& state, MarkerAllowed marker_allowed, float* logits, int64_t vocab,
                 float masked) const;

  OutputConstraint c_;
  std::vector<int32_t> end_ids_;
  std::optional<JsonSchemaPrefix> json_;
  std::optional<ToolCallPrefix> tools_;
};

}  // namespace hlm
