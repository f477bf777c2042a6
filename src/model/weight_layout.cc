#include "model/weight_layout.h"

#include <fmt/format.h>

#include "base/error.h"

namespace hlm {

const char* weight_category_name(WeightCategory c) {
  switch (c) {
    case WeightCategory::kEmbedding:
      return "embedding";
    case WeightCategory::kLmHead:
      return "lm_head";
    case WeightCategory::kNorm:
      return "norms";
    case WeightCategory::kKda:
      return "KDA";
    case WeightCategory::kMla:
      return "MLA";
    case WeightCategory::kDenseMlp:
      return "dense MLP";
    case WeightCategory::kRouter:
      return "router";
    case WeightCategory::kRoutedExperts:
      return "routed experts";
    case WeightCategory::kSharedExperts:
      return "shared experts";
  }
  return "?";
}

namespace {

// Builds the table; each add_* call appends one checkpoint tensor.
class LayoutBuilder {
 public:
  explicit LayoutBuilder(const ModelConfig& cfg) : cfg_(cfg) {}

  WeightSpec& add(std::string key, std::string name, Shape shape, WeightCategory cat, int layer,
                  DType dtype = DType::kBF16) {
    WeightSpec s;
    s.key = std::move(key);
    s.name = cfg_.tensor_prefix + name;
    s.shape = std::move(shape);
    s.category = cat;
    s.layer = layer;
    s.typical_dtype = dtype;
    specs_.push_back(std::move(s));
    return specs_.back();
  }
  // Split dimension `dim` of the stored shape (or of `view`) over the ranks chosen by `by`.
  static WeightSpec& split(WeightSpec& s, ShardBy by, int dim, Shape view = {}) {
    s.by = by;
    s.split_dim = dim;
    s.view = std::move(view);
    return s;
  }

  std::vector<WeightSpec> take() { return std::move(specs_); }

