#include "base/log.h"

#include <cstdlib>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace hlm {

void init_logging(const std::string& level, int rank, int world_size) {
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
