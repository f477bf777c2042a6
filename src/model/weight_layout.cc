#include "model/weight_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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
    case WeightCategory::kLatentMoe:
      return "latent MoE";
    case WeightCategory::kAttnRes:
      return "AttnRes";
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

// K3 stores A_log as one zero-padded row of a multiple of 128 entries (docs/k3.md).
int64_t padded_a_log_size(int64_t heads) { return (heads + 127) / 128 * 128; }

void add_kda(LayoutBuilder& b, const ModelConfig& c, int i) {
  const std::string k = fmt::format("layers.{}.kda.", i);
  const std::string n = fmt::format("model.layers.{}.self_attn.", i);
  const int64_t hid = c.hidden_size, d = c.kda_dim(), hd = c.kda_head_dim, h = c.kda_heads;
  const auto cat = WeightCategory::kKda;
  const bool k3 = c.model_type == "kimi_k3";
  const DType small = k3 ? DType::kF32 : DType::kBF16;  // K3 keeps conv and o_norm weights in f32
  for (const char* p : {"q", "k", "v"}) {
    LayoutBuilder::split(b.add(k + p + "_proj", n + p + "_proj.weight", {d, hid}, cat, i), ShardBy::kWorld,
                         0);
    LayoutBuilder::split(
        b.add(k + p + "_conv", n + p + "_conv1d.weight", {d, 1, c.kda_conv_kernel}, cat, i, small),
        ShardBy::kWorld, 0);
  }
  if (k3) {
    const int64_t padded = padded_a_log_size(h);
    WeightSpec& a = b.add(k + "a_log", n + "A_log", {padded}, cat, i, DType::kF32);
    LayoutBuilder::split(a, ShardBy::kWorld, 0);
    a.fixed = {{0, {0, h}}};
    if (padded > h)
      b.add(k + "a_log_tail", n + "A_log", {padded}, cat, i, DType::kF32).fixed = {{0, {h, padded}}};
  } else {
    LayoutBuilder::split(b.add(k + "a_log", n + "A_log", {1, 1, h, 1}, cat, i, DType::kF32), ShardBy::kWorld,
                         0, {h});
  }
  LayoutBuilder::split(b.add(k + "dt_bias", n + "dt_bias", {d}, cat, i, DType::kF32), ShardBy::kWorld, 0);
  b.add(k + "f_a", n + "f_a_proj.weight", {hd, hid}, cat, i);
  LayoutBuilder::split(b.add(k + "f_b", n + "f_b_proj.weight", {d, hd}, cat, i), ShardBy::kWorld, 0);
  LayoutBuilder::split(b.add(k + "b_proj", n + "b_proj.weight", {h, hid}, cat, i), ShardBy::kWorld, 0);
  if (c.kda_full_rank_gate) {
    LayoutBuilder::split(b.add(k + "g_proj", n + "g_proj.weight", {d, hid}, cat, i), ShardBy::kWorld, 0);
  } else {
    b.add(k + "g_a", n + "g_a_proj.weight", {hd, hid}, cat, i);
    LayoutBuilder::split(b.add(k + "g_b", n + "g_b_proj.weight", {d, hd}, cat, i), ShardBy::kWorld, 0);
  }
  b.add(k + "o_norm", n + "o_norm.weight", {hd}, cat, i, small);
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
  if (c.mla_output_gate) {
    // Rows of head chunk r', the same heads as o_proj's input columns on this rank.
    LayoutBuilder::split(b.add(k + "g_proj", n + "g_proj.weight", {h * v, hid}, cat, i), ShardBy::kWorld, 0);
  }
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

// One routed-expert matrix [rows, cols], split over moe_tp along `dim`: a bf16 weight, or (K3) the MXFP4
// pair weight_packed [rows, cols/2] + weight_scale [rows, cols/32].
void add_expert_matrix(LayoutBuilder& b, const ModelConfig& c, const std::string& key,
                       const std::string& name, int64_t rows, int64_t cols, int dim, int64_t expert,
                       int layer) {
  auto finish = [&](WeightSpec& s) {
    LayoutBuilder::split(s, ShardBy::kMoeTp, dim);
    s.expert = expert;
    s.num_experts = c.num_experts;
  };
  const auto cat = WeightCategory::kRoutedExperts;
  if (!c.mxfp4_experts) {
    finish(b.add(key, name + ".weight", {rows, cols}, cat, layer));
    return;
  }
  WeightSpec& codes =
      b.add(key + ".packed", name + ".weight_packed", {rows, cols / 2}, cat, layer, DType::kU8);
  codes.storage = WeightSpec::Storage::kMxfp4Codes;
  finish(codes);
  WeightSpec& scales =
      b.add(key + ".scale", name + ".weight_scale", {rows, cols / 32}, cat, layer, DType::kU8);
  scales.storage = WeightSpec::Storage::kMxfp4Scales;
  finish(scales);
}

void add_moe(LayoutBuilder& b, const ModelConfig& c, int i) {
  const std::string k = fmt::format("layers.{}.moe.", i);
  const std::string n = fmt::format("model.layers.{}.block_sparse_moe.", i);
  const int64_t hid = c.hidden_size, e = c.num_experts, inter = c.moe_intermediate_size;
  const int64_t shared = c.shared_intermediate_size();
  const bool k3 = c.model_type == "kimi_k3";
  b.add(k + "gate", n + "gate.weight", {e, hid}, WeightCategory::kRouter, i);
  b.add(k + "bias", n + "gate.e_score_correction_bias", {e}, WeightCategory::kRouter, i,
        k3 ? DType::kF32 : DType::kBF16);
  // Routed experts read the hidden state, or (K3) its projection to the latent width.
  const int64_t width = c.moe_latent_size > 0 ? c.moe_latent_size : hid;
  if (c.moe_latent_size > 0) {
    const auto cat = WeightCategory::kLatentMoe;
    b.add(k + "latent_down", n + "routed_expert_down_proj.weight", {width, hid}, cat, i);
    if (c.moe_latent_norm) b.add(k + "latent_norm", n + "routed_expert_norm.weight", {width}, cat, i);
    b.add(k + "latent_up", n + "routed_expert_up_proj.weight", {hid, width}, cat, i);
  }
  for (int64_t x = 0; x < e; ++x) {
    const std::string ek = fmt::format("{}experts.{}.", k, x);
    const std::string en = fmt::format("{}experts.{}.", n, x);
    add_expert_matrix(b, c, ek + "w1", en + "w1", inter, width, 0, x, i);
    add_expert_matrix(b, c, ek + "w3", en + "w3", inter, width, 0, x, i);
    add_expert_matrix(b, c, ek + "w2", en + "w2", width, inter, 1, x, i);
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

// Block attention residuals (K3): a norm weight and a [1, hidden] projection per mixing point.
void add_attn_res(LayoutBuilder& b, const ModelConfig& c, const std::string& key, const std::string& name,
                  int layer) {
  b.add(key + "_norm", name + "_norm.weight", {c.hidden_size}, WeightCategory::kAttnRes, layer);
  b.add(key + "_proj", name + "_proj.weight", {1, c.hidden_size}, WeightCategory::kAttnRes, layer);
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
    if (cfg.attn_res_block_size > 0) {
      add_attn_res(b, cfg, fmt::format("layers.{}.attn_res", i),
                   fmt::format("model.layers.{}.self_attention_res", i), i);
      add_attn_res(b, cfg, fmt::format("layers.{}.mlp_res", i), fmt::format("model.layers.{}.mlp_res", i), i);
    }
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
  if (cfg.attn_res_block_size > 0) add_attn_res(b, cfg, "output_res", "model.output_attn_res", -1);
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
  // A split divides the part of its dimension the spec takes (all of it unless fixed).
  const auto [first, last] = box.ranges[spec.split_dim];
  Range r;
  switch (spec.by) {
    case ShardBy::kNone:
      return box;
    case ShardBy::kWorld:
      r = even_shard(last - first, m.world(), m.repurposed_rank());
      break;
    case ShardBy::kTp:
      r = even_shard(last - first, m.tp, m.tp_rank());
      break;
    case ShardBy::kMoeTp:
      r = even_shard(last - first, m.moe_tp, m.moe_tp_rank());
      break;
  }
  box.ranges[spec.split_dim] = {first + r.begin, first + r.end};
  return box;
}

int64_t box_numel(const WeightSpec& spec, const TensorBox& box) {
  if (box.ranges.empty()) return shape_numel(spec.shape);
  int64_t n = 1;
  for (const auto& [b, e] : box.ranges) n *= e - b;
  return n;
}

Shape box_shape(const WeightSpec& spec, const TensorBox& box) {
  Shape shape = box.view.empty() ? spec.shape : box.view;
  for (size_t d = 0; d < box.ranges.size(); ++d) shape[d] = box.ranges[d].second - box.ranges[d].first;
  return shape;
}

const std::string& stored_name(const Checkpoint& ckpt, const WeightSpec& spec) {
  if (ckpt.has(spec.name)) return spec.name;
  for (const std::string& alt : spec.alt_names) {
    if (ckpt.has(alt)) return alt;
  }
  if (spec.alt_names.empty()) return spec.name;
  HLM_FAIL("checkpoint {} has no tensor '{}' (also looked for {})", ckpt.dir(), spec.name,
           fmt::join(spec.alt_names, ", "));
}

const TensorInfo& checked_tensor(const Checkpoint& ckpt, const WeightSpec& spec,
                                 const std::string& cfg_source) {
  const std::string& name = stored_name(ckpt, spec);
  const TensorInfo& info = ckpt.info(name);
  HLM_CHECK(info.shape == spec.shape, "tensor '{}' in {}: expected shape {} for this config ({}), found {}",
            name, ckpt.file_of(name), shape_str(spec.shape), cfg_source, shape_str(info.shape));
  // Integer data of the right byte size would otherwise load as garbage floats, or reach an op that
  // names no tensor; MXFP4 codes and scales are bytes, everything else is a float weight.
  if (spec.storage == WeightSpec::Storage::kPlain) {
    HLM_CHECK(info.dtype == DType::kF32 || info.dtype == DType::kF16 || info.dtype == DType::kBF16,
              "tensor '{}' in {}: stored as {}, but it is a float weight; valid: F32, F16 or BF16", name,
              ckpt.file_of(name), dtype_name(info.dtype));
  } else {
    HLM_CHECK(
        info.dtype == DType::kU8,
        "tensor '{}' in {}: stored as {}, but it holds MXFP4 expert {} (the quantization_config of {}); "
        "valid: U8",
        name, ckpt.file_of(name), dtype_name(info.dtype),
        spec.storage == WeightSpec::Storage::kMxfp4Codes ? "codes" : "scales", cfg_source);
  }
  return info;
}

int64_t stored_parameters(const WeightSpec& spec) {
  switch (spec.storage) {
    case WeightSpec::Storage::kPlain:
      return shape_numel(spec.shape);
    case WeightSpec::Storage::kMxfp4Codes:
      return 2 * shape_numel(spec.shape);
    case WeightSpec::Storage::kMxfp4Scales:
      return 0;
  }
  return 0;
}

}  // namespace hlm
