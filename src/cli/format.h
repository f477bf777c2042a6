// Number formatting shared by the human-readable reports (inspect, plan).
#pragma once

#include <cstdint>
#include <string>

namespace hlm {

// 49122681728 -> "49,122,681,728"
inline std::string grouped(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace hlm
