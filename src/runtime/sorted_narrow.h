// narrow(): one step of matching a byte string against a sorted set of candidates, shared by the JSON
// recognizer (property keys, enum values) and the tool-call recognizer (tool names).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace hlm {

// Candidates [lo, hi), sorted bytewise and sharing their first `offset` bytes, are ordered by their byte at
// `offset` (a candidate that ends there first): those whose byte there is `c` form one run, found by two
// binary searches. text(j) gives candidate j.
template <class Text>
std::pair<uint32_t, uint32_t> narrow(uint32_t lo, uint32_t hi, uint32_t offset, unsigned char c, Text text) {
  auto byte = [&](uint32_t j) -> int {
    const std::string& s = text(j);
    return offset < s.size() ? static_cast<unsigned char>(s[offset]) : -1;
  };
  uint32_t l = lo;
  uint32_t h = hi;
  while (l < h) {
    const uint32_t m = l + (h - l) / 2;
    if (byte(m) < c) {
      l = m + 1;
    } else {
      h = m;
    }
  }
  const uint32_t first = l;
  h = hi;
  while (l < h) {
    const uint32_t m = l + (h - l) / 2;
    if (byte(m) <= c) {
      l = m + 1;
    } else {
      h = m;
    }
  }
  return {first, l};
}

}  // namespace hlm
