// Parses a checkpoint's config.json into ModelConfig (docs/MODEL.md §2.4). Every field goes through a typed
// getter that resolves the transformers aliases and names the field, as the user spelled it, in any error;
// each model component's fields are read only when the layer schedule uses that component, so a config is
// never rejected for fields it does not need.
#include "config/model_config.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_parse.h"

namespace hlm {
namespace {

using json = nlohmann::json;

// transformers' KimiLinearConfig.attribute_map: {canonical name, alias accepted on input}.
constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
    {"num_expert_group", "n_group"},
    {"num_experts", "num_local_experts"},
    {"num_experts_per_token", "num_experts_per_tok"},
    {"num_shared_experts", "n_shared_experts"},
    {"moe_renormalize", "norm_topk_prob"},
    {"model_max_length", "max_position_embeddings"},
};

// A JSON value for messages: its type and a short rendering ("string \"2304\"").
std::string describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return fmt::format("{} {}", v.type_name(), text);
}

// A config value and the name it was found under, prefixed with its path ("text_config.num_experts").
struct Field {
  const json* value = nullptr;  // nullptr when absent or null: null means "not set" everywhere
  std::string name;
};

// One JSON object of the config (the top level, K3's text_config, or linear_attn_config).
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const std::string& source() const { return source_; }
  std::string path(std::string_view key) const { return prefix_ + std::string(key); }

  // The value of `key` or of its alias; both present with different values is an error, because either
  // choice would silently ignore what the other one says.
  Field get(std::string_view key) const {
    Field field = lookup(key);
    for (const auto& [canonical, alias] : kAliases) {
      if (canonical != key) continue;
      Field aliased = lookup(alias);
      if (aliased.value == nullptr) break;
      HLM_CHECK(field.value == nullptr || *field.value == *aliased.value,
                "{}: `{}` = {} and its alias `{}` = {} disagree; give one of them, or the same value in both",
                source_, field.name, field.value->dump(), aliased.name, aliased.value->dump());
      if (field.value == nullptr) field = aliased;
      break;
    }
    return field;
  }

  // How to name a missing field: the canonical name, plus the alias that would also have been accepted.
  std::string missing_name(std::string_view key) const {
    for (const auto& [canonical, alias] : kAliases) {
      if (canonical == key) return fmt::format("`{}` (or its alias `{}`)", path(key), path(alias));
    }
    return fmt::format("`{}`", path(key));
  }

 private:
  Field lookup(std::string_view key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return {nullptr, path(key)};
    return {&*it, path(key)};
  }

  const json& obj_;
  std::string source_;
  std::string prefix_;
};

int64_t as_int(const Fields& f, const json& v, const std::string& name) {
  HLM_CHECK(v.is_number_integer(), "{}: `{}` must be an integer, got {}", f.source(), name, describe(v));
  HLM_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()},
            "{}: `{}` = {} is too large", f.source(), name, v.dump());
  return v.get<int64_t>();
}

std::optional<int64_t> opt_int(const Fields& f, std::string_view key) {
  Field field = f.get(key);
  if (field.value == nullptr) return std::nullopt;
  return as_int(f, *field.value, field.name);
}

// `needed_for` says why a field is required, e.g. "for the MLA layers"; empty when always required.
[[noreturn]] void fail_missing(const Fields& f, std::string_view key, std::string_view needed_for) {
  HLM_FAIL("{}: {} is required{}{} and is missing (helixlm assumes no default)", f.source(),
           f.missing_name(key), needed_for.empty() ? "" : " ", needed_for);
}

int64_t req_int(const Fields& f, std::string_view key, std::string_view needed_for) {
  std::optional<int64_t> v = opt_int(f, key);
  if (!v) fail_missing(f, key, needed_for);
  return *v;
}

int64_t check_positive(const Fields& f, std::string_view key, int64_t v) {
  HLM_CHECK(v > 0, "{}: `{}` must be a positive integer, got {}", f.source(), f.get(key).name, v);
  return v;
}

int64_t req_positive(const Fields& f, std::string_view key, std::string_view needed_for) {
  return check_positive(f, key, req_int(f, key, needed_for));
}

std::optional<int64_t> opt_positive(const Fields& f, std::string_view key) {
  std::optional<int64_t> v = opt_int(f, key);
  if (v) check_positive(f, key, *v);
  return v;
}

// A size within `limit`, one of model_config.h's bounds; `name` is the field as the user spelled it.
int64_t check_at_most(const Fields& f, const std::string& name, int64_t v, int64_t limit) {
  HLM_CHECK(v <= limit, "{}: `{}` = {} exceeds {}, the most helixlm supports (far above any released model)",
            f.source(), name, v, limit);
  return v;
}

