// SafetensorsFile: maps a .safetensors file and validates its whole header up front. A checkpoint is
// outside input (downloaded, possibly truncated or hand-edited), so every field is checked before a
// pointer into the mapping is ever formed; afterwards data() can be trusted without further checks.
#include "weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_parse.h"

namespace hlm {
namespace {

using nlohmann::json;

// Real headers are a few MB at most (a 20k-tensor checkpoint is ~2 MB); the bound keeps a corrupt length
// from making us parse gigabytes of tensor data as JSON.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU8}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

// Reads a JSON integer that must be >= 0 and fit in int64 (shape dims are int64 in Shape).
std::optional<uint64_t> non_negative_int(const json& j) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return v;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

TensorInfo parse_entry(const std::string& path, const std::string& name, const json& entry,
                       uint64_t data_size) {
  HLM_CHECK(entry.is_object(), "{}: tensor '{}': header entry is not a JSON object", path, name);
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    HLM_CHECK(entry.contains(field), "{}: tensor '{}': header entry has no \"{}\"", path, name, field);
  }
  TensorInfo info;
  info.name = name;

  const json& dtype = entry.at("dtype");
  HLM_CHECK(dtype.is_string(), "{}: tensor '{}': \"dtype\" is not a string", path, name);
  std::optional<DType> parsed = parse_dtype(dtype.get_ref<const std::string&>());
  HLM_CHECK(parsed.has_value(),
            "{}: tensor '{}': unsupported dtype '{}' (supported: F32, F16, BF16, I32, I64, U8)", path, name,
            dtype.get_ref<const std::string&>());
  info.dtype = *parsed;

  const json& shape = entry.at("shape");
  HLM_CHECK(shape.is_array(), "{}: tensor '{}': \"shape\" is not an array", path, name);
  // numel, multiplied in the order shape_numel() does, must stay within int64 at every step so that later
  // shape arithmetic on this tensor cannot overflow, even for an empty tensor with huge other dimensions.
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : shape) {
    std::optional<uint64_t> v = non_negative_int(d);
    HLM_CHECK(v.has_value(), "{}: tensor '{}': \"shape\" holds {}, not a non-negative integer", path, name,
              d.dump());
    info.shape.push_back(static_cast<int64_t>(*v));
    overflow = overflow || __builtin_mul_overflow(numel, *v, &numel) ||
               numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, dtype_size(info.dtype), &nbytes);
  HLM_CHECK(!overflow, "{}: tensor '{}': shape {} overflows", path, name, shape_str(info.shape));

  const json& offsets = entry.at("data_offsets");
  HLM_CHECK(offsets.is_array() && offsets.size() == 2,
            "{}: tensor '{}': \"data_offsets\" is not a [begin, end] pair", path, name);
  std::optional<uint64_t> begin = non_negative_int(offsets[0]);
  std::optional<uint64_t> end = non_negative_int(offsets[1]);
  HLM_CHECK(begin && end, "{}: tensor '{}': \"data_offsets\" {} are not non-negative integers", path, name,
            offsets.dump());
  HLM_CHECK(*begin <= *end && *end <= data_size,
            "{}: tensor '{}': data_offsets [{}, {}] outside the data section of {} bytes", path, name, *begin,
            *end, data_size);
  HLM_CHECK(*end - *begin == nbytes, "{}: tensor '{}': {} bytes stored, but {} {} needs {}", path, name,
            *end - *begin, dtype_name(info.dtype), shape_str(info.shape), nbytes);
  info.data_begin = *begin;
  info.data_end = *end;
  return info;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HLM_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    HLM_FAIL("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    HLM_FAIL("{} is not a regular file", path);
  }
  uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    HLM_FAIL("{}: {} bytes is too short for a safetensors file (needs an 8-byte header length)", path,
             file_size);
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  HLM_CHECK(map != MAP_FAILED, "cannot mmap {}: {}", path, std::strerror(map_err));
  map_ = map;
  map_size_ = file_size;

  // From here on the destructor will not run if we throw, so unmap on the way out.
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];  // little-endian on disk
    HLM_CHECK(header_len <= file_size - 8, "{}: header length {} runs past the end of the {}-byte file", path,
              header_len, file_size);
    HLM_CHECK(header_len <= kMaxHeaderBytes, "{}: header length {} exceeds the {}-byte limit", path,
              header_len, kMaxHeaderBytes);
    data_offset_ = 8 + header_len;
    uint64_t data_size = file_size - data_offset_;

    const json header =
        parse_json(std::string_view(reinterpret_cast<const char*>(bytes) + 8, header_len), path + ": header");
    HLM_CHECK(header.is_object(), "{}: header is not a JSON object", path);

    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        HLM_CHECK(entry.is_object(), "{}: \"__metadata__\" is not an object", path);
        for (const auto& [key, value] : entry.items()) {
          HLM_CHECK(value.is_string(), "{}: \"__metadata__\" entry '{}' is not a string", path, key);
        }
        continue;
      }
      tensors_.emplace(name, parse_entry(path, name, entry, data_size));
    }

    // Overlap check: sorted by begin, each non-empty range must start at or after the previous one's end.
    std::vector<const TensorInfo*> by_offset;
    for (const auto& [name, info] : tensors_) {
      if (info.data_end > info.data_begin) by_offset.push_back(&info);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->data_begin < b->data_begin; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const TensorInfo& prev = *by_offset[i - 1];
      const TensorInfo& cur = *by_offset[i];
      HLM_CHECK(cur.data_begin >= prev.data_end,
                "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap in the data section", path, prev.name,
                prev.data_begin, prev.data_end, cur.name, cur.data_begin, cur.data_end);
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    throw;
  }
  spdlog::debug("mapped {}: {} tensors, {} bytes", path, tensors_.size(), map_size_);
}

SafetensorsFile::~SafetensorsFile() { ::munmap(map_, map_size_); }

const std::byte* SafetensorsFile::data(const TensorInfo& info) const {
  return static_cast<const std::byte*>(map_) + data_offset_ + info.data_begin;
}

}  // namespace hlm
