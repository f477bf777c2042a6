// Test helper: writes safetensors files from a list of (name, dtype, shape, bytes), so tests can build
// both valid checkpoints and deliberately malformed ones (wrong dtype names, bad offsets, raw headers)
// without Python or committed binary fixtures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/tensor.h"

namespace hlm::test {

struct StEntry {
  std::string name;
  std::string dtype;  // the safetensors name, written as given (tests use invalid ones on purpose)
  Shape shape;
  std::vector<uint8_t> bytes;
};

// The header for `entries` laid out back to back in the data section, in order.
nlohmann::json safetensors_header(const std::vector<StEntry>& entries);

// Writes a well-formed file for `entries`.
void write_safetensors(const std::string& path, const std::vector<StEntry>& entries);

// Writes the 8-byte little-endian length of `header`, `header` itself, then `data`: any header text,
// valid or not, consistent with the data or not.
void write_safetensors_raw(const std::string& path, const std::string& header,
                           const std::vector<uint8_t>& data);

void write_file(const std::string& path, const std::vector<uint8_t>& bytes);

// Element bytes in the on-disk (little-endian) layout.
std::vector<uint8_t> f32_bytes(const std::vector<float>& values);
std::vector<uint8_t> bf16_bytes(const std::vector<float>& values);    // rounded to nearest even
std::vector<uint8_t> u16_bytes(const std::vector<uint16_t>& values);  // raw F16 / BF16 bit patterns
std::vector<uint8_t> i32_bytes(const std::vector<int32_t>& values);

}  // namespace hlm::test
