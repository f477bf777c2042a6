#include "model/memory_plan.h"

#include <set>

namespace hlm {

RankWeightBytes rank_weight_bytes(const std::vector<WeightSpec>& layout, const Mapping& mapping,
                                  const StoredDType& dtype_of) {
  RankWeightBytes out;
  for (const WeightSpec& s : layout) {
    const std::optional<TensorBox> box = rank_box(s, mapping);
    if (!box) continue;
    const int64_t bytes = box_numel(s, *box) * static_cast<int64_t>(dtype_size(dtype_of(s)));
    out.by_category[static_cast<size_t>(s.category)] += bytes;
    out.total += bytes;
  }
  return out;
}

int64_t parameter_count(const ModelConfig& cfg) {
  std::set<std::string> seen;
  int64_t n = 0;
  for (const WeightSpec& s : weight_layout(cfg)) {
    if (seen.insert(s.name).second) n += stored_parameters(s);
  }
  return n;
}

StateBytes state_bytes(const ModelConfig& cfg, const Mapping& mapping, int64_t kv_bytes, int64_t conv_bytes) {
  StateBytes s;
  s.kv_per_token = cfg.num_mla_layers() * cfg.mla_cache_dim() * kv_bytes;
  if (cfg.num_kda_layers() > 0) {
    const int64_t heads = mapping.kda_heads(cfg.kda_heads).size();
    const int64_t k = cfg.kda_head_dim;
    s.kda_recurrent = cfg.num_kda_layers() * heads * k * k * 4;
    s.kda_conv = cfg.num_kda_layers() * 3 * heads * k * (cfg.kda_conv_kernel - 1) * conv_bytes;
  }
  return s;
}

int64_t kv_bytes_at(const StateBytes& s, const Placement& placement, int r, int64_t global_len) {
  return placement.local_pages(global_len, r) * placement.tokens_per_block * s.kv_per_token;
}

}  // namespace hlm
