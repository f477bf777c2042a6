// Pieces every subcommand shares beyond the session: option validators for what CLI11 converts without
// checking (an unsigned option saturates past its range and wraps a negative value; an enum choice's
// error lists the enum's numbers), the sampling options of the commands that generate, and the check that
// a command's result reached stdout.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/logits_processor.h"
#include "runtime/sampler.h"

namespace hlm {

// Accepts decimal integers in [0, 2^64 - 1] only (CLI11 would read -1 as 2^64 - 1 and saturate larger
// values), so a --seed is used exactly as given.
CLI::Validator uint64_validator();

// Accepts one of the names (case-insensitive) and replaces it by the number of its value, which CLI11
// converts to the enum; anything else is an error naming the word and listing the names.
CLI::Validator choice_validator(std::vector<std::pair<std::string, int>> choices);

template <class Enum>
CLI::Validator choice_validator(const std::vector<std::pair<std::string, Enum>>& choices) {
  std::vector<std::pair<std::string, int>> numbered;
  for (const auto& [name, value] : choices) numbered.emplace_back(name, static_cast<int>(value));
  return choice_validator(std::move(numbered));
}

// --temperature, --top-k, --top-p, --seed and the logits adjustments (--repetition-penalty,
// --frequency-penalty, --presence-penalty, --min-p), as `generate` and `chat` take them.
void add_sampling_options(CLI::App& cmd, SamplingParams& sampling, LogitsAdjustments& adjust);
// Their ranges, checked before a model loads.
void check_sampling_options(const SamplingParams& sampling, const LogitsAdjustments& adjust);

// Flushes stdout and fails with "cannot write to stdout" (and the system's reason when known) if any of
// the command's output could not be written, e.g. to a full disk or /dev/full: a script must never take
// a truncated result for a complete one.
void check_stdout();

}  // namespace hlm
