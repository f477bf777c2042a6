#include "base/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include <fmt/format.h>

namespace hlm {

namespace {

const char* npy_descr(DType t) {
  switch (t) {
    case DType::kF32:
      return "<f4";
    case DType::kI32:
      return "<i4";
    default:
      return nullptr;
  }
}

}  // namespace

void write_npy(const std::string& path, const Tensor& t) {
  const char* descr = npy_descr(t.dtype());
  HLM_CHECK(descr != nullptr, "{}: cannot write a {} tensor as .npy", path, t.describe());
  HLM_CHECK(t.device() == Device::kCpu, "{}: tensor is not on the host", path);
  std::string shape;
  for (int i = 0; i < t.rank(); ++i) shape += fmt::format("{},", t.dim(i));
  if (t.rank() > 1) shape.pop_back();
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  // Pad with spaces so magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');

  std::ofstream out(path, std::ios::binary);
  HLM_CHECK(out.good(), "{}: cannot open for writing", path);
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  HLM_CHECK(out.good(), "{}: write failed", path);
}

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HLM_CHECK(in.good(), "{}: cannot open", path);
  char magic[10];
  in.read(magic, 10);
  HLM_CHECK(in.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, "{}: not a .npy file", path);
  HLM_CHECK(magic[6] == 1, "{}: unsupported .npy version {}", path, static_cast<int>(magic[6]));
  size_t len = static_cast<uint8_t>(magic[8]) | static_cast<size_t>(static_cast<uint8_t>(magic[9])) << 8;
  std::string header(len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(len));
  HLM_CHECK(in.good(), "{}: truncated header", path);

  std::smatch m;
  HLM_CHECK(std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")), "{}: no descr", path);
  std::string descr = m[1];
  DType dtype;
  if (descr == "<f4") {
    dtype = DType::kF32;
  } else if (descr == "<i4") {
    dtype = DType::kI32;
  } else {
    HLM_FAIL("{}: unsupported dtype '{}' (expected <f4 or <i4)", path, descr);
  }
  HLM_CHECK(header.find("'fortran_order': False") != std::string::npos, "{}: Fortran order is not supported",
            path);
  HLM_CHECK(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")), "{}: no shape", path);
  Shape shape;
  std::string dims = m[1];
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    shape.push_back(std::stoll(it->str()));
  }
  Tensor t = Tensor::empty(shape, dtype);
  in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  HLM_CHECK(in.gcount() == static_cast<std::streamsize>(t.nbytes()), "{}: data shorter than shape {}", path,
            shape_str(shape));
  return t;
}

}  // namespace hlm
