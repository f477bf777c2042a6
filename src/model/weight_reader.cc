#include "model/weight_reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include <spdlog/spdlog.h>

#include "base/error.h"

namespace hlm {

namespace {

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

WeightReader::WeightReader(const Checkpoint& ckpt, const ModelConfig& cfg, const Mapping& mapping)
    : ckpt_(ckpt), mapping_(mapping) {
  std::set<std::string> used;
  for (WeightSpec& s : weight_layout(cfg)) {
    const std::string& name = stored_name(s);
    used.insert(name);
    const TensorInfo& info = ckpt_.info(name);
    HLM_CHECK(info.shape == s.shape, "tensor '{}' in {}: expected shape {} for this config ({}), found {}",
              name, ckpt_.file_of(name), shape_str(s.shape), cfg.source, shape_str(info.shape));
    std::string key = s.key;
    specs_.emplace(std::move(key), std::move(s));
  }
  if (mapping.rank == 0) warn_unused(ckpt_, cfg, used);  // once, not once per rank
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
