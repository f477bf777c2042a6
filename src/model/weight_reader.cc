#include "model/weight_reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"

namespace hlm {

WeightReader::WeightReader(const Checkpoint& ckpt, const ModelConfig& cfg, const Mapping& mapping)
    : ckpt_(ckpt), mapping_(mapping) {
  for (WeightSpec& s : weight_layout(cfg)) {
    const std::string& name = stored_name(s);
    const TensorInfo& info = ckpt_.info(name);
    HLM_CHECK(info.shape == s.shape, "tensor '{}' in {}: expected shape {} for this config ({}), found {}",
              name, ckpt_.file_of(name), shape_str(s.shape), cfg.source, shape_str(info.shape));
    std::string key = s.key;
    specs_.emplace(std::move(key), std::move(s));
  }
}

const std::string& WeightReader::stored_name(const WeightSpec& spec) const {
  if (ckpt_.has(spec.name)) return spec.name;
  for (const std::string& alt : spec.alt_names) {
    if (ckpt_.has(alt)) return alt;
  }
  if (spec.alt_names.empty()) return spec.name;  // info() reports the missing tensor
  HLM_FAIL("checkpoint {} has no tensor '{}' (also looked for {})", ckpt_.dir(), spec.name,
           fmt::join(spec.alt_names, ", "));
}

const WeightSpec& WeightReader::spec(const std::string& key) const {
  auto it = specs_.find(key);
  HLM_CHECK(it != specs_.end(), "no weight '{}' in the layout of this model", key);
  return it->second;
}

bool WeightReader::holds(const std::string& key) const { return rank_box(spec(key), mapping_).has_value(); }

Tensor WeightReader::read(const std::string& key) {
  const WeightSpec& s = spec(key);
  std::optional<TensorBox> box = rank_box(s, mapping_);
  HLM_CHECK(box.has_value(), "rank {} holds no part of '{}'", mapping_.rank, s.name);
  return ckpt_.read_f32(stored_name(s), s.shape, *box);
}

Tensor WeightReader::read_raw(const std::string& key) {
  const WeightSpec& s = spec(key);
  std::optional<TensorBox> box = rank_box(s, mapping_);
  HLM_CHECK(box.has_value(), "rank {} holds no part of '{}'", mapping_.rank, s.name);
  return ckpt_.read_raw(stored_name(s), s.shape, *box);
}

}  // namespace hlm
