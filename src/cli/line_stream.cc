#include "cli/line_stream.h"

namespace hlm {

LineStream::LineStream(std::ostream& out, size_t prompts)
    : out_(out), pending_(prompts), done_(prompts, false), written_(prompts, false) {}

void LineStream::write(size_t prompt, int32_t id) {
  if (written_[prompt]) out_ << ',';
  out_ << id;
  written_[prompt] = true;
}

void LineStream::token(size_t prompt, int32_t id) {
  if (prompt != current_) {
    pending_[prompt].push_back(id);
    return;
  }
  write(prompt, id);
  out_.flush();
}

void LineStream::done(size_t prompt) {
  done_[prompt] = true;
  advance();
  out_.flush();
}

void LineStream::advance() {
  while (current_ < done_.size() && done_[current_]) {
    out_ << '\n';
    ++current_;
    if (current_ == done_.size()) break;
    for (int32_t id : pending_[current_]) write(current_, id);
    pending_[current_].clear();
  }
}

void LineStream::finish() {
  for (size_t i = current_; i < done_.size(); ++i) done_[i] = true;
  advance();
  out_.flush();
}

}  // namespace hlm
