#include "model/memory_plan.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "base/checked_math.h"

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
  const int64_t tokens = checked_mul(placement.local_pages(global_len, r), placement.tokens_per_block,
                                     "MLA KV tokens of one sequence");
  return checked_mul(tokens, s.kv_per_token, "MLA KV bytes of one sequence");
}

int64_t pages_per_rank(const Placement& placement, int64_t max_batch, int64_t max_seq_len) {
  const int64_t pages = checked_mul(max_batch, placement.local_pages(max_seq_len, 0), "MLA pages per rank");
  HLM_CHECK(
      pages <= kMaxPagesPerRank,
      "{} sequences of {} tokens need {} MLA pages of {} tokens on a rank; page ids are int32, so at most "
      "{} fit: lower the batch, the sequence length, or raise --tokens-per-block",
      max_batch, max_seq_len, pages, placement.tokens_per_block, kMaxPagesPerRank);
  return pages;
}

CacheSize cache_size(const ModelConfig& cfg, const Mapping& mapping, int64_t tokens_per_block,
                     int64_t max_batch, int64_t max_seq_len, int64_t kv_bytes, int64_t conv_bytes) {
  const StateBytes s = state_bytes(cfg, mapping, kv_bytes, conv_bytes);
  CacheSize c;
  c.pages = pages_per_rank(Placement{tokens_per_block, mapping.cp}, max_batch, max_seq_len);
  c.kv_pool_bytes = checked_mul(checked_mul(c.pages, tokens_per_block, "MLA page pool tokens"),
                                s.kv_per_token, "MLA page pool bytes");
  c.kda_state_bytes = checked_mul(max_batch, s.kda_recurrent + s.kda_conv, "KDA state bytes");
  checked_add(c.kv_pool_bytes, c.kda_state_bytes, "cache bytes");
  return c;
}

namespace {

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

}  // namespace

void check_cache_fits(const CacheSize& need, int64_t available, const std::string& memory,
                      const std::string& sized_by, const std::string& remedy) {
  if (need.total() <= available) return;
  HLM_FAIL(
      "the caches for {} need {} on this rank (MLA page pool {}: {} pages; KDA state {}), but {} has {} "
      "available; {}",
      sized_by, gib(need.total()), gib(need.kv_pool_bytes), need.pages, gib(need.kda_state_bytes), memory,
      gib(available), remedy);
}

double decode_step_bytes(const ModelConfig& cfg, const Mapping& m, int64_t context, int64_t batch,
                         int64_t tokens_per_block) {
  const RankWeightBytes w =
      rank_weight_bytes(weight_layout(cfg), m, [](const WeightSpec&) { return DType::kF32; });
  double bytes =
      static_cast<double>(w.total - w.by_category[static_cast<size_t>(WeightCategory::kRoutedExperts)]);
  if (cfg.num_moe_layers() > 0) {
    // An expert's gate, up and down matrices act on its input width: the latent width in a latent MoE (K3),
    // the hidden width otherwise. A step touches at most batch·k distinct experts per MoE layer, at least k
    // (batch 1 touches exactly k).
    const int64_t width = cfg.moe_latent_size > 0 ? cfg.moe_latent_size : cfg.hidden_size;
    const double expert_bytes = 3.0 * static_cast<double>(cfg.moe_intermediate_size * width) * 4 / m.moe_tp;
    const double local = static_cast<double>(m.experts(cfg.num_experts).size());
    const double touched =
        std::min(local, static_cast<double>(cfg.experts_per_token) * static_cast<double>(batch) * local /
                            static_cast<double>(cfg.num_experts));
    bytes += cfg.num_moe_layers() * std::max(touched, std::min(local, 1.0)) * expert_bytes;
  }
  const StateBytes s = state_bytes(cfg, m, 4, 4);
  const Placement placement{tokens_per_block, m.cp};
  bytes += static_cast<double>(batch) * (static_cast<double>(placement.local_len(context, m.cp_rank())) *
                                             static_cast<double>(s.kv_per_token) +
                                         2.0 * static_cast<double>(s.kda_recurrent + s.kda_conv));
  return bytes;
}

}  // namespace hlm
