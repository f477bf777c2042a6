// Logging: spdlog to stderr, so stdout stays clean for the machine-readable outputs of the CLI. Under
// several ranks only rank 0 logs at info level unless HLM_LOG_ALL_RANKS is set; every line names its rank.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace hlm {

// level: "trace", "debug", "info", "warn", "error", "off"; anything else is an error naming --log-level.
void init_logging(const std::string& level, int rank, int world_size);

// 1536 -> "1.5 KiB", 98.2e9 -> "91.5 GiB": sizes in log lines and messages.
std::string human_bytes(int64_t bytes);

}  // namespace hlm
