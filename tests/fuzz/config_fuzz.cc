// libFuzzer target for the config parser: the input bytes are parsed as JSON and, when that succeeds,
// as a model config. A config.json is outside input, so any outcome other than success, a JSON parse
// error or an hlm::Error (a crash, a sanitizer report, another exception, a hang) is a bug.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "config/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json doc = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  try {
    hlm::parse_model_config(doc, "fuzz/config.json");
  } catch (const hlm::Error&) {
  }
  return 0;
}
