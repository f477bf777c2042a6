// A scratch directory for one fuzzing process, removed at exit. On tmpfs (/dev/shm) when there is one: on
// a disk-backed /tmp the per-input write and mmap cut throughput about 30x.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace hlm::fuzz {

struct ScratchDir {
  explicit ScratchDir(const std::string& name) {
    std::error_code ec;
    std::filesystem::path base =
        std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : std::filesystem::temp_directory_path();
    path = (base / (name + "_XXXXXX")).string();
    if (mkdtemp(path.data()) == nullptr) abort();
  }
  ScratchDir(const ScratchDir&) = delete;  // a copy's destructor would remove the directory
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

}  // namespace hlm::fuzz