int64_t req_size(const Fields& f, std::string_view key, std::string_view needed_for, int64_t limit) {
  return check_at_most(f, f.get(key).name, req_positive(f, key, needed_for), limit);
}

std::optional<int64_t> opt_size(const Fields& f, std::string_view key, int64_t limit) {
  std::optional<int64_t> v = opt_positive(f, key);
  if (v) check_at_most(f, f.get(key).name, *v, limit);
  return v;
}

double req_positive_number(const Fields& f, std::string_view key, std::string_view needed_for) {
  Field field = f.get(key);
  if (field.value == nullptr) fail_missing(f, key, needed_for);
  HLM_CHECK(field.value->is_number(), "{}: `{}` must be a number, got {}", f.source(), field.name,
            describe(*field.value));
  double v = field.value->get<double>();
  HLM_CHECK(std::isfinite(v) && v > 0, "{}: `{}` must be a positive number, got {}", f.source(), field.name,
            field.value->dump());
  return v;
}

std::optional<bool> opt_bool(const Fields& f, std::string_view key) {
  Field field = f.get(key);
  if (field.value == nullptr) return std::nullopt;
  HLM_CHECK(field.value->is_boolean(), "{}: `{}` must be true or false, got {}", f.source(), field.name,
            describe(*field.value));
  return field.value->get<bool>();
}

std::optional<std::string> opt_string(const Fields& f, std::string_view key) {
  Field field = f.get(key);
  if (field.value == nullptr) return std::nullopt;
  HLM_CHECK(field.value->is_string(), "{}: `{}` must be a string, got {}", f.source(), field.name,
            describe(*field.value));
  return field.value->get<std::string>();
}

const json* opt_array(const Fields& f, std::string_view key) {
  Field field = f.get(key);
  HLM_CHECK(field.value == nullptr || field.value->is_array(), "{}: `{}` must be a list, got {}", f.source(),
            field.name, field.value ? describe(*field.value) : "");
  return field.value;
}

const json* opt_object(const Fields& f, std::string_view key) {
  Field field = f.get(key);
  HLM_CHECK(field.value == nullptr || field.value->is_object(), "{}: `{}` must be an object, got {}",
            f.source(), field.name, field.value ? describe(*field.value) : "");
  return field.value;
}

// "3, 7, 11" for messages, at most `limit` entries.
std::string index_list(const std::vector<int64_t>& v, size_t limit = 12) {
  std::vector<int64_t> head(v.begin(), v.begin() + static_cast<ptrdiff_t>(std::min(v.size(), limit)));
  return fmt::format("{}{}", fmt::join(head, ", "), v.size() > limit ? ", ..." : "");
}

// Reads a list of strings with one entry per layer, each one of `names` (mapped to `kinds`).
template <typename Kind>
std::vector<Kind> read_kind_list(const Fields& f, std::string_view key, const json& list, int64_t num_layers,
                                 const char* const (&names)[2], const Kind (&kinds)[2]) {
  HLM_CHECK(static_cast<int64_t>(list.size()) == num_layers,
            "{}: `{}` has {} entries but num_hidden_layers is {}; it needs one entry per layer", f.source(),
            f.path(key), list.size(), num_layers);
  std::vector<Kind> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& v = list[i];
    std::string name = fmt::format("{}[{}]", f.path(key), i);
    HLM_CHECK(v.is_string(), "{}: `{}` must be a string (\"{}\" or \"{}\"), got {}", f.source(), name,
              names[0], names[1], describe(v));
    const std::string s = v.get<std::string>();
    HLM_CHECK(s == names[0] || s == names[1], "{}: `{}` is \"{}\"; valid: \"{}\" or \"{}\"", f.source(), name,
              s, names[0], names[1]);
    out.push_back(s == names[0] ? kinds[0] : kinds[1]);
  }
  return out;
}

