// UTF-8 helpers shared by the encoder (repairing input), the stream decoder (holding back incomplete
// sequences), the output parsers and constrained decoding's vocabulary. Invalid input is repaired exactly as
// CPython's bytes.decode("utf-8", "replace") does: each maximal subpart of an ill-formed sequence (Unicode
// §3.9, "U+FFFD substitution of maximal subparts") becomes one U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hlm {

// Length of the valid UTF-8 sequence starting at s[0], or 0 when s does not start with one (an invalid
// byte, or a sequence cut short by the end of s). `*maximal_subpart` receives, when 0 is returned, how
// many bytes form the maximal ill-formed subpart (>= 1), and whether it was cut short by the end of s.
size_t utf8_sequence_length(std::string_view s, size_t* maximal_subpart = nullptr, bool* truncated = nullptr);

bool is_valid_utf8(std::string_view s);

// `s` with each maximal ill-formed subpart replaced by U+FFFD (s itself when it is valid).
std::string to_valid_utf8(std::string_view s);

// The code point of the valid sequence at s[0] (call only where utf8_sequence_length(s) > 0).
char32_t utf8_decode_at(std::string_view s, size_t* length);

void append_utf8(std::string& out, char32_t cp);

}  // namespace hlm
