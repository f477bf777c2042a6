// Overflow-checked size arithmetic. Sizes derived from outside input (shapes in a checkpoint header,
// command-line lengths and batch sizes, page counts) are multiplied in int64; a product that wraps would
// allocate a tiny buffer that later writes overrun, so every such product goes through these helpers and
// an overflow is an hlm::Error naming what was being sized.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/error.h"

namespace hlm {

// a * b, or an error "<what>: a x b overflows 64-bit sizes". Operands must be non-negative.
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  HLM_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r), "{}: {} x {} overflows 64-bit sizes", what,
            a, b);
  return r;
}

// a + b, or an error naming `what`. Operands must be non-negative.
inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  HLM_CHECK(a >= 0 && b >= 0 && !__builtin_add_overflow(a, b, &r), "{}: {} + {} overflows 64-bit sizes", what,
            a, b);
  return r;
}

}  // namespace hlm
