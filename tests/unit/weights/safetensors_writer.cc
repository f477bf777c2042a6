// Test helper implementation; see safetensors_writer.h.
#include "safetensors_writer.h"

#include <cstring>
#include <fstream>

#include "base/error.h"
#include "base/half.h"

namespace hlm::test {
namespace {

template <class T>
std::vector<uint8_t> to_bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());  // hosts are little-endian
  return out;
}

}  // namespace

nlohmann::json safetensors_header(const std::vector<StEntry>& entries) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const StEntry& e : entries) {
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  return header;
}

void write_safetensors(const std::string& path, const std::vector<StEntry>& entries) {
  std::vector<uint8_t> data;
  for (const StEntry& e : entries) data.insert(data.end(), e.bytes.begin(), e.bytes.end());
  write_safetensors_raw(path, safetensors_header(entries).dump(), data);
}

void write_safetensors_raw(const std::string& path, const std::string& header,
                           const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_file(path, bytes);
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  HLM_CHECK(out.good(), "cannot write {}", path);
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& values) { return to_bytes(values); }

std::vector<uint8_t> bf16_bytes(const std::vector<float>& values) {
  std::vector<uint16_t> bits;
  bits.reserve(values.size());
  for (float v : values) bits.push_back(f32_to_bf16(v));
  return to_bytes(bits);
}

std::vector<uint8_t> u16_bytes(const std::vector<uint16_t>& values) { return to_bytes(values); }

std::vector<uint8_t> i32_bytes(const std::vector<int32_t>& values) { return to_bytes(values); }

}  // namespace hlm::test
