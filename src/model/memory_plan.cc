#include "model/memory_plan.h"

#include <algorithm>
#include <set>

#include <cmath>

#include <fmt/format.h>

#include "base/checked_math.h"
#include "base/log.h"
#include "model/mla_layer.h"

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

StepBytes decode_step_bytes(const ModelConfig& cfg, const Mapping& m, int64_t context, int64_t batch,
                            int64_t tokens_per_block, const StoredDType& held, int64_t kv_bytes,
                            int64_t conv_bytes) {
  const RankWeightBytes w = rank_weight_bytes(weight_layout(cfg), m, held);
  const auto cat = [&](WeightCategory c) {
    return static_cast<double>(w.by_category[static_cast<size_t>(c)]);
  };
  StepBytes b;
  b.weights =
      static_cast<double>(w.total) - cat(WeightCategory::kRoutedExperts) - cat(WeightCategory::kEmbedding);
  const double embedding_rows =
      static_cast<double>(batch) * cat(WeightCategory::kEmbedding) / static_cast<double>(cfg.vocab_size);
  b.weights += embedding_rows;
  double touched_experts = 0;
  const double local = static_cast<double>(m.experts(cfg.num_experts).size());
  if (cfg.num_moe_layers() > 0 && local > 0) {
    const double per_expert = cat(WeightCategory::kRoutedExperts) / (cfg.num_moe_layers() * local);
    const double p = static_cast<double>(cfg.experts_per_token) / static_cast<double>(cfg.num_experts);
    const double touched = local * (1.0 - std::pow(1.0 - p, static_cast<double>(batch)));
    touched_experts = cfg.num_moe_layers() * touched * per_expert;
    b.weights += touched_experts;
  }
  const StateBytes s = state_bytes(cfg, m, kv_bytes, conv_bytes);
  const Placement placement{tokens_per_block, m.cp};
  b.kv = static_cast<double>(batch) * static_cast<double>(placement.local_len(context, m.cp_rank())) *
         static_cast<double>(s.kv_per_token);
  b.state = 2.0 * static_cast<double>(batch) * static_cast<double>(s.kda_recurrent + s.kda_conv);
  const auto section = [&](StepSection x) -> double& { return b.section[static_cast<size_t>(x)]; };
  section(StepSection::kEmbedding) = embedding_rows;
  section(StepSection::kKdaAttention) = cat(WeightCategory::kKda) + b.state;
  section(StepSection::kMlaAttention) = cat(WeightCategory::kMla) + b.kv;
  section(StepSection::kDenseFfn) = cat(WeightCategory::kDenseMlp);
  section(StepSection::kMoeFfn) = cat(WeightCategory::kRouter) + touched_experts +
                                  cat(WeightCategory::kSharedExperts) + cat(WeightCategory::kLatentMoe);
  section(StepSection::kHead) = cat(WeightCategory::kLmHead);
  return b;
}

int64_t step_scratch_bytes(const ModelConfig& cfg, const Mapping& mapping, int64_t tokens,
                           int64_t logit_rows) {
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
  // The expanded MLA prefill's key chunk (mla_layer.h): gathered rows, their latent columns, K and V.
  const int64_t mla_chunk =
      cfg.num_mla_layers() > 0 && mapping.cp == 1
          ? kMlaExpandedKeyChunk * (2 * cfg.mla_cache_dim() + cfg.kv_lora_rank +
                                    2 * tp_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim))
          : 0;
  const int64_t fixed = int64_t{256} << 20;
  return 2 * 4 * (tokens * widest + logit_rows * cfg.vocab_size) + 4 * mla_chunk + fixed;
}

DeviceCachePlan plan_device_caches(const ModelConfig& cfg, const Mapping& mapping, int64_t weight_bytes,
                                   const MemoryInfo& mem, double fraction, int64_t tokens_per_block,
                                   int32_t max_batch, int64_t max_seq_len, int64_t step_tokens,
                                   int64_t logit_rows, const std::string& sized_by,
                                   const std::string& remedy) {
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
  HLM_CHECK(
      left >= 0 && p.pages >= needed_pages,
      "GPU memory: the caches for {} need {} of MLA pages and {} of KDA state, but after the weights ({}) "
      "and the step scratch ({}) only {} remain under --gpu-memory-fraction {}; {}, or use more GPUs (--cp)",
      sized_by, human_bytes(needed_pages * p.page_bytes),
      human_bytes(static_cast<int64_t>(max_batch) * state_bytes_per_slot), human_bytes(weight_bytes),
      human_bytes(p.workspace_bytes), human_bytes(std::max<int64_t>(p.budget - p.workspace_bytes, 0)),
      fraction, remedy);
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
               human_bytes(p.pages * p.page_bytes), p.pages, p.tokens_per_block,
               p.pages * p.tokens_per_block);
}

}  // namespace hlm
