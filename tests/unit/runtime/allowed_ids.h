// The ids a ConstrainedOutput's mask leaves at its current state, for the recognizer tests.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/output_constraint.h"

namespace hlm {

inline std::vector<int32_t> allowed_ids(const ConstrainedOutput& out, int32_t vocab) {
  std::vector<float> x(static_cast<size_t>(vocab), 0.0f);
  out.mask(x.data(), vocab, -1.0f);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < vocab; ++i) {
    if (x[i] == 0.0f) ids.push_back(i);
  }
  return ids;
}

}  // namespace hlm