// Moonshot style: linear_attn_config.kda_layers / full_attn_layers, 1-BASED, every layer exactly once.
// Validated without allocating num_hidden_layers entries first, so an absurd layer count is an error, not
// an allocation failure.
std::vector<AttnKind> read_moonshot_attn(const Fields& lac, const json& kda, const json& full,
                                         int64_t num_layers) {
  std::map<int64_t, std::pair<AttnKind, std::string>> assigned;  // 1-based layer -> kind, list entry name
  auto add = [&](const json& list, std::string_view key, AttnKind kind) {
    for (size_t i = 0; i < list.size(); ++i) {
      std::string name = fmt::format("{}[{}]", lac.path(key), i);
      int64_t layer = as_int(lac, list[i], name);
      HLM_CHECK(layer >= 1 && layer <= num_layers,
                "{}: `{}` = {} is out of range; these lists are 1-based, valid: 1..{} (num_hidden_layers)",
                lac.source(), name, layer, num_layers);
      auto [it, inserted] = assigned.emplace(layer, std::pair{kind, name});
      HLM_CHECK(inserted,
                "{}: layer {} (1-based) is listed twice, in `{}` and `{}`; each layer must be in "
                "exactly one of kda_layers / full_attn_layers",
                lac.source(), layer, it->second.second, name);
    }
  };
  add(kda, "kda_layers", AttnKind::kKda);
  add(full, "full_attn_layers", AttnKind::kMla);
  if (static_cast<int64_t>(assigned.size()) != num_layers) {
    std::vector<int64_t> missing;  // the map holds < num_layers entries, so this loop ends quickly
    for (int64_t layer = 1; layer <= num_layers && missing.size() < 12; ++layer) {
      if (!assigned.contains(layer)) missing.push_back(layer);
    }
    HLM_FAIL("{}: layer(s) {} (1-based) are in neither `{}` nor `{}`; every layer 1..{} must be listed once",
             lac.source(), index_list(missing), lac.path("kda_layers"), lac.path("full_attn_layers"),
             num_layers);
  }
  std::vector<AttnKind> out;
  for (const auto& entry : assigned) out.push_back(entry.second.first);
  return out;
}

std::vector<AttnKind> read_attn_schedule(const Fields& f, const Fields* lac, int64_t num_layers) {
  std::optional<std::vector<AttnKind>> from_types;
  if (const json* types = opt_array(f, "layer_types")) {
    from_types = read_kind_list(f, "layer_types", *types, num_layers, {"linear_attention", "full_attention"},
                                {AttnKind::kKda, AttnKind::kMla});
  }
  std::optional<std::vector<AttnKind>> from_lists;
  const json* kda = lac ? opt_array(*lac, "kda_layers") : nullptr;
  const json* full = lac ? opt_array(*lac, "full_attn_layers") : nullptr;
  if (kda != nullptr || full != nullptr) {
    HLM_CHECK(kda != nullptr && full != nullptr,
              "{}: `{}` is given without `{}`; the 1-based lists only make a schedule together",
              lac->source(), lac->path(kda ? "kda_layers" : "full_attn_layers"),
              lac->path(kda ? "full_attn_layers" : "kda_layers"));
    from_lists = read_moonshot_attn(*lac, *kda, *full, num_layers);
  }
  HLM_CHECK(
      from_types || from_lists,
      "{}: no attention layer schedule: give `{}` (0-based, \"linear_attention\"/\"full_attention\" per "
      "layer) or `{}` and `{}` (1-based lists); helixlm never assumes a default pattern",
      f.source(), f.path("layer_types"), f.path("linear_attn_config.kda_layers"),
      f.path("linear_attn_config.full_attn_layers"));
  if (from_types && from_lists) {
    for (int64_t i = 0; i < num_layers; ++i) {
      AttnKind a = (*from_types)[i], b = (*from_lists)[i];
      HLM_CHECK(
          a == b,
          "{}: `{}` and `{}` disagree at layer {} (0-based; {} in the 1-based lists): {} says {}, {} says {}",
          f.source(), f.path("layer_types"), f.path("linear_attn_config"), i, i + 1, f.path("layer_types"),
          attn_kind_name(a), f.path("linear_attn_config"), attn_kind_name(b));
    }
  }
  return from_types ? *from_types : *from_lists;
}

// MoE iff num_experts > 0, i >= first_k_dense_replace and i % moe_layer_freq == 0 (Moonshot style).
std::vector<FfnKind> derive_ffn_schedule(int64_t num_layers, int64_t num_experts, int64_t first_dense,
                                         int64_t freq) {
  std::vector<FfnKind> out;
  for (int64_t i = 0; i < num_layers; ++i) {
    out.push_back(num_experts > 0 && i >= first_dense && i % freq == 0 ? FfnKind::kMoe : FfnKind::kDense);
  }
  return out;
}