 private:
  const ModelConfig& cfg_;
  std::vector<WeightSpec> specs_;
};

void add_kda(LayoutBuilder& b, const ModelConfig& c, int i) {
  const std::string k = fmt::format("layers.{}.kda.", i);
  const std::string n = fmt::format("model.layers.{}.self_attn.", i);
  const int64_t hid = c.hidden_size, d = c.kda_dim(), hd = c.kda_head_dim, h = c.kda_heads;
  const auto cat = WeightCategory::kKda;
  for (const char* p : {"q", "k", "v"}) {
    LayoutBuilder::split(b.add(k + p + "_proj", n + p + "_proj.weight", {d, hid}, cat, i), ShardBy::kWorld,
                         0);
    LayoutBuilder::split(b.add(k + p + "_conv", n + p + "_conv1d.weight", {d, 1, c.kda_conv_kernel}, cat, i),
                         ShardBy::kWorld, 0);
  }
  LayoutBuilder::split(b.add(k + "a_log", n + "A_log", {1, 1, h, 1}, cat, i, DType::kF32), ShardBy::kWorld, 0,
                       {h});
  LayoutBuilder::split(b.add(k + "dt_bias", n + "dt_bias", {d}, cat, i, DType::kF32), ShardBy::kWorld, 0);
  b.add(k + "f_a", n + "f_a_proj.weight", {hd, hid}, cat, i);
  LayoutBuilder::split(b.add(k + "f_b", n + "f_b_proj.weight", {d, hd}, cat, i), ShardBy::kWorld, 0);
  LayoutBuilder::split(b.add(k + "b_proj", n + "b_proj.weight", {h, hid}, cat, i), ShardBy::kWorld, 0);
  b.add(k + "g_a", n + "g_a_proj.weight", {hd, hid}, cat, i);
  LayoutBuilder::split(b.add(k + "g_b", n + "g_b_proj.weight", {d, hd}, cat, i), ShardBy::kWorld, 0);
  b.add(k + "o_norm", n + "o_norm.weight", {hd}, cat, i);
  LayoutBuilder::split(b.add(k + "o_proj", n + "o_proj.weight", {hid, d}, cat, i), ShardBy::kWorld, 1);
}

void add_mla(LayoutBuilder& b, const ModelConfig& c, int i) {
  const std::string k = fmt::format("layers.{}.mla.", i);
  const std::string n = fmt::format("model.layers.{}.self_attn.", i);
  const int64_t hid = c.hidden_size, h = c.mla_heads, qk = c.qk_head_dim(), lat = c.kv_lora_rank;
  const int64_t nope = c.qk_nope_head_dim, v = c.v_head_dim;
  const auto cat = WeightCategory::kMla;
  if (c.q_lora_rank == 0) {
    LayoutBuilder::split(b.add(k + "q_proj", n + "q_proj.weight", {h * qk, hid}, cat, i), ShardBy::kTp, 0,
                         {h, qk * hid});
  } else {
    const int64_t r = c.q_lora_rank;
    b.add(k + "q_a", n + "q_a_proj.weight", {r, hid}, cat, i);
    b.add(k + "q_a_norm", n + "q_a_layernorm.weight", {r}, cat, i);
    LayoutBuilder::split(b.add(k + "q_b", n + "q_b_proj.weight", {h * qk, r}, cat, i), ShardBy::kTp, 0,
                         {h, qk * r});
  }
  b.add(k + "kv_a", n + "kv_a_proj_with_mqa.weight", {c.mla_cache_dim(), hid}, cat, i);
  b.add(k + "kv_a_norm", n + "kv_a_layernorm.weight", {lat}, cat, i);
  // kv_b rows are per-head interleaved [k_nope | v]: W_UK follows the query heads (tp), W_UV the head
  // chunk this rank combines after the all-to-all (N).
  const Shape kv_b{h * (nope + v), lat};
  WeightSpec& uk = b.add(k + "w_uk", n + "kv_b_proj.weight", kv_b, cat, i);
  LayoutBuilder::split(uk, ShardBy::kTp, 0, {h, nope + v, lat});
  uk.fixed = {{1, {0, nope}}};
  WeightSpec& uv = b.add(k + "w_uv", n + "kv_b_proj.weight", kv_b, cat, i);
  LayoutBuilder::split(uv, ShardBy::kWorld, 0, {h, nope + v, lat});
  uv.fixed = {{1, {nope, nope + v}}};
  LayoutBuilder::split(b.add(k + "o_proj", n + "o_proj.weight", {hid, h * v}, cat, i), ShardBy::kWorld, 1);
}

void add_dense(LayoutBuilder& b, const ModelConfig& c, int i) {
  const std::string k = fmt::format("layers.{}.mlp.", i);
  const int64_t hid = c.hidden_size, inter = c.intermediate_size;
  const auto cat = WeightCategory::kDenseMlp;
  // The published checkpoint stores the dense MLP under `mlp.`; transformers' save_pretrained renames it
  // to `block_sparse_moe.` like the MoE layers. Both load.
  auto add = [&](const char* proj, Shape shape, int dim) {
    WeightSpec& s =
        b.add(k + proj, fmt::format("model.layers.{}.mlp.{}.weight", i, proj), std::move(shape), cat, i);
    s.alt_names = {c.tensor_prefix + fmt::format("model.layers.{}.block_sparse_moe.{}.weight", i, proj)};
    LayoutBuilder::split(s, ShardBy::kWorld, dim);
  };
  add("gate_proj", {inter, hid}, 0);
  add("up_proj", {inter, hid}, 0);
  add("down_proj", {hid, inter}, 1);
}

void add_moe(LayoutBuilder& b, const ModelConfig& c, int i) {
  const std::string k = fmt::format("layers.{}.moe.", i);
  const std::string n = fmt::format("model.layers.{}.block_sparse_moe.", i);
  const int64_t hid = c.hidden_size, e = c.num_experts, inter = c.moe_intermediate_size;
  const int64_t shared = c.shared_intermediate_size();
  b.add(k + "gate", n + "gate.weight", {e, hid}, WeightCategory::kRouter, i);
  b.add(k + "bias", n + "gate.e_score_correction_bias", {e}, WeightCategory::kRouter, i);
  for (int64_t x = 0; x < e; ++x) {
    const std::string ek = fmt::format("{}experts.{}.", k, x);
    const std::string en = fmt::format("{}experts.{}.", n, x);
    for (auto [w, shape, dim] :
         {std::tuple{"w1", Shape{inter, hid}, 0}, std::tuple{"w3", Shape{inter, hid}, 0},
          std::tuple{"w2", Shape{hid, inter}, 1}}) {
      WeightSpec& s = b.add(ek + w, en + w + ".weight", shape, WeightCategory::kRoutedExperts, i);
      LayoutBuilder::split(s, ShardBy::kMoeTp, dim);
      s.expert = x;
      s.num_experts = e;
    }
  }
  if (shared > 0) {
    const auto cat = WeightCategory::kSharedExperts;
    LayoutBuilder::split(
        b.add(k + "shared_gate", n + "shared_experts.gate_proj.weight", {shared, hid}, cat, i),
        ShardBy::kWorld, 0);
    LayoutBuilder::split(b.add(k + "shared_up", n + "shared_experts.up_proj.weight", {shared, hid}, cat, i),
                         ShardBy::kWorld, 0);
    LayoutBuilder::split(
        b.add(k + "shared_down", n + "shared_experts.down_proj.weight", {hid, shared}, cat, i),
        ShardBy::kWorld, 1);
  }
}

}  // namespace

std::vector<WeightSpec> weight_layout(const ModelConfig& cfg) {
  LayoutBuilder b(cfg);
  const int64_t hid = cfg.hidden_size;
  b.add("embed", "model.embed_tokens.weight", {cfg.vocab_size, hid}, WeightCategory::kEmbedding, -1);
  for (int i = 0; i < cfg.num_layers; ++i) {
    b.add(fmt::format("layers.{}.input_norm", i), fmt::format("model.layers.{}.input_layernorm.weight", i),
          {hid}, WeightCategory::kNorm, i);
    b.add(fmt::format("layers.{}.post_attn_norm", i),
          fmt::format("model.layers.{}.post_attention_layernorm.weight", i), {hid}, WeightCategory::kNorm, i);
    if (cfg.attn[i] == AttnKind::kKda) {
      add_kda(b, cfg, i);
    } else {
      add_mla(b, cfg, i);
    }
    if (cfg.ffn[i] == FfnKind::kDense) {
      add_dense(b, cfg, i);
    } else {
      add_moe(b, cfg, i);
    }
  }
  b.add("final_norm", "model.norm.weight", {hid}, WeightCategory::kNorm, -1);
  LayoutBuilder::split(b.add("lm_head", "lm_head.weight", {cfg.vocab_size, hid}, WeightCategory::kLmHead, -1),
                       ShardBy::kWorld, 0);
  return b.take();
}

std::optional<TensorBox> rank_box(const WeightSpec& spec, const Mapping& m) {
  if (spec.expert >= 0) {
    Range owned = m.experts(spec.num_experts);
    if (spec.expert < owned.begin || spec.expert >= owned.end) return std::nullopt;
  }
  const Shape& view = spec.view.empty() ? spec.shape : spec.view;
  if (spec.by == ShardBy::kNone && spec.fixed.empty()) return TensorBox{};
  TensorBox box;
  box.view = view;
  for (int64_t d : view) box.ranges.push_back({0, d});
  for (const auto& [dim, range] : spec.fixed) box.ranges[dim] = range;
  Range r;
  switch (spec.by) {
    case ShardBy::kNone:
      return box;
    case ShardBy::kWorld:
      r = even_shard(view[spec.split_dim], m.world(), m.repurposed_rank());
      break;
    case ShardBy::kTp:
      r = even_shard(view[spec.split_dim], m.tp, m.tp_rank());
      break;
    case ShardBy::kMoeTp:
      r = even_shard(view[spec.split_dim], m.moe_tp, m.moe_tp_rank());
      break;
  }
  box.ranges[spec.split_dim] = {r.begin, r.end};
  return box;
}

int64_t box_numel(const WeightSpec& spec, const TensorBox& box) {
  if (box.ranges.empty()) return shape_numel(spec.shape);
  int64_t n = 1;
  for (const auto& [b, e] : box.ranges) n *= e - b;
  return n;
}

}  // namespace hlm
