// Checkpoint: a directory of safetensors shards seen as one name -> tensor map, and box reads out of it.
// A rank loads only its shard of each weight, so reads take a box (a reshaped view plus per-dimension
// ranges) and copy just the bytes inside it, run by contiguous run, converting to fp32 on the way when
// asked. The index and the shards are cross-checked when the directory is opened, so a missing or
// inconsistent shard is reported once, up front, by name.
#include <atomic>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/half.h"
#include "base/json_parse.h"
#include "weights/safetensors.h"

namespace hlm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Number of trailing dot-separated components two tensor names share ("...q_proj.weight" -> 2).
int shared_suffix_parts(std::string_view a, std::string_view b) {
  int parts = 0;
  size_t i = a.size();
  size_t j = b.size();
  while (i > 0 && j > 0 && a[i - 1] == b[j - 1]) {
    --i;
    --j;
    if ((i == 0 || a[i - 1] == '.') && (j == 0 || b[j - 1] == '.')) ++parts;
  }
  return parts;
}

// Names that end like `name` (a different prefix, layer or module), for a "did you mean" hint: the usual
// mistake is a prefix (`language_model.`) or a layer index, not a typo in the leaf.
std::string close_names_hint(const std::string& name, const std::map<std::string, size_t>& index) {
  constexpr int kMinParts = 2;
  constexpr size_t kMaxHints = 3;
  int best = kMinParts;
  std::vector<std::string_view> hints;
  for (const auto& [candidate, file] : index) {
    int parts = shared_suffix_parts(name, candidate);
    if (parts > best) {
      best = parts;
      hints.clear();
    }
    if (parts == best && hints.size() < kMaxHints) hints.push_back(candidate);
  }
  if (hints.empty()) return "";
  return fmt::format(" (similar: {})", fmt::join(hints, ", "));
}

json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  HLM_CHECK(in.good(), "cannot open {}", path.string());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_json(text, path.string());
}

// A box resolved against a stored tensor. The box is copied as numel / run contiguous runs of `run`
// elements, enumerated row-major over the outer (non-contiguous) dimensions of the box.
struct BoxPlan {
  Shape extents;                      // the output shape
  int64_t numel = 0;                  // elements in the box
  int64_t run = 1;                    // elements per contiguous run
  std::vector<int64_t> outer_extent;  // box extent of each outer dimension
  std::vector<int64_t> outer_stride;  // source stride (elements) of each outer dimension
  int64_t origin = 0;                 // source element offset of the box's first element
  Shape view;                         // the view the box is taken of
  std::vector<int64_t> begin;         // the box's first index in each dimension of the view
};

BoxPlan plan_box(const std::string& name, const std::string& file, const Shape& stored,
                 const TensorBox& box) {
  const Shape& view = box.view.empty() ? stored : box.view;
  for (int64_t d : view) {
    HLM_CHECK(d >= 0, "tensor '{}' in {}: view {} has a negative dimension", name, file, shape_str(view));
  }
  HLM_CHECK(shape_numel(view) == shape_numel(stored),
            "tensor '{}' in {}: view {} has {} elements, stored shape {} has {}", name, file, shape_str(view),
            shape_numel(view), shape_str(stored), shape_numel(stored));
  const size_t rank = view.size();
  HLM_CHECK(box.ranges.empty() || box.ranges.size() == rank,
            "tensor '{}' in {}: {} ranges for view {} of rank {}", name, file, box.ranges.size(),
            shape_str(view), rank);

  std::vector<int64_t> begin(rank, 0);
  BoxPlan plan;
  plan.extents = view;
  plan.view = view;
  for (size_t d = 0; d < box.ranges.size(); ++d) {
    auto [b, e] = box.ranges[d];
    HLM_CHECK(0 <= b && b <= e && e <= view[d],
              "tensor '{}' in {}: range [{}, {}) of dimension {} is outside [0, {}) of view {}", name, file,
              b, e, d, view[d], shape_str(view));
    begin[d] = b;
    plan.extents[d] = e - b;
  }
  plan.numel = shape_numel(plan.extents);

  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * view[d];
  for (size_t d = 0; d < rank; ++d) plan.origin += begin[d] * stride[d];

  // Dimensions taken whole at the inner end merge with the next partial one into a single contiguous run.
  size_t inner = rank == 0 ? 0 : rank - 1;
  while (inner > 0 && plan.extents[inner] == view[inner]) --inner;
  for (size_t d = inner; d < rank; ++d) plan.run *= plan.extents[d];
  plan.outer_extent.assign(plan.extents.begin(), plan.extents.begin() + inner);
  plan.outer_stride.assign(stride.begin(), stride.begin() + inner);
  plan.begin = std::move(begin);
  return plan;
}