std::vector<FfnKind> read_ffn_schedule(const Fields& f, int64_t num_layers) {
  std::optional<int64_t> num_experts = opt_int(f, "num_experts");
  HLM_CHECK(!num_experts || *num_experts >= 0, "{}: `{}` must be >= 0, got {}", f.source(),
            f.get("num_experts").name, *num_experts);
  std::optional<int64_t> first_dense = opt_int(f, "first_k_dense_replace");
  HLM_CHECK(!first_dense || *first_dense >= 0, "{}: `{}` must be >= 0, got {}", f.source(),
            f.path("first_k_dense_replace"), *first_dense);
  const int64_t freq = opt_positive(f, "moe_layer_freq").value_or(1);

  const json* types = opt_array(f, "mlp_layer_types");
  if (types == nullptr) {
    HLM_CHECK(first_dense.has_value(),
              "{}: no FFN schedule: give `{}` (\"dense\"/\"sparse\" per layer) or `{}` (with num_experts and "
              "moe_layer_freq); helixlm assumes no default because code bases disagree (0 vs 1)",
              f.source(), f.path("mlp_layer_types"), f.path("first_k_dense_replace"));
    return derive_ffn_schedule(num_layers, num_experts.value_or(0), *first_dense, freq);
  }
  std::vector<FfnKind> ffn = read_kind_list(f, "mlp_layer_types", *types, num_layers, {"dense", "sparse"},
                                            {FfnKind::kDense, FfnKind::kMoe});
  // Without num_experts there is nothing to compare; read_moe then reports it missing if a layer is sparse.
  if (first_dense && num_experts) {
    std::vector<FfnKind> derived = derive_ffn_schedule(num_layers, *num_experts, *first_dense, freq);
    for (int64_t i = 0; i < num_layers; ++i) {
      HLM_CHECK(
          ffn[i] == derived[i],
          "{}: `{}` and first_k_dense_replace = {} / moe_layer_freq = {} / num_experts = {} disagree at "
          "layer {} (0-based): the list says {}, the counters say {}",
          f.source(), f.path("mlp_layer_types"), *first_dense, freq, *num_experts, i, ffn_kind_name(ffn[i]),
          ffn_kind_name(derived[i]));
    }
  }
  return ffn;
}

// A KDA dimension given nested (linear_attn_config.<nested>) and/or flat (<flat>); both must agree.
// 0 stands for "absent": a present value is positive.
int64_t read_kda_dim(const Fields& f, const Fields* lac, std::string_view nested, std::string_view flat,
                     int64_t limit) {
  const int64_t a = lac ? opt_positive(*lac, nested).value_or(0) : 0;
  const int64_t b = opt_positive(f, flat).value_or(0);
  const std::string nested_name = f.path(fmt::format("linear_attn_config.{}", nested));
  HLM_CHECK(a > 0 || b > 0, "{}: `{}` (or `{}`) is required for the KDA layers and is missing", f.source(),
            nested_name, f.path(flat));
  HLM_CHECK(a == 0 || b == 0 || a == b,
            "{}: `{}` = {} and `{}` = {} disagree; give one, or the same value in both", f.source(),
            nested_name, a, f.path(flat), b);
  return a > 0 ? check_at_most(f, nested_name, a, limit) : check_at_most(f, f.get(flat).name, b, limit);
}

void read_kda(const Fields& f, const Fields* lac, ModelConfig& cfg) {
  cfg.kda_heads = read_kda_dim(f, lac, "num_heads", "linear_num_heads", kMaxHeads);
  cfg.kda_head_dim = read_kda_dim(f, lac, "head_dim", "linear_head_dim", kMaxHeadDim);
  cfg.kda_conv_kernel =
      read_kda_dim(f, lac, "short_conv_kernel_size", "linear_conv_kernel_dim", kMaxConvKernel);
}

void read_mla(const Fields& f, ModelConfig& cfg) {
  constexpr std::string_view why = "for the MLA layers";
  cfg.mla_heads = req_size(f, "num_attention_heads", why, kMaxHeads);
  cfg.q_lora_rank = opt_size(f, "q_lora_rank", kMaxHiddenSize).value_or(0);  // null or absent: plain q_proj
  cfg.kv_lora_rank = req_size(f, "kv_lora_rank", why, kMaxHiddenSize);
  cfg.qk_nope_head_dim = req_size(f, "qk_nope_head_dim", why, kMaxHeadDim);
  cfg.qk_rope_head_dim = req_size(f, "qk_rope_head_dim", why, kMaxHeadDim);
  cfg.v_head_dim = req_size(f, "v_head_dim", why, kMaxHeadDim);
  // MLA shares one latent among all heads; a separate KV head count would describe another architecture.
  std::optional<int64_t> kv_heads = opt_int(f, "num_key_value_heads");
  HLM_CHECK(
      !kv_heads || *kv_heads == cfg.mla_heads,
      "{}: `{}` = {} differs from num_attention_heads = {}; MLA needs them equal (or num_key_value_heads "
      "absent)",
      f.source(), f.path("num_key_value_heads"), *kv_heads, cfg.mla_heads);
}

