// LineStream: the output of `helixlm generate`, one line of comma-separated ids per prompt in prompt
// order, written while generation runs. The first unfinished prompt's line grows on the stream as its
// tokens come, flushed at each token; a later prompt's tokens wait in memory until every line before it is
// complete, then catch up. finish() completes every line, so an interrupted run still ends with one line
// per prompt holding what was generated.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

namespace hlm {

class LineStream {
 public:
  LineStream(std::ostream& out, size_t prompts);

  void token(size_t prompt, int32_t id);
  // The prompt has no more tokens.
  void done(size_t prompt);
  // Ends every line not yet ended, in order (after the last step, or on an interrupt).
  void finish();

 private:
  void write(size_t prompt, int32_t id);
  // Ends the current line while its prompt is done and moves on, writing what the next one holds.
  void advance();

  std::ostream& out_;
  std::vector<std::vector<int32_t>> pending_;  // tokens not yet written, per prompt
  std::vector<bool> done_;
  std::vector<bool> written_;  // whether the prompt's line has an id already (the next needs a comma)
  size_t current_ = 0;         // the prompt whose line is being written
};

}  // namespace hlm
