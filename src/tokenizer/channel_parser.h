// The streaming engine under OutputParser: a state machine over marker strings. In each state the
// parser knows which markers may come; text before the first of them goes to the state's sink, the
// marker switches state, and a tail that could still grow into a marker is held back until the next
// push (or finish), so a marker split across decode steps is never mistaken for text.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/output_parser.h"

namespace hlm {

class OutputParser::Impl {
 public:
  virtual ~Impl() = default;
  void push(std::string_view text, ParsedDelta& out);
  void finish(ParsedDelta& out);
  int tool_call_count() const { return calls_; }

 protected:
  // The markers that may come in the current state.
  virtual const std::vector<std::string>& markers() const = 0;
  // Text of the current state (before any marker).
  virtual void on_text(std::string_view text, ParsedDelta& out) = 0;
  // One of markers() was seen (the state's markers at the time; on_text may have changed the state).
  virtual void on_marker(const std::string& marker, ParsedDelta& out) = 0;
  // End of generation, after the held-back text went to on_text.
  virtual void on_finish(ParsedDelta& out) = 0;

  // Adds a complete call (id functions.{name}:{n}, n counting this output's calls).
  void emit_call(std::string name, std::string arguments, ParsedDelta& out);
  void emit_call_with_id(std::string id, std::string name, std::string arguments, ParsedDelta& out);

 private:
  void process(ParsedDelta& out, bool final);

  std::string buf_;
  int calls_ = 0;
};

std::unique_ptr<OutputParser::Impl> make_kimi_output_parser(bool parse_tools, bool parse_reasoning);
std::unique_ptr<OutputParser::Impl> make_k3_output_parser(bool parse_tools, bool parse_reasoning);

}  // namespace hlm
