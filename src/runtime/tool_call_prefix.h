// ToolCallPrefix: the recognizer for tool_choice "required" or a named function, in Kimi Linear's (K2's)
// tool-call format. The output is one tool-call section and nothing else:
//   <|tool_calls_section_begin|> ( <|tool_call_begin|> functions.{name}:{index} <|tool_call_argument_begin|>
//   {arguments} <|tool_call_end|> )+ <|tool_calls_section_end|>
// where the five markers are token ids, {name} is one of the request's tools (the named one, or any for
// "required"), with exactly one call when a tool is named or parallel tool calls are off; {index} is
// digits, and {arguments} is an instance of that tool's parameters schema (json_schema.h). Writing the
// model's own format, rather than a JSON wrapper, keeps the model on the form it was trained on, and the
// server's output parser reads it back as tool calls.
//
// Like JsonSchemaPrefix it is a small value the logits processor copies per token: markers go through
// marker(), text bytes through feed().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/json_schema_prefix.h"

namespace hlm {

struct ToolCallGrammar {
  struct Markers {
    int32_t section_begin = -1;
    int32_t call_begin = -1;
    int32_t argument_begin = -1;
    int32_t call_end = -1;
    int32_t section_end = -1;
  };
  struct Tool {
    std::string name;
    std::shared_ptr<const JsonSchema> parameters;
  };

  // Tools sorted by name (the recognizer narrows over their ids' bytes); one_call: the section holds one
  // call (a named tool_choice, or parallel_tool_calls false).
  // Names must be what the output parser reads back from an id (letters, digits, '_', '.', or UTF-8
  // beyond ASCII), and unique; errors name the offending tool.
  ToolCallGrammar(Markers markers, std::vector<Tool> tools, bool one_call);

  bool is_marker(int32_t id) const;

  Markers markers;
  std::vector<Tool> tools;
  std::vector<std::string> id_heads;  // "functions.{name}:" of each tool, in the same order
  bool one_call = false;
};

class ToolCallPrefix {
 public:
  // `grammar` must outlive the recognizer and its copies.
  explicit ToolCallPrefix(const ToolCallGrammar& grammar) : grammar_(&grammar) {}

  // Whether the marker `id` may come next, and taking it (false: refused, state unchanged).
  bool marker_allowed(int32_t id) const;
  bool marker(int32_t id);
  // Text bytes (the call id, then the arguments); false when they cannot continue the section.
  bool feed(unsigned char c);
  bool feed(std::string_view bytes) {
    for (char c : bytes) {
      if (!feed(static_cast<unsigned char>(c))) return false;
    }
    return true;
  }
  // The section is closed: only the end of the turn may follow.
  bool complete() const { return phase_ == Phase::kDone; }
  bool extends() const { return false; }
  // The state as bytes, as JsonSchemaPrefix::append_key.
  void append_key(std::string& key) const;
  // JsonSchemaPrefix::string_room of the arguments; -1 outside them.
  int64_t string_room() const { return phase_ == Phase::kArguments ? arguments_->string_room() : -1; }

 private:
  enum class Phase : uint8_t { kSectionBegin, kCallBegin, kId, kIndex, kArguments, kAfterCall, kDone };
  // The most digits an index may have.
  static constexpr uint32_t kMaxIndexDigits = 6;

  const ToolCallGrammar* grammar_;
  Phase phase_ = Phase::kSectionBegin;
  // kId: tools [lo_, hi_) still match the id's first matched_ bytes; kIndex: matched_ digits so far.
  uint32_t lo_ = 0;
  uint32_t hi_ = 0;
  uint32_t matched_ = 0;
  std::optional<JsonSchemaPrefix> arguments_;  // kArguments: the chosen tool's
};

}  // namespace hlm
