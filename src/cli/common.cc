#include "cli/common.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <iostream>
#include <limits>

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

void add_sampling_options(CLI::App& cmd, SamplingParams& sampling, LogitsAdjustments& adjust) {
  cmd.add_option("--temperature", sampling.temperature, "0 = greedy")->capture_default_str();
  cmd.add_option("--top-k", sampling.top_k, "Keep the k most likely tokens (0 = all)")->capture_default_str();
  cmd.add_option("--top-p", sampling.top_p, "Nucleus sampling threshold")->capture_default_str();
  cmd.add_option("--seed", sampling.seed, "Random seed for sampling")
      ->check(uint64_validator())
      ->capture_default_str();
  cmd.add_option("--repetition-penalty", adjust.repetition_penalty,
                 "Divide positive logits (multiply negative ones) of tokens already in the prompt or output")
      ->capture_default_str();
  cmd.add_option("--frequency-penalty", adjust.frequency_penalty,
                 "Subtract from a token's logit this much per occurrence in the output")
      ->capture_default_str();
  cmd.add_option("--presence-penalty", adjust.presence_penalty,
                 "Subtract from a token's logit this much once it occurs in the output")
      ->capture_default_str();
  cmd.add_option("--min-p", adjust.min_p, "Drop tokens less likely than this share of the likeliest")
      ->capture_default_str();
}

void check_sampling_options(const SamplingParams& sampling, const LogitsAdjustments& adjust) {
  validate(sampling);
  // No logit_bias on the command line: the vocabulary plays no part yet.
  validate(adjust, std::numeric_limits<int64_t>::max());
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
