#include "base/log.h"

#include <cstdlib>

#include "base/error.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace hlm {

void init_logging(const std::string& level, int rank, int world_size) {
  // spdlog reads an unknown name as "off", which would hide every log line, errors included.
  static constexpr const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
  bool known = false;
  for (const char* l : kLevels) known = known || level == l;
  HLM_CHECK(known, "--log-level '{}' is not one of trace, debug, info, warn, error, off", level);
  auto logger = spdlog::stderr_color_mt("helixlm");
  std::string prefix = world_size > 1 ? fmt::format("[rank {}] ", rank) : "";
  logger->set_pattern(prefix + "%^[%l]%$ %v");
  spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  if (rank != 0 && std::getenv("HLM_LOG_ALL_RANKS") == nullptr && lvl < spdlog::level::warn) {
    lvl = spdlog::level::warn;
  }
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
}

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 5) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace hlm
