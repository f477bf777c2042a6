// Errors and check macros. Every failure in helixlm is an hlm::Error whose message names the file, tensor,
// field or rule at fault; the macros add the source location that raised it (the TensorRT-LLM habit), so
// a user reads what is wrong and a developer finds where it was detected.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace hlm {

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line)
      : std::runtime_error(message), file_(file), line_(line) {}

  // Where the error was detected, "src/x.cc:12", for logs; what() holds the user-facing message.
  std::string location() const { return fmt::format("{}:{}", file_, line_); }

 private:
  const char* file_;
  int line_;
};

[[noreturn]] inline void throw_error(const char* file, int line, const std::string& message) {
  throw Error(message, file, line);
}

}  // namespace hlm

#define HLM_FAIL(...) ::hlm::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

#define HLM_CHECK(cond, ...)    \
  do {                          \
    if (!(cond)) [[unlikely]] { \
      HLM_FAIL(__VA_ARGS__);    \
    }                           \
  } while (0)
