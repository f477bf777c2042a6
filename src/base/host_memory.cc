#include "base/host_memory.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "base/error.h"

namespace hlm {

int64_t available_host_memory() {
  if (const char* env = std::getenv("HLM_HOST_MEMORY_BYTES")) {
    int64_t v = -1;
    const char* end = env + std::strlen(env);
    auto [p, ec] = std::from_chars(env, end, v);
    HLM_CHECK(ec == std::errc() && p == end && v >= 0, "HLM_HOST_MEMORY_BYTES='{}' is not a byte count", env);
    return v;
  }
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

const char* host_memory_source() {
  return std::getenv("HLM_HOST_MEMORY_BYTES") != nullptr ? "HLM_HOST_MEMORY_BYTES" : "MemAvailable";
}

}  // namespace hlm