// Calls copy(dst_element, src_element, count) for every piece of the box, in parallel. Long runs are cut
// into pieces so that a whole-tensor read (a single run) still spreads over the threads.
template <class CopyFn>
void for_each_piece(const BoxPlan& plan, CopyFn copy) {
  if (plan.numel == 0) return;
  constexpr int64_t kPiece = int64_t{1} << 16;
  const int64_t runs = plan.numel / plan.run;
  const int64_t pieces_per_run = (plan.run + kPiece - 1) / kPiece;
  const int64_t pieces = runs * pieces_per_run;
  const int outer = static_cast<int>(plan.outer_extent.size());
#pragma omp parallel for schedule(static) if (plan.numel >= (int64_t{1} << 18))
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t r = p / pieces_per_run;
    const int64_t part = p % pieces_per_run;
    int64_t src = plan.origin;
    int64_t rest = r;
    for (int d = outer - 1; d >= 0; --d) {
      src += rest % plan.outer_extent[d] * plan.outer_stride[d];
      rest /= plan.outer_extent[d];
    }
    const int64_t lo = plan.run * part / pieces_per_run;
    const int64_t hi = plan.run * (part + 1) / pieces_per_run;
    copy(r * plan.run + lo, src + lo, hi - lo);
  }
}

// The bits of a float type that make a value NaN or Inf: an exponent of all ones.
constexpr uint32_t kF32Exponent = 0x7f800000u;
constexpr uint16_t kBF16Exponent = 0x7f80u;
constexpr uint16_t kF16Exponent = 0x7c00u;

// Copies n values of `Bits` (converted by Convert, or as they are) and returns whether all are finite.
// Weights are checked here, while every byte passes anyway, rather than in a second pass over gigabytes.
// The count (not a bool) lets the compiler vectorize the loop: measured at memcpy speed, where a bool
// flag made it 6x slower. A piece is at most 2^16 values, far from wrapping the count.
template <class Bits, Bits kExponent, class Out, Out (*Convert)(Bits)>
bool copy_checked(Out* dst, const std::byte* src, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits v;
    std::memcpy(&v, src + sizeof(Bits) * i, sizeof(Bits));  // the data section need not be aligned
    bad += (v & kExponent) == kExponent;
    dst[i] = Convert(v);
  }
  return bad == 0;
}

template <class T>
T identity(T v) {
  return v;
}

float bits_to_f32(uint32_t v) { return std::bit_cast<float>(v); }

