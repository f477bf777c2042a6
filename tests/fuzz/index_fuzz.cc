// libFuzzer target for model.safetensors.index.json: the input bytes become the index of a scratch
// checkpoint directory holding two small valid shards, which is then opened and every tensor read. An
// index is outside input, so any outcome other than success or an hlm::Error (a crash, a sanitizer
// report, another exception, a hang) is a bug.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "scratch_dir.h"
#include "weights/safetensors.h"

namespace {

// A shard holding F32 tensors `names`, one value each.
void write_shard(const std::string& path, const std::vector<std::string>& names) {
  std::string header = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) header += ",";
    header += "\"" + names[i] + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
              std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  }
  header += "}";
  const uint64_t len = header.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << std::string(4 * names.size(), '\0');
  if (!out.good()) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const hlm::fuzz::ScratchDir scratch("hlm_index_fuzz");
  static const bool shards_written = [] {
    write_shard(scratch.path + "/s1.safetensors", {"a", "b"});
    write_shard(scratch.path + "/s2.safetensors", {"c"});
    return true;
  }();
  (void)shards_written;
  {
    std::ofstream out(scratch.path + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out.good()) abort();
  }
  try {
    hlm::Checkpoint ck(scratch.path);
    for (const std::string& name : ck.names()) ck.read_f32(name, ck.info(name).shape);
  } catch (const hlm::Error&) {
    // Rejecting a malformed index with an hlm::Error is the expected outcome.
  }
  return 0;
}
