// Assembles the PCRE2 form of the Kimi pattern from its eight alternatives (see kimi_pattern.h).
#include "tokenizer/kimi_pattern.h"

#include <fmt/format.h>

#include "tokenizer/unicode_drift.h"

namespace hlm {

std::string kimi_pretokenizer_pattern() {
  namespace d = unicode_drift;
  // Unicode White_Space, the members of Rust regex's `\s`.
  const std::string ws =
      "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
      "\\x{205F}\\x{3000}";
  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] and [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] as complements
  // of the other categories, each followed by the Unicode 15-16 code points of that class.
  const std::string upper = fmt::format(
      "(?:[^\\p{{Ll}}\\p{{N}}\\p{{P}}\\p{{S}}\\p{{Z}}\\p{{C}}\\p{{sc:Han}}]|[{}{}])", d::kUpper, d::kBoth);
  const std::string lower =
      fmt::format("(?:[^\\p{{Lu}}\\p{{Lt}}\\p{{N}}\\p{{P}}\\p{{S}}\\p{{Z}}\\p{{C}}\\p{{sc:Han}}]|[{}{}])",
                  d::kLower, d::kBoth);
  const std::string prefix = fmt::format("[^\\r\\n\\p{{L}}\\p{{N}}{}]?", d::kLetterOrNumber);
  const std::string contraction = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
  const std::string alternatives[] = {
      fmt::format("[\\p{{sc:Han}}{}]+", d::kHan),
      prefix + upper + "*" + lower + "+" + contraction,
      prefix + upper + "+" + lower + "*" + contraction,
      fmt::format("[\\p{{N}}{}]{{1,3}}", d::kNumber),
      fmt::format(" ?[^{}\\p{{L}}\\p{{N}}{}]+[\\r\\n]*", ws, d::kLetterOrNumber),
      fmt::format("[{}]*[\\r\\n]+", ws),
      fmt::format("[{0}]+(?![^{0}])", ws),
      fmt::format("[{}]+", ws),
  };
  std::string pattern;
  for (const std::string& alt : alternatives) {
    if (!pattern.empty()) pattern += '|';
    pattern += alt;
  }
  return pattern;
}

}  // namespace hlm
