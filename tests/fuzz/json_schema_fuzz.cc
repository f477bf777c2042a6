// libFuzzer target for response_format's JSON schemas: the input's first line is a schema, the rest bytes to
// follow it with. A schema comes with a request, so any outcome of compiling it other than success
// or an hlm::Error is a bug; and the recognizer must never reach a prefix it cannot complete: after each
// byte it accepts, either the output is complete or some byte continues it.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "runtime/json_schema_prefix.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* split = std::find(data, data + size, uint8_t{'\n'});
  const nlohmann::ordered_json doc =
      nlohmann::ordered_json::parse(data, split, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  std::shared_ptr<const hlm::JsonSchema> schema;
  try {
    schema = hlm::JsonSchema::compile(doc, "fuzz");
  } catch (const hlm::Error&) {
    return 0;
  }
  hlm::JsonSchemaPrefix p(*schema);
  for (const uint8_t* c = split == data + size ? split : split + 1; c < data + size; ++c) {
    if (!p.feed(*c)) break;
    if (p.complete()) continue;
    bool some = false;
    for (int b = 0; b < 256 && !some; ++b) {
      hlm::JsonSchemaPrefix next = p;
      some = next.feed(static_cast<unsigned char>(b));
    }
    if (!some) __builtin_trap();
  }
  return 0;
}
