#include "model/weight_source.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/error.h"

namespace hlm {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// FNV-1a: a seed per tensor name that is the same on every platform (std::hash is not).
uint64_t name_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// One warning listing the checkpoint tensors the model does not read: usually a checkpoint of another
// variant (a layer or feature this config does not have), which would otherwise run with those weights
// silently ignored. K3's vision tower and projector are skipped by design (docs/k3.md) and not listed.
void warn_unused(const Checkpoint& ckpt, const ModelConfig& cfg, const std::set<std::string>& used) {
  constexpr size_t kListed = 20;
  std::vector<std::string> unused;
  for (const std::string& name : ckpt.names()) {
    const bool skipped = cfg.model_type == "kimi_k3" &&
                         (name.starts_with("vision_tower.") || name.starts_with("mm_projector."));
    if (!skipped && used.count(name) == 0) unused.push_back(name);
  }
  if (unused.empty()) return;
  const size_t shown = std::min(unused.size(), kListed);
  spdlog::warn("checkpoint {}: {} tensor(s) not used by the model ({}): {}{}", ckpt.dir(), unused.size(),
               cfg.source,
               fmt::join(unused.begin(), unused.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
               unused.size() > shown ? fmt::format(", ... ({} more)", unused.size() - shown) : "");
}

}  // namespace

WeightSource::WeightSource(const ModelConfig& cfg, const Mapping& mapping, Ops* ops)
    : mapping_(mapping), ops_(ops) {
  for (WeightSpec& s : weight_layout(cfg)) {
    std::string key = s.key;
    specs_.emplace(std::move(key), std::move(s));
  }
}

const WeightSpec& WeightSource::spec(const std::string& key) const {
  auto it = specs_.find(key);
  HLM_CHECK(it != specs_.end(), "no weight '{}' in the layout of this model", key);
  return it->second;
}

bool WeightSource::holds(const std::string& key) const { return rank_box(spec(key), mapping_).has_value(); }

TensorBox WeightSource::box(const std::string& key) const {
  const WeightSpec& s = spec(key);
  std::optional<TensorBox> b = rank_box(s, mapping_);
  HLM_CHECK(b.has_value(), "rank {} holds no part of '{}'", mapping_.rank, s.name);
  return *b;
}

Shape WeightSource::shard_shape(const std::string& key) const { return box_shape(spec(key), box(key)); }

Ops& WeightSource::ops() const {
  HLM_CHECK(ops_ != nullptr, "this weight source reads host tensors only (no backend to load into)");
  return *ops_;
}

Tensor WeightSource::load(const std::string& key) {
  const DType stored = stored_dtype(key);
  Tensor dst = ops().empty(shard_shape(key), stored == DType::kU8 ? stored : ops().weight_dtype(stored));
  load_into(key, dst);
  return dst;
}

void WeightSource::load_into(const std::string& key, Tensor dst) {
  const WeightSpec& s = spec(key);
  const TensorBox b = box(key);
  const Shape shape = box_shape(s, b);
  HLM_CHECK(shape_numel(shape) == dst.numel(), "weight '{}': this rank's box {} does not fit {}", s.name,
            shape_str(shape), dst.describe());
  Tensor view = dst.reshape(shape);
  fill(s, b, view);
  bytes_loaded_ += static_cast<int64_t>(dst.nbytes());
}

int64_t WeightSource::bytes_to_load() const {
  int64_t total = 0;
  for (const auto& [key, s] : specs_) {
    std::optional<TensorBox> b = rank_box(s, mapping_);
    if (!b.has_value() || ends_with(key, "a_log_tail")) continue;  // the tail is only checked on the host
    const DType stored = stored_dtype(key);
    const DType kept = stored == DType::kU8 || ops_ == nullptr ? stored : ops_->weight_dtype(stored);
    total += box_numel(s, *b) * static_cast<int64_t>(dtype_size(kept));
  }
  return total;
}

WeightReader::WeightReader(const Checkpoint& ckpt, const ModelConfig& cfg, const Mapping& mapping, Ops* ops)
    : WeightSource(cfg, mapping, ops), ckpt_(ckpt) {
  std::set<std::string> used;
  for (const auto& [key, s] : specs_) used.insert(checked_tensor(ckpt_, s, cfg.source).name);
  if (mapping.rank == 0) warn_unused(ckpt_, cfg, used);  // once, not once per rank
}

DType WeightReader::stored_dtype(const std::string& key) const {
  return ckpt_.info(stored_name(ckpt_, spec(key))).dtype;
}

Tensor WeightReader::read(const std::string& key) {
  const WeightSpec& s = spec(key);
  return ckpt_.read_f32(stored_name(ckpt_, s), s.shape, box(key));
}

Tensor WeightReader::read_raw(const std::string& key) {
  const WeightSpec& s = spec(key);
  return ckpt_.read_raw(stored_name(ckpt_, s), s.shape, box(key));
}

void WeightReader::fill(const WeightSpec& spec, const TensorBox& box, Tensor& dst) {
  const Tensor host = ckpt_.read_raw(stored_name(ckpt_, spec), spec.shape, box);
  ops().upload_into(host, dst);
}

RandomWeights::RandomWeights(const ModelConfig& cfg, const Mapping& mapping, Ops& ops, uint64_t seed)
    : WeightSource(cfg, mapping, &ops), seed_(seed) {}

Tensor RandomWeights::read_host_f32(const std::string& key) {
  return Tensor::zeros(shard_shape(key), DType::kF32);
}

void RandomWeights::fill(const WeightSpec& spec, const TensorBox& box, Tensor& dst) {
  // Scales that keep activations finite through any depth: matrices uniform with variance 1/fan_in (so a
  // projection preserves the scale of its input), norm weights around 1, gate parameters in the ranges
  // trained models show, and MXFP4 group exponents that give the experts the same 1/sqrt(fan_in) scale.
  RandomFill f;
  f.seed = seed_ ^ name_hash(spec.name) ^ (static_cast<uint64_t>(mapping_.rank) << 56);
  const std::string_view key = spec.key;
  const int64_t fan_in = spec.shape.empty() ? 1 : spec.shape.back();
  if (spec.storage == WeightSpec::Storage::kMxfp4Codes) {
    f.byte_lo = 0;
    f.byte_hi = 255;
  } else if (spec.storage == WeightSpec::Storage::kMxfp4Scales) {
    // e2m1 codes have an RMS near 2.9; 2^(s-127) with s ≈ 127 - log2(2.9·sqrt(fan_in)).
    const int s = 127 - static_cast<int>(std::lround(std::log2(2.9 * std::sqrt(32.0 * fan_in))));
    f.byte_lo = static_cast<uint8_t>(s - 1);
    f.byte_hi = static_cast<uint8_t>(s + 1);
  } else if (ends_with(key, "norm")) {
    f.offset = 1.0f;
    f.scale = 0.1f;
  } else if (ends_with(key, "a_log") || ends_with(key, "dt_bias")) {
    f.scale = 1.0f;
  } else if (ends_with(key, "a_log_tail")) {
    f.scale = 0.0f;  // K3's padding must be zero
  } else if (ends_with(key, "bias")) {
    f.scale = 0.01f;
  } else if (key == "embed") {
    f.scale = 1.0f;
  } else {
    f.scale = static_cast<float>(std::sqrt(3.0 / static_cast<double>(fan_in)));
  }
  (void)box;
  ops().random_fill(dst, f);
}

}  // namespace hlm