// Where the first non-finite value of a box lies, as an index of the stored tensor, for the error.
std::string non_finite_at(const BoxPlan& plan, const Shape& stored, const std::byte* box, DType dtype) {
  const int64_t n = plan.numel;
  int64_t first = 0;
  bool nan = false;
  for (; first < n; ++first) {
    uint32_t v = 0;
    if (dtype == DType::kF32) {
      std::memcpy(&v, box + 4 * first, 4);
      if ((v & kF32Exponent) == kF32Exponent) {
        nan = (v & 0x007fffffu) != 0;
        break;
      }
    } else {
      uint16_t h = 0;
      std::memcpy(&h, box + 2 * first, 2);
      const uint16_t exp = dtype == DType::kBF16 ? kBF16Exponent : kF16Exponent;
      if ((h & exp) == exp) {
        nan = (h & static_cast<uint16_t>(~exp & 0x7fffu)) != 0;
        break;
      }
    }
  }
  // Box index -> view index -> flat index -> stored index (the view is a reshape of the stored shape).
  int64_t flat = 0, rest = first;
  std::vector<int64_t> in_box(plan.extents.size());
  for (size_t d = plan.extents.size(); d-- > 0;) {
    in_box[d] = plan.extents[d] == 0 ? 0 : rest % plan.extents[d];
    rest = plan.extents[d] == 0 ? 0 : rest / plan.extents[d];
  }
  for (size_t d = 0; d < plan.view.size(); ++d) flat = flat * plan.view[d] + in_box[d] + plan.begin[d];
  Shape at(stored.size());
  for (size_t d = stored.size(); d-- > 0;) {
    at[d] = flat % stored[d];
    flat /= stored[d];
  }
  return fmt::format("{} at {}", nan ? "NaN" : "Inf", shape_str(at));
}

}  // namespace

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";

  auto add_file = [&](const fs::path& path) -> const SafetensorsFile& {
    files_.push_back(std::make_unique<SafetensorsFile>(path.string()));
    const SafetensorsFile& file = *files_.back();
    for (const auto& [name, info] : file.tensors()) {
      auto [it, inserted] = file_index_.emplace(name, files_.size() - 1);
      HLM_CHECK(inserted, "tensor '{}' is stored twice: in {} and in {}", name, files_[it->second]->path(),
                file.path());
    }
    return file;
  };

  std::error_code ec;  // an unreadable directory reads as "absent" and ends in the error below
  if (fs::exists(index_path, ec)) {
    const std::string index_name = index_path.string();
    json index = read_json_file(index_path);
    HLM_CHECK(index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
              "{}: no \"weight_map\" object", index_name);
    // Shard file -> the tensors the index places in it; std::map opens each distinct shard once.
    std::map<std::string, std::vector<std::string>> shards;
    for (const auto& [name, file] : index.at("weight_map").items()) {
      HLM_CHECK(file.is_string(), "{}: weight_map entry for '{}' is not a file name", index_name, name);
      shards[file.get<std::string>()].push_back(name);
    }
    HLM_CHECK(!shards.empty(), "{}: weight_map is empty", index_name);
    for (const auto& [shard, names] : shards) {
      const fs::path shard_path = fs::path(dir) / shard;
      HLM_CHECK(fs::is_regular_file(shard_path, ec),
                "{} maps {} tensors (e.g. '{}') to {}, which does not exist", index_name, names.size(),
                names.front(), shard_path.string());
      const SafetensorsFile& file = add_file(shard_path);
      for (const std::string& name : names) {
        HLM_CHECK(file.tensors().count(name) != 0, "{} maps tensor '{}' to {}, which does not hold it",
                  index_name, name, file.path());
      }
    }
  } else if (fs::exists(single_path, ec)) {
    add_file(single_path);
  } else {
    HLM_FAIL("no model.safetensors or model.safetensors.index.json in {}", dir);
  }
  spdlog::debug("checkpoint {}: {} tensors in {} files", dir, file_index_.size(), files_.size());
}

bool Checkpoint::has(const std::string& name) const { return file_index_.count(name) != 0; }