void read_moe(const Fields& f, ModelConfig& cfg) {
  constexpr std::string_view why = "for the MoE layers";
  cfg.num_experts = req_size(f, "num_experts", why, kMaxExperts);
  const std::string experts_name = f.get("num_experts").name;
  HLM_CHECK(cfg.num_experts * cfg.num_moe_layers() <= kMaxRoutedExperts,
            "{}: `{}` = {} routed experts in each of {} MoE layers make {}, more than the {} helixlm "
            "supports in one model (far above any released model); valid: num_experts <= {} with this "
            "schedule",
            f.source(), experts_name, cfg.num_experts, cfg.num_moe_layers(),
            cfg.num_experts * cfg.num_moe_layers(), kMaxRoutedExperts,
            kMaxRoutedExperts / cfg.num_moe_layers());
  cfg.experts_per_token = req_positive(f, "num_experts_per_token", why);
  cfg.moe_intermediate_size = req_size(f, "moe_intermediate_size", why, kMaxMoeIntermediateSize);
  cfg.num_shared_experts = req_int(f, "num_shared_experts", why);
  HLM_CHECK(cfg.num_shared_experts >= 0, "{}: `{}` must be >= 0, got {}", f.source(),
            f.get("num_shared_experts").name, cfg.num_shared_experts);
  check_at_most(f, f.get("num_shared_experts").name, cfg.num_shared_experts, kMaxSharedExperts);
  cfg.routed_scaling_factor = req_positive_number(f, "routed_scaling_factor", why);
  cfg.moe_renormalize = opt_bool(f, "moe_renormalize").value_or(true);
  cfg.num_expert_group = opt_positive(f, "num_expert_group").value_or(1);
  cfg.topk_group = opt_positive(f, "topk_group").value_or(1);

  const std::string groups_name = f.get("num_expert_group").name;
  if (cfg.num_expert_group > 1) {
    HLM_CHECK(opt_bool(f, "use_grouped_topk").value_or(true),
              "{}: `{}` is false but {} = {}; helixlm always routes with grouped top-k (valid: "
              "use_grouped_topk true, or num_expert_group 1)",
              f.source(), f.path("use_grouped_topk"), groups_name, cfg.num_expert_group);
    HLM_CHECK(cfg.num_experts % cfg.num_expert_group == 0,
              "{}: `{}` = {} does not divide num_experts = {}; expert groups must be equal in size",
              f.source(), groups_name, cfg.num_expert_group, cfg.num_experts);
    HLM_CHECK(
        cfg.num_experts / cfg.num_expert_group >= 2,
        "{}: `{}` = {} leaves {} expert(s) per group; grouped top-k scores a group by its top 2 experts, "
        "so each group needs at least 2 (valid: num_expert_group <= {})",
        f.source(), groups_name, cfg.num_expert_group, cfg.num_experts / cfg.num_expert_group,
        cfg.num_experts / 2);
  }
  HLM_CHECK(cfg.topk_group <= cfg.num_expert_group, "{}: `{}` = {} exceeds {} = {}; valid: 1..{}", f.source(),
            f.path("topk_group"), cfg.topk_group, groups_name, cfg.num_expert_group, cfg.num_expert_group);
  const std::string k_name = f.get("num_experts_per_token").name;
  HLM_CHECK(cfg.experts_per_token <= cfg.num_experts, "{}: `{}` = {} exceeds num_experts = {}; valid: 1..{}",
            f.source(), k_name, cfg.experts_per_token, cfg.num_experts, cfg.num_experts);
  const int64_t reachable = cfg.topk_group * (cfg.num_experts / cfg.num_expert_group);
  HLM_CHECK(cfg.experts_per_token <= reachable,
            "{}: `{}` = {} exceeds the {} experts reachable in topk_group = {} group(s) of {}; valid: <= {}",
            f.source(), k_name, cfg.experts_per_token, reachable, cfg.topk_group,
            cfg.num_experts / cfg.num_expert_group, reachable);
}

void read_dense(const Fields& f, ModelConfig& cfg) {
  // Newer transformers size the dense MLP by `dense_ffn_hidden`, falling back to intermediate_size.
  if (std::optional<int64_t> hidden = opt_size(f, "dense_ffn_hidden", kMaxIntermediateSize)) {
    cfg.intermediate_size = *hidden;
  } else {
    cfg.intermediate_size =
        req_size(f, "intermediate_size", "for the dense FFN layers", kMaxIntermediateSize);
  }
}

