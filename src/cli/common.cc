#include "cli/common.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"

namespace hlm {

CLI::Validator uint64_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (!text.empty() && ec == std::errc() && ptr == end) return "";
        return fmt::format("'{}' is not an integer in [0, {}]", text, UINT64_MAX);
      },
      "UINT64");
}

CLI::Validator choice_validator(std::vector<std::pair<std::string, int>> choices) {
  std::vector<std::string> names;
  for (const auto& choice : choices) names.push_back(choice.first);
  return CLI::Validator(
      [choices = std::move(choices), names](std::string& text) -> std::string {
        for (const auto& [name, value] : choices) {
          if (CLI::detail::to_lower(text) == name) {
            text = std::to_string(value);
            return "";
          }
        }
        return fmt::format("'{}' is not one of {}", text, fmt::join(names, ", "));
      },
      fmt::format("{{{}}}", fmt::join(names, ",")));
}

void check_stdout() {
  errno = 0;
  std::cout.flush();
  const int reason = errno;
  HLM_CHECK(std::cout.good(), "cannot write to stdout{}",
            reason != 0 ? fmt::format(": {}", std::strerror(reason)) : std::string());
}

}  // namespace hlm
