// ChoicePrefix: the recognizer for vLLM's guided choice: the output is exactly one of a list of strings
// (raw text, not JSON). The choices are kept sorted, so the ones the output can still become are one run
// of them, narrowed byte by byte; the output is complete once it equals one, and may go on while a longer
// one extends it ("yes" and "yes, twice").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hlm {

// Sorted, unique, non-empty strings (make_choices checks and sorts them).
using Choices = std::vector<std::string>;

// Errors name `where` and the offending entry: an empty list, an empty string, more than 4096 choices.
std::shared_ptr<const Choices> make_choices(std::vector<std::string> choices, const std::string& where);

class ChoicePrefix {
 public:
  // `choices` must outlive the recognizer and its copies.
  explicit ChoicePrefix(const Choices& choices)
      : choices_(&choices), hi_(static_cast<uint32_t>(choices.size())) {}

  bool feed(unsigned char c);
  bool feed(std::string_view bytes) {
    for (char c : bytes) {
      if (!feed(static_cast<unsigned char>(c))) return false;
    }
    return true;
  }
  // The output equals a choice.
  bool complete() const { return (*choices_)[lo_].size() == matched_; }
  // A longer choice can still follow what was written.
  bool extends() const { return hi_ - lo_ > 1 || (*choices_)[lo_].size() > matched_; }
  // No JSON strings here (JsonSchemaPrefix::string_room).
  int64_t string_room() const { return -1; }
  void append_key(std::string& key) const;

 private:
  const Choices* choices_;
  uint32_t lo_ = 0;  // choices [lo_, hi_) begin with the matched_ bytes written
  uint32_t hi_;
  uint32_t matched_ = 0;
};

}  // namespace hlm