// Settings the config can express but no released Kimi Linear model uses; helixlm does not implement them.
void reject_unsupported(const Fields& f, const Fields* lac, bool is_k3) {
  if (std::optional<std::string> act = opt_string(f, "moe_router_activation_func")) {
    HLM_CHECK(*act == "sigmoid", "{}: `{}` is \"{}\"; helixlm implements only \"sigmoid\" routing",
              f.source(), f.path("moe_router_activation_func"), *act);
  }
  HLM_CHECK(opt_bool(f, "mla_use_nope").value_or(true),
            "{}: `{}` is false; helixlm implements only NoPE MLA (no rotary), valid: true or absent",
            f.source(), f.path("mla_use_nope"));
  HLM_CHECK(!opt_bool(f, "tie_word_embeddings").value_or(false),
            "{}: `{}` is true; helixlm needs a separate lm_head (valid: false or absent)", f.source(),
            f.path("tie_word_embeddings"));
  HLM_CHECK(!opt_bool(f, "attention_bias").value_or(false),
            "{}: `{}` is true; Kimi Linear attention has no biases (valid: false or absent)", f.source(),
            f.path("attention_bias"));
  // A K3 text_config legitimately carries quantization and the K3 features; K3 support interprets them.
  if (is_k3) return;
  HLM_CHECK(opt_object(f, "quantization_config") == nullptr,
            "{}: `{}` is set; helixlm loads kimi_linear checkpoints only unquantized (bf16/fp32)", f.source(),
            f.path("quantization_config"));
  // K3 features appearing in a kimi_linear config would change the math silently if ignored.
  const bool k3_features[] = {
      opt_bool(f, "mla_use_output_gate").value_or(false),
      opt_int(f, "attn_res_block_size").value_or(0) != 0,
      opt_int(f, "routed_expert_hidden_size").has_value(),
      lac != nullptr && opt_bool(*lac, "use_full_rank_gate").value_or(false),
      lac != nullptr && lac->get("gate_lower_bound").value != nullptr,
  };
  const char* const k3_names[] = {"mla_use_output_gate", "attn_res_block_size", "routed_expert_hidden_size",
                                  "linear_attn_config.use_full_rank_gate",
                                  "linear_attn_config.gate_lower_bound"};
  for (size_t i = 0; i < std::size(k3_features); ++i) {
    HLM_CHECK(
        !k3_features[i],
        "{}: `{}` is a Kimi K3 feature, not supported on model_type \"kimi_linear\" (K3 models are read "
        "from a \"kimi_k3\" config's text_config)",
        f.source(), k3_names[i]);
  }
}

Activation read_activation(const Fields& f, bool is_k3) {
  const std::string act = opt_string(f, "hidden_act").value_or("silu");
  if (act == "silu") return Activation::kSilu;
  HLM_CHECK(is_k3 && act == "situ", "{}: `{}` is \"{}\"; valid: \"silu\"{}", f.source(), f.path("hidden_act"),
            act, is_k3 ? " or \"situ\"" : "");
  return Activation::kSitu;
}

double opt_number(const Fields& f, std::string_view key, double fallback) {
  Field field = f.get(key);
  if (field.value == nullptr) return fallback;
  HLM_CHECK(field.value->is_number() && std::isfinite(field.value->get<double>()),
            "{}: `{}` must be a finite number, got {}", f.source(), field.name, describe(*field.value));
  return field.value->get<double>();
}

// compressed-tensors MXFP4 (group 32) is the one quantization K3 ships, for its routed experts only.
bool read_k3_quantization(const Fields& f) {
  const json* q = opt_object(f, "quantization_config");
  if (q == nullptr) return false;
  const Fields qf(*q, f.source(), f.path("quantization_config."));
  const std::string method = opt_string(qf, "quant_method").value_or("");
  HLM_CHECK(method == "compressed-tensors", "{}: `{}` is \"{}\"; valid: \"compressed-tensors\"", f.source(),
            qf.path("quant_method"), method);
  std::vector<std::string> formats;
  if (std::optional<std::string> top = opt_string(qf, "format")) formats.push_back(*top);
  if (const json* groups = opt_object(qf, "config_groups")) {
    for (const auto& [name, group] : groups->items()) {
      const Fields gf(group, f.source(), qf.path("config_groups." + name + "."));
      if (std::optional<std::string> fmt_name = opt_string(gf, "format")) formats.push_back(*fmt_name);
      if (const json* w = opt_object(gf, "weights")) {
        const Fields wf(*w, f.source(), gf.path("weights."));
        const int64_t group_size = opt_int(wf, "group_size").value_or(32);
        HLM_CHECK(group_size == 32, "{}: `{}` is {}; MXFP4 groups are 32 columns", f.source(),
                  wf.path("group_size"), group_size);
      }
    }
  }
  HLM_CHECK(!formats.empty(), "{}: `{}` names no format; valid: \"mxfp4-pack-quantized\"", f.source(),
            qf.path("format"));
  for (const std::string& fmt_name : formats) {
    HLM_CHECK(
        fmt_name == "mxfp4-pack-quantized",
        "{}: quantization format \"{}\" is not supported; valid: \"mxfp4-pack-quantized\" (routed experts)",
        f.source(), fmt_name);
  }
  return true;
}

