#include "runtime/choice_prefix.h"

#include <algorithm>

#include "base/error.h"
#include "runtime/sorted_narrow.h"

namespace hlm {

namespace {

// Like a schema, a choice list comes with a request: its size bounds the per-token work.
constexpr size_t kMaxChoices = 4096;

}  // namespace

std::shared_ptr<const Choices> make_choices(std::vector<std::string> choices, const std::string& where) {
  HLM_CHECK(!choices.empty(), "{}: a non-empty list of strings", where);
  HLM_CHECK(choices.size() <= kMaxChoices, "{}: at most {} choices (got {})", where, kMaxChoices,
            choices.size());
  for (size_t i = 0; i < choices.size(); ++i) {
    HLM_CHECK(!choices[i].empty(), "{}[{}]: an empty choice (the output would be empty)", where, i);
  }
  std::sort(choices.begin(), choices.end());
  choices.erase(std::unique(choices.begin(), choices.end()), choices.end());
  return std::make_shared<const Choices>(std::move(choices));
}

bool ChoicePrefix::feed(unsigned char c) {
  const Choices& all = *choices_;
  const auto [lo, hi] =
      narrow(lo_, hi_, matched_, c, [&all](uint32_t j) -> const std::string& { return all[j]; });
  if (lo == hi) return false;
  lo_ = lo;
  hi_ = hi;
  ++matched_;
  return true;
}

void ChoicePrefix::append_key(std::string& key) const {
  for (uint32_t v : {lo_, hi_, matched_}) key.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace hlm
