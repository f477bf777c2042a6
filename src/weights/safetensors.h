// safetensors files, memory-mapped. Opening a file validates its header completely (well-formed JSON,
// known dtypes, offsets inside the data section, no overlaps, byte length = shape x dtype size) before
// any tensor is used, so a malformed or truncated file is an error naming the file and the tensor rather
// than a crash later. Nothing is read from the mapping until a tensor (or a box of it) is asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/tensor.h"

namespace hlm {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  size_t data_begin = 0;  // byte offset inside the data section
  size_t data_end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws hlm::Error naming the file and the offending tensor/field.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // Pointer to the first byte of a tensor's data inside the mapping.
  const std::byte* data(const TensorInfo& info) const;

 private:
  std::string path_;
  std::map<std::string, TensorInfo> tensors_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  size_t data_offset_ = 0;  // 8 + header length
};

// A box of a stored tensor: `view` is a reshape of the stored shape (empty: the stored shape) and
// `ranges` gives [begin, end) per dimension of the view (empty: everything). Reading a box copies only
// the bytes inside it, so a rank can load its shard of a weight without touching the rest.
struct TensorBox {
  Shape view;
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

// A checkpoint directory: `model.safetensors`, or shards listed by `model.safetensors.index.json`
// (every shard named there must exist and hold the tensors the index maps to it).
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const;
  // Throws naming the tensor and the checkpoint directory when absent.
  const TensorInfo& info(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // The file holding `name`, for messages.
  const std::string& file_of(const std::string& name) const;

  // Reads `name` (stored as F32, F16 or BF16) converted to an F32 host tensor of the box's shape.
  // The stored shape must equal `expected`: otherwise an error names the tensor, the file, and the
  // expected and actual shapes. The same for a stored dtype that is not a float type.
  Tensor read_f32(const std::string& name, const Shape& expected, const TensorBox& box = {}) const;
  // Reads `name` in its stored dtype (any dtype, e.g. U8 for packed MXFP4), same checks.
  Tensor read_raw(const std::string& name, const Shape& expected, const TensorBox& box = {}) const;

  // Bytes copied out of the mappings so far (in stored dtype), for per-rank loading accounting.
  size_t bytes_read() const { return bytes_read_; }

 private:
  const SafetensorsFile& file_for(const std::string& name) const;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_index_;  // tensor name -> files_ index
  mutable size_t bytes_read_ = 0;
};

}  // namespace hlm