void read_k3(const Fields& f, const Fields* lac, ModelConfig& cfg) {
  if (lac != nullptr) {
    cfg.kda_gate_lower_bound = opt_number(*lac, "gate_lower_bound", 0.0);
    HLM_CHECK(cfg.kda_gate_lower_bound <= 0,
              "{}: `{}` must be negative (a lower bound on the log decay), got {}", f.source(),
              lac->path("gate_lower_bound"), cfg.kda_gate_lower_bound);
    cfg.kda_full_rank_gate = opt_bool(*lac, "use_full_rank_gate").value_or(false);
  }
  cfg.mla_output_gate = opt_bool(f, "mla_use_output_gate").value_or(false);
  cfg.attn_res_block_size = opt_positive(f, "attn_res_block_size").value_or(0);
  if (cfg.hidden_act == Activation::kSitu) {
    cfg.situ_beta = req_positive_number(f, "activation_situ_beta", "for hidden_act \"situ\"");
    cfg.situ_linear_beta = req_positive_number(f, "activation_situ_linear_beta", "for hidden_act \"situ\"");
  }
  if (cfg.num_moe_layers() > 0) {
    cfg.moe_latent_size = opt_size(f, "routed_expert_hidden_size", kMaxHiddenSize).value_or(0);
    cfg.moe_latent_norm = cfg.moe_latent_size > 0 && opt_bool(f, "latent_moe_use_norm").value_or(false);
    cfg.mxfp4_experts = read_k3_quantization(f);
    if (cfg.mxfp4_experts) {
      const int64_t in_gate = cfg.moe_latent_size > 0 ? cfg.moe_latent_size : cfg.hidden_size;
      HLM_CHECK(in_gate % 32 == 0 && cfg.moe_intermediate_size % 32 == 0,
                "{}: MXFP4 experts need input widths divisible by 32 (routed expert input {}, "
                "moe_intermediate_size {})",
                f.source(), in_gate, cfg.moe_intermediate_size);
    }
  }
}

int64_t token_id(const Fields& f, const json& v, const std::string& name) {
  int64_t id = as_int(f, v, name);
  HLM_CHECK(id >= 0, "{}: `{}` must be a token id >= 0, got {}", f.source(), name, id);
  return id;
}

void read_token_ids(const Fields& f, ModelConfig& cfg) {
  Field bos = f.get("bos_token_id");
  if (bos.value) cfg.bos_token_id = token_id(f, *bos.value, bos.name);
  Field eos = f.get("eos_token_id");
  if (eos.value && eos.value->is_array()) {
    for (size_t i = 0; i < eos.value->size(); ++i) {
      cfg.eos_token_ids.push_back(token_id(f, (*eos.value)[i], fmt::format("{}[{}]", eos.name, i)));
    }
  } else if (eos.value) {
    HLM_CHECK(eos.value->is_number_integer(), "{}: `{}` must be an integer or a list of integers, got {}",
              f.source(), eos.name, describe(*eos.value));
    cfg.eos_token_ids.push_back(token_id(f, *eos.value, eos.name));
  }
  cfg.max_position_embeddings = opt_positive(f, "model_max_length").value_or(0);
  // An id the lm_head cannot produce would never stop generation (eos) or index past the embedding (bos).
  HLM_CHECK(cfg.bos_token_id < cfg.vocab_size, "{}: `{}` = {} is outside the vocabulary [0, {})", f.source(),
            bos.name, cfg.bos_token_id, cfg.vocab_size);
  for (size_t i = 0; i < cfg.eos_token_ids.size(); ++i) {
    HLM_CHECK(cfg.eos_token_ids[i] < cfg.vocab_size, "{}: `{}` = {} is outside the vocabulary [0, {})",
              f.source(), eos.value->is_array() ? fmt::format("{}[{}]", eos.name, i) : eos.name,
              cfg.eos_token_ids[i], cfg.vocab_size);
  }
}

}  // namespace

