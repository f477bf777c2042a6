// The Kimi pre-tokenizer pattern (tokenization_kimi.py's pat_str) in a form PCRE2 10.42 compiles to the
// same splits as tiktoken's Rust regex (docs/architecture.md, "Tokenizer"):
// - the two `&&` class intersections (PCRE2 10.42 reads `&&` as literal characters) become complements,
//   which is exact because the general categories partition the code points;
// - `\s` becomes the explicit Unicode White_Space set (PCRE2's UCP `\s` also matches U+180E);
// - code points assigned after Unicode 14 (PCRE2's tables) and before 16 (tiktoken's) are added to the
//   classes that Unicode 16 puts them in (unicode_drift.h, generated and checked against tiktoken).
#pragma once

#include <string>

namespace hlm {

// The pattern for pcre2_compile with PCRE2_UTF | PCRE2_UCP.
std::string kimi_pretokenizer_pattern();

}  // namespace hlm
