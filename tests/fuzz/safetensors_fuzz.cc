// libFuzzer target for the safetensors reader: the input bytes become `model.safetensors` in a scratch
// directory, which is opened as a Checkpoint and every tensor read whole and as a box. A checkpoint is
// outside input, so any outcome other than success or an hlm::Error (a crash, a sanitizer report, another
// exception, a hang) is a bug.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "scratch_dir.h"
#include "weights/safetensors.h"

namespace {

bool is_float(hlm::DType t) {
  return t == hlm::DType::kF32 || t == hlm::DType::kF16 || t == hlm::DType::kBF16;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const hlm::fuzz::ScratchDir scratch("hlm_safetensors_fuzz");
  const std::string& dir = scratch.path;
  {
    std::ofstream out(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out.good()) abort();
  }
  try {
    hlm::Checkpoint ck(dir);
    for (const std::string& name : ck.names()) {
      const hlm::TensorInfo& info = ck.info(name);
      ck.read_raw(name, info.shape);
      if (!is_float(info.dtype)) continue;
      ck.read_f32(name, info.shape);
      if (!info.shape.empty()) {  // the second half of the leading dimension, as a shard read would take
        hlm::TensorBox box;
        for (int64_t d : info.shape) box.ranges.emplace_back(0, d);
        box.ranges[0].first = info.shape[0] / 2;
        ck.read_f32(name, info.shape, box);
      }
    }
  } catch (const hlm::Error&) {
    // Rejecting malformed input with an hlm::Error is the expected outcome.
  }
  return 0;
}