const TensorInfo& Checkpoint::info(const std::string& name) const {
  return file_for(name).tensors().at(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(file_index_.size());
  for (const auto& [name, file] : file_index_) out.push_back(name);
  return out;
}

const std::string& Checkpoint::file_of(const std::string& name) const { return file_for(name).path(); }

const SafetensorsFile& Checkpoint::file_for(const std::string& name) const {
  auto it = file_index_.find(name);
  if (it == file_index_.end()) {
    HLM_FAIL("tensor '{}' is not in checkpoint {}{}", name, dir_, close_names_hint(name, file_index_));
  }
  return *files_[it->second];
}

Tensor Checkpoint::read_raw(const std::string& name, const Shape& expected, const TensorBox& box) const {
  const SafetensorsFile& file = file_for(name);
  const TensorInfo& info = file.tensors().at(name);
  HLM_CHECK(info.shape == expected, "tensor '{}' in {}: expected shape {}, found {}", name, file.path(),
            shape_str(expected), shape_str(info.shape));
  const BoxPlan plan = plan_box(name, file.path(), info.shape, box);
  Tensor out = Tensor::empty(plan.extents, info.dtype);
  const size_t esize = dtype_size(info.dtype);
  auto* dst = static_cast<std::byte*>(out.raw());
  const std::byte* src = file.data(info);
  std::atomic<bool> finite{true};
  for_each_piece(plan, [&](int64_t d, int64_t s, int64_t n) {
    bool ok = true;
    switch (info.dtype) {
      case DType::kF32:
        ok = copy_checked<uint32_t, kF32Exponent, uint32_t, identity>(
            reinterpret_cast<uint32_t*>(dst + d * 4), src + s * 4, n);
        break;
      case DType::kBF16:
        ok = copy_checked<uint16_t, kBF16Exponent, uint16_t, identity>(
            reinterpret_cast<uint16_t*>(dst + d * 2), src + s * 2, n);
        break;
      case DType::kF16:
        ok = copy_checked<uint16_t, kF16Exponent, uint16_t, identity>(
            reinterpret_cast<uint16_t*>(dst + d * 2), src + s * 2, n);
        break;
      default:  // integer codes (packed MXFP4, ids) have no non-finite values
        std::memcpy(dst + d * esize, src + s * esize, n * esize);
        break;
    }
    if (!ok) finite.store(false, std::memory_order_relaxed);
  });
  HLM_CHECK(finite.load(), "tensor '{}' in {} holds a non-finite value ({}): the checkpoint is corrupt", name,
            file.path(), non_finite_at(plan, info.shape, dst, info.dtype));
  bytes_read_ += static_cast<size_t>(plan.numel) * esize;
  return out;
}

Tensor Checkpoint::read_f32(const std::string& name, const Shape& expected, const TensorBox& box) const {
  const SafetensorsFile& file = file_for(name);
  const TensorInfo& info = file.tensors().at(name);
  HLM_CHECK(info.shape == expected, "tensor '{}' in {}: expected shape {}, found {}", name, file.path(),
            shape_str(expected), shape_str(info.shape));
  HLM_CHECK(info.dtype == DType::kF32 || info.dtype == DType::kF16 || info.dtype == DType::kBF16,
            "tensor '{}' in {}: stored as {}, which is not a float type (F32, F16, BF16)", name, file.path(),
            dtype_name(info.dtype));
  const BoxPlan plan = plan_box(name, file.path(), info.shape, box);
  Tensor out = Tensor::empty(plan.extents, DType::kF32);
  float* dst = out.data<float>();
  const std::byte* src = file.data(info);
  std::atomic<bool> finite{true};
  for_each_piece(plan, [&](int64_t d, int64_t s, int64_t n) {
    bool ok = true;
    switch (info.dtype) {
      case DType::kF32:
        ok = copy_checked<uint32_t, kF32Exponent, float, bits_to_f32>(dst + d, src + s * 4, n);
        break;
      case DType::kBF16:
        ok = copy_checked<uint16_t, kBF16Exponent, float, bf16_to_f32>(dst + d, src + s * 2, n);
        break;
      default:  // F16, checked above
        ok = copy_checked<uint16_t, kF16Exponent, float, f16_to_f32>(dst + d, src + s * 2, n);
        break;
    }
    if (!ok) finite.store(false, std::memory_order_relaxed);
  });
  if (!finite.load()) {
    // Only on failure: the box again in its stored dtype, to name the first bad value.
    const size_t esize = dtype_size(info.dtype);
    std::vector<std::byte> stored_box(static_cast<size_t>(plan.numel) * esize);
    for_each_piece(plan, [&](int64_t d, int64_t s, int64_t n) {
      std::memcpy(stored_box.data() + d * esize, src + s * esize, n * esize);
    });
    HLM_FAIL("tensor '{}' in {} holds a non-finite value ({}): the checkpoint is corrupt", name, file.path(),
             non_finite_at(plan, info.shape, stored_box.data(), info.dtype));
  }
  bytes_read_ += static_cast<size_t>(plan.numel) * dtype_size(info.dtype);
  return out;
}

}  // namespace hlm
