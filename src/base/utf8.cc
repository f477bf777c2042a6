// UTF-8 validation and repair with CPython's "replace" semantics (see utf8.h).
#include "base/utf8.h"

namespace hlm {

namespace {

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t* maximal_subpart, bool* truncated) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  auto invalid = [&](size_t subpart, bool cut) -> size_t {
    if (maximal_subpart) *maximal_subpart = subpart;
    if (truncated) *truncated = cut;
    return 0;
  };
  if (n == 0) return invalid(0, true);
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return invalid(1, false);
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) return invalid(i, true);
    const unsigned char b = p[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : is_cont(b);
    if (!ok) return invalid(i, false);
  }
  return need;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = utf8_sequence_length(s.substr(i));
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    size_t subpart = 0;
    const size_t len = utf8_sequence_length(s.substr(i), &subpart);
    if (len > 0) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += subpart;
    }
  }
  return out;
}

char32_t utf8_decode_at(std::string_view s, size_t* length) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t len = utf8_sequence_length(s);
  if (length) *length = len;
  switch (len) {
    case 1:
      return p[0];
    case 2:
      return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3:
      return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    case 4:
      return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
             (p[3] & 0x3F);
    default:
      return 0xFFFD;
  }
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace hlm
