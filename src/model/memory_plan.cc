#include "model/memory_plan.h"

#include <algorithm>
#include <set>

#include "base/log.h"

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

int64_t step_scratch_bytes(const ModelConfig& cfg, const Mapping& mapping, int64_t tokens, int64_t logit_rows) {
  const int64_t n = mapping.world();
  const int64_t hidden = cfg.hidden_size;
  const int64_t kda_heads = cfg.kda_heads / n;
  const int64_t kda_local = kda_heads * cfg.kda_head_dim;
  // Projections, conv, gate and core outputs, plus the chunked prefill's fp32 workspace (q̂, k̂, Γ, U, W per
  // key channel and a row of the chunk's pair matrices per head).
  const int64_t kda = 14 * kda_local + 4 * hidden + kda_heads * (5 * cfg.kda_head_dim + 64);
  const int64_t tp_heads = cfg.mla_heads / std::max(1, mapping.tp);
  const int64_t mla = tp_heads * (cfg.qk_head_dim() + 4 * cfg.mla_cache_dim() + 2) + 4 * cfg.mla_cache_dim() +
                      4 * hidden + 2 * cfg.mla_heads * cfg.v_head_dim;
  const int64_t dense = 4 * cfg.intermediate_size / n + 2 * hidden;
  const int64_t width = cfg.moe_latent_size > 0 ? cfg.moe_latent_size : hidden;
  const int64_t moe = cfg.experts_per_token * (3 * cfg.moe_intermediate_size + width + 4) +
                      3 * cfg.shared_intermediate_size() + 6 * hidden + 2 * cfg.num_experts;
  const int64_t widest = std::max({kda, mla, dense, moe}) + 4 * hidden;
  const int64_t fixed = int64_t{256} << 20;
  return 2 * 4 * (tokens * widest + logit_rows * cfg.vocab_size) + fixed;
}

DeviceCachePlan plan_device_caches(const ModelConfig& cfg, const Mapping& mapping, int64_t weight_bytes,
                                   const MemoryInfo& mem, double fraction,
                                   int64_t tokens_per_block, int32_t max_batch, int64_t max_seq_len,
                                   int64_t step_tokens, int64_t logit_rows) {
  DeviceCachePlan p;
  p.weights = weight_bytes;
  p.budget = static_cast<int64_t>(fraction * static_cast<double>(mem.total)) - (mem.total - mem.free);
  p.workspace_bytes = step_scratch_bytes(cfg, mapping, step_tokens, logit_rows);
  p.slots = max_batch;
  const StateBytes s = state_bytes(cfg, mapping, 2, 2);  // bf16 latent cache and conv window
  const int64_t state_bytes_per_slot = s.kda_recurrent + s.kda_conv;
  p.state_bytes_per_slot = state_bytes_per_slot;
  p.tokens_per_block = tokens_per_block;
  p.page_bytes = s.kv_per_token * tokens_per_block;
  const Placement placement{tokens_per_block, mapping.cp};
  const int64_t needed_pages = static_cast<int64_t>(max_batch) * placement.local_pages(max_seq_len, 0);
  const int64_t left = p.budget - p.workspace_bytes - static_cast<int64_t>(max_batch) * state_bytes_per_slot;
  p.pages = p.page_bytes > 0 ? std::max<int64_t>(left, 0) / p.page_bytes : needed_pages;
  HLM_CHECK(left >= 0 && p.pages >= needed_pages,
            "GPU memory: --max-batch {} sequences of --max-seq-len {} tokens need {} of MLA pages and {} of "
            "KDA state, but after the weights ({}) and the step scratch ({}) only {} remain under "
            "--gpu-memory-fraction {}; lower --max-batch or --max-seq-len, or use more GPUs (--cp)",
            max_batch, max_seq_len, human_bytes(needed_pages * p.page_bytes),
            human_bytes(static_cast<int64_t>(max_batch) * state_bytes_per_slot), human_bytes(weight_bytes),
            human_bytes(p.workspace_bytes),
            human_bytes(std::max<int64_t>(p.budget - p.workspace_bytes, 0)), fraction);
  if (p.page_bytes == 0) p.pages = std::max<int64_t>(needed_pages, 1);
  return p;
}

void log_device_cache_plan(const DeviceCachePlan& p) {
  spdlog::info("GPU memory plan (budget {}):", human_bytes(p.budget));
  spdlog::info("  weights          {:>12}", human_bytes(p.weights));
  spdlog::info("  step workspace   {:>12}", human_bytes(p.workspace_bytes));
  spdlog::info("  KDA state slots  {:>12}  ({} slots of {})", human_bytes(p.slots * p.state_bytes_per_slot),
               p.slots, human_bytes(p.state_bytes_per_slot));
  spdlog::info("  MLA KV pages     {:>12}  ({} pages of {} tokens: {} tokens fit on this rank)",
               human_bytes(p.pages * p.page_bytes), p.pages, p.tokens_per_block, p.pages * p.tokens_per_block);
}

}  // namespace hlm