int ModelConfig::num_kda_layers() const {
  return static_cast<int>(std::count(attn.begin(), attn.end(), AttnKind::kKda));
}

int ModelConfig::num_mla_layers() const {
  return static_cast<int>(std::count(attn.begin(), attn.end(), AttnKind::kMla));
}

int ModelConfig::num_moe_layers() const {
  return static_cast<int>(std::count(ffn.begin(), ffn.end(), FfnKind::kMoe));
}

const char* attn_kind_name(AttnKind k) { return k == AttnKind::kKda ? "KDA" : "MLA"; }

const char* ffn_kind_name(FfnKind k) { return k == FfnKind::kDense ? "dense" : "MoE"; }

ModelConfig parse_model_config(const json& doc, const std::string& source) {
  ModelConfig cfg;
  cfg.source = source;
  HLM_CHECK(doc.is_object(), "{}: a config must be a JSON object, got {}", source, describe(doc));
  const Fields top(doc, cfg.source, "");
  std::optional<std::string> model_type = opt_string(top, "model_type");
  HLM_CHECK(model_type == "kimi_linear" || model_type == "kimi_k3",
            "{}: `model_type` is {}; valid: \"kimi_linear\" or \"kimi_k3\"", source,
            model_type ? fmt::format("\"{}\"", *model_type) : "missing");
  cfg.model_type = *model_type;
  const bool is_k3 = cfg.model_type == "kimi_k3";

  // K3 wraps the text model (itself a kimi_linear config) in text_config, and its checkpoint keys in
  // "language_model.".
  const json* text = &doc;
  if (is_k3) {
    text = opt_object(top, "text_config");
    HLM_CHECK(text != nullptr, "{}: `text_config` is required for model_type \"kimi_k3\" and is missing",
              source);
    cfg.tensor_prefix = "language_model.";
  }
  const Fields f(*text, cfg.source, is_k3 ? "text_config." : "");
  const json* lac_obj = opt_object(f, "linear_attn_config");
  std::optional<Fields> lac;
  if (lac_obj) lac.emplace(*lac_obj, cfg.source, f.path("linear_attn_config."));

  // Bounded before anything is sized from them: the layer lists are read one entry per layer.
  cfg.vocab_size = req_size(f, "vocab_size", "", kMaxVocabSize);
  cfg.hidden_size = req_size(f, "hidden_size", "", kMaxHiddenSize);
  cfg.num_layers = req_size(f, "num_hidden_layers", "", kMaxLayers);
  cfg.rms_norm_eps =
      req_positive_number(f, "rms_norm_eps", "(defaults differ: 1e-6 Moonshot, 1e-5 transformers)");
  cfg.hidden_act = read_activation(f, is_k3);
  reject_unsupported(f, lac ? &*lac : nullptr, is_k3);

  cfg.attn = read_attn_schedule(f, lac ? &*lac : nullptr, cfg.num_layers);
  cfg.ffn = read_ffn_schedule(f, cfg.num_layers);
  if (cfg.num_kda_layers() > 0) read_kda(f, lac ? &*lac : nullptr, cfg);
  if (cfg.num_mla_layers() > 0) read_mla(f, cfg);
  if (cfg.num_moe_layers() > 0) read_moe(f, cfg);
  if (cfg.num_moe_layers() < cfg.num_layers) read_dense(f, cfg);
  if (is_k3) {
    read_k3(f, lac ? &*lac : nullptr, cfg);
    if (opt_object(top, "vision_config") != nullptr) {
      spdlog::info("{}: serving the text model only; the vision tower is not loaded", source);
    }
  }
  read_token_ids(f, cfg);
  return cfg;
}

ModelConfig load_model_config(const std::string& path) {
  std::error_code ec;
  HLM_CHECK(std::filesystem::exists(path, ec), "{}: model config not found (no such file)", path);
  HLM_CHECK(!std::filesystem::is_directory(path, ec), "{}: is a directory; expected the config.json file",
            path);
  std::ifstream in(path, std::ios::binary);
  HLM_CHECK(in.is_open(), "{}: cannot open the model config for reading", path);
  std::ostringstream text;
  text << in.rdbuf();
  const json doc = parse_json(text.str(), path);
  return parse_model_config(doc, path);
}

}  // namespace hlm
