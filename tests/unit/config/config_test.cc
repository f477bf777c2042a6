// Tests that load_model_config / parse_model_config read every supported config style into the same
// ModelConfig: the published Kimi-Linear-48B-A3B config in Moonshot, transformers and mixed form, aliases,
// token ids, Kimi K3's nested text_config, file errors, and the generated tiny fixtures.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "config/model_config.h"
#include "kimi_configs.h"

namespace hlm {
namespace {

using nlohmann::json;

constexpr char kSource[] = "test/config.json";

ModelConfig parse(const json& doc) { return parse_model_config(doc, kSource); }

// The message of the hlm::Error that parsing `doc` raises, or "" when it parses.
std::string parse_error(const json& doc) {
  try {
    parse(doc);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string load_error(const std::string& path) {
  try {
    load_model_config(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<int> layers_of(const std::vector<AttnKind>& kinds, AttnKind k) {
  std::vector<int> out;
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] == k) out.push_back(static_cast<int>(i));
  }
  return out;
}

// Everything the model math reads; `source` is allowed to differ.
void expect_same_model(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.tensor_prefix, b.tensor_prefix);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.attn, b.attn);
  EXPECT_EQ(a.ffn, b.ffn);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.kda_heads, b.kda_heads);
  EXPECT_EQ(a.kda_head_dim, b.kda_head_dim);
  EXPECT_EQ(a.kda_conv_kernel, b.kda_conv_kernel);
  EXPECT_EQ(a.mla_heads, b.mla_heads);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.experts_per_token, b.experts_per_token);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.num_shared_experts, b.num_shared_experts);
  EXPECT_EQ(a.num_expert_group, b.num_expert_group);
  EXPECT_EQ(a.topk_group, b.topk_group);
  EXPECT_EQ(a.moe_renormalize, b.moe_renormalize);
  EXPECT_EQ(a.routed_scaling_factor, b.routed_scaling_factor);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
}

TEST(ModelConfig, MoonshotKimiLinear48B) {
  ModelConfig cfg = parse(test::moonshot_48b());
  EXPECT_EQ(cfg.source, kSource);
  EXPECT_EQ(cfg.model_type, "kimi_linear");
  EXPECT_EQ(cfg.tensor_prefix, "");
  EXPECT_EQ(cfg.vocab_size, 163840);
  EXPECT_EQ(cfg.hidden_size, 2304);
  EXPECT_EQ(cfg.num_layers, 27);
  EXPECT_DOUBLE_EQ(cfg.rms_norm_eps, 1e-5);
  EXPECT_EQ(cfg.hidden_act, Activation::kSilu);

  ASSERT_EQ(cfg.attn.size(), 27u);
  EXPECT_EQ(layers_of(cfg.attn, AttnKind::kMla), (std::vector<int>{3, 7, 11, 15, 19, 23, 26}));
  EXPECT_EQ(cfg.num_kda_layers(), 20);
  EXPECT_EQ(cfg.num_mla_layers(), 7);
  ASSERT_EQ(cfg.ffn.size(), 27u);
  EXPECT_EQ(cfg.ffn[0], FfnKind::kDense);
  for (int i = 1; i < 27; ++i) EXPECT_EQ(cfg.ffn[i], FfnKind::kMoe) << "layer " << i;
  EXPECT_EQ(cfg.num_moe_layers(), 26);

  EXPECT_EQ(cfg.kda_heads, 32);
  EXPECT_EQ(cfg.kda_head_dim, 128);  // linear_attn_config.head_dim, not the top-level head_dim 72
  EXPECT_EQ(cfg.kda_conv_kernel, 4);
  EXPECT_EQ(cfg.kda_dim(), 4096);

  EXPECT_EQ(cfg.mla_heads, 32);
  EXPECT_EQ(cfg.q_lora_rank, 0);
  EXPECT_EQ(cfg.kv_lora_rank, 512);
  EXPECT_EQ(cfg.qk_nope_head_dim, 128);
  EXPECT_EQ(cfg.qk_rope_head_dim, 64);
  EXPECT_EQ(cfg.v_head_dim, 128);
  EXPECT_EQ(cfg.qk_head_dim(), 192);
  EXPECT_EQ(cfg.mla_cache_dim(), 576);

  EXPECT_EQ(cfg.intermediate_size, 9216);
  EXPECT_EQ(cfg.num_experts, 256);
  EXPECT_EQ(cfg.experts_per_token, 8);
  EXPECT_EQ(cfg.moe_intermediate_size, 1024);
  EXPECT_EQ(cfg.num_shared_experts, 1);
  EXPECT_EQ(cfg.shared_intermediate_size(), 1024);
  EXPECT_EQ(cfg.num_expert_group, 1);
  EXPECT_EQ(cfg.topk_group, 1);
  EXPECT_TRUE(cfg.moe_renormalize);
  EXPECT_DOUBLE_EQ(cfg.routed_scaling_factor, 2.446);

  EXPECT_EQ(cfg.bos_token_id, 163584);
  EXPECT_EQ(cfg.eos_token_ids, (std::vector<int64_t>{163586}));
  EXPECT_EQ(cfg.max_position_embeddings, 1048576);
}

TEST(ModelConfig, TransformersStyleMatchesMoonshot) {
  expect_same_model(parse(test::transformers_48b()), parse(test::moonshot_48b()));
}

// What transformers writes when it re-saves the Hub config: both styles at once, agreeing.
TEST(ModelConfig, MixedStylesAgreeing) {
  json doc = test::moonshot_48b();
  json tf = test::transformers_48b();
  for (const char* key : {"layer_types", "mlp_layer_types", "linear_num_heads", "linear_head_dim",
                          "linear_conv_kernel_dim", "qk_head_dim", "pretraining_tp", "attention_bias"}) {
    doc[key] = tf[key];
  }
  expect_same_model(parse(doc), parse(test::moonshot_48b()));
}

TEST(ModelConfig, MixedStylesDisagreeingAttention) {
  json doc = test::moonshot_48b();
  doc["layer_types"] = test::transformers_48b()["layer_types"];
  doc["layer_types"][4] = "full_attention";  // the 1-based lists say layer 5 is KDA
  std::string msg = parse_error(doc);
  EXPECT_NE(msg.find(kSource), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer_types"), std::string::npos) << msg;
  EXPECT_NE(msg.find("linear_attn_config"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer 4 (0-based; 5 in the 1-based lists)"), std::string::npos) << msg;
}

TEST(ModelConfig, MixedStylesDisagreeingFfn) {
  json doc = test::moonshot_48b();
  doc["mlp_layer_types"] = test::transformers_48b()["mlp_layer_types"];
  doc["first_k_dense_replace"] = 2;
  std::string msg = parse_error(doc);
  EXPECT_NE(msg.find("mlp_layer_types"), std::string::npos) << msg;
  EXPECT_NE(msg.find("first_k_dense_replace"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer 1"), std::string::npos) << msg;
}

// transformers ignores moe_layer_freq; a config whose explicit list ignores it too must not pass silently.
TEST(ModelConfig, MixedStylesDisagreeingMoeLayerFreq) {
  json doc = test::transformers_48b();
  doc["first_k_dense_replace"] = 1;
  doc["moe_layer_freq"] = 2;
  EXPECT_NE(parse_error(doc).find("moe_layer_freq"), std::string::npos);
}

TEST(ModelConfig, KdaDimsNestedAndFlatDisagreeing) {
  json doc = test::moonshot_48b();
  doc["linear_num_heads"] = 16;
  std::string msg = parse_error(doc);
  EXPECT_NE(msg.find("linear_attn_config.num_heads"), std::string::npos) << msg;
  EXPECT_NE(msg.find("linear_num_heads"), std::string::npos) << msg;
}

TEST(ModelConfig, TransformersAliases) {
  json doc = test::transformers_48b();
  const std::pair<const char*, const char*> renames[] = {
      {"num_expert_group", "n_group"},
      {"num_experts", "num_local_experts"},
      {"num_experts_per_token", "num_experts_per_tok"},
      {"num_shared_experts", "n_shared_experts"},
      {"moe_renormalize", "norm_topk_prob"},
      {"model_max_length", "max_position_embeddings"},
  };
  for (const auto& [canonical, alias] : renames) {
    doc[alias] = doc[canonical];
    doc.erase(canonical);
  }
  expect_same_model(parse(doc), parse(test::transformers_48b()));
}

TEST(ModelConfig, AliasAndCanonicalEqualIsAccepted) {
  json doc = test::moonshot_48b();
  doc["num_local_experts"] = 256;
  doc["max_position_embeddings"] = 1048576;
  EXPECT_EQ(parse(doc).num_experts, 256);
}

TEST(ModelConfig, AliasAndCanonicalDisagreeing) {
  json doc = test::moonshot_48b();
  doc["num_local_experts"] = 128;
  std::string msg = parse_error(doc);
  EXPECT_NE(msg.find("`num_experts` = 256"), std::string::npos) << msg;
  EXPECT_NE(msg.find("`num_local_experts` = 128"), std::string::npos) << msg;
}

TEST(ModelConfig, EosList) {
  json doc = test::moonshot_48b();
  doc["eos_token_id"] = {163586, 163585};
  EXPECT_EQ(parse(doc).eos_token_ids, (std::vector<int64_t>{163586, 163585}));
}

TEST(ModelConfig, AbsentOptionalFields) {
  json doc = test::moonshot_48b();
  for (const char* key : {"bos_token_id", "eos_token_id", "model_max_length", "num_expert_group",
                          "topk_group", "moe_renormalize", "moe_layer_freq", "hidden_act", "q_lora_rank"}) {
    doc.erase(key);
  }
  doc["pad_token_id"] = nullptr;
  ModelConfig cfg = parse(doc);
  EXPECT_EQ(cfg.bos_token_id, -1);
  EXPECT_TRUE(cfg.eos_token_ids.empty());
  EXPECT_EQ(cfg.max_position_embeddings, 0);
  EXPECT_EQ(cfg.num_expert_group, 1);
  EXPECT_EQ(cfg.topk_group, 1);
  EXPECT_TRUE(cfg.moe_renormalize);
  EXPECT_EQ(cfg.q_lora_rank, 0);
  EXPECT_EQ(cfg.hidden_act, Activation::kSilu);
  EXPECT_EQ(cfg.num_moe_layers(), 26);
}

TEST(ModelConfig, QLoraRank) {
  json doc = test::moonshot_48b();
  doc["q_lora_rank"] = 1536;
  EXPECT_EQ(parse(doc).q_lora_rank, 1536);
}

TEST(ModelConfig, MoeLayerFreq) {
  json doc = test::moonshot_48b();
  doc["moe_layer_freq"] = 2;
  ModelConfig cfg = parse(doc);
  for (int i = 0; i < 27; ++i) {
    EXPECT_EQ(cfg.ffn[i], i >= 1 && i % 2 == 0 ? FfnKind::kMoe : FfnKind::kDense) << "layer " << i;
  }
}

// Without experts every layer is dense, and the MoE fields are not needed.
TEST(ModelConfig, DenseOnlyNeedsNoMoeFields) {
  json doc = test::moonshot_48b();
  for (const char* key :
       {"num_experts_per_token", "moe_intermediate_size", "num_shared_experts", "routed_scaling_factor"}) {
    doc.erase(key);
  }
  doc["num_experts"] = 0;
  ModelConfig cfg = parse(doc);
  EXPECT_EQ(cfg.num_moe_layers(), 0);
  EXPECT_EQ(cfg.num_experts, 0);
  EXPECT_EQ(cfg.intermediate_size, 9216);
}

// With every FFN MoE, intermediate_size is not needed; with every layer MLA, the KDA dims are not.
TEST(ModelConfig, FieldsOfUnusedComponentsAreNotRequired) {
  json doc = test::transformers_48b();
  doc["first_k_dense_replace"] = 0;
  doc["mlp_layer_types"] = json::array();
  doc["layer_types"] = json::array();
  for (int i = 0; i < 27; ++i) {
    doc["mlp_layer_types"].push_back("sparse");
    doc["layer_types"].push_back("full_attention");
  }
  for (const char* key :
       {"intermediate_size", "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim"}) {
    doc.erase(key);
  }
  ModelConfig cfg = parse(doc);
  EXPECT_EQ(cfg.num_moe_layers(), 27);
  EXPECT_EQ(cfg.num_mla_layers(), 27);
  EXPECT_EQ(cfg.intermediate_size, 0);
  EXPECT_EQ(cfg.kda_heads, 0);
}

// The tiny-fixture recipe of docs/MODEL.md §10: 8 experts in 2 groups, top-2 from 1 group.
TEST(ModelConfig, GroupedTopk) {
  json doc = test::moonshot_48b();
  doc["num_experts"] = 8;
  doc["num_experts_per_token"] = 2;
  doc["num_expert_group"] = 2;
  doc["topk_group"] = 1;
  ModelConfig cfg = parse(doc);
  EXPECT_EQ(cfg.num_expert_group, 2);
  EXPECT_EQ(cfg.topk_group, 1);
}

// Newer transformers size the dense MLP by dense_ffn_hidden, falling back to intermediate_size.
TEST(ModelConfig, DenseFfnHidden) {
  json doc = test::moonshot_48b();
  doc["dense_ffn_hidden"] = 4096;
  EXPECT_EQ(parse(doc).intermediate_size, 4096);
  doc.erase("intermediate_size");
  EXPECT_EQ(parse(doc).intermediate_size, 4096);
}

json k3_wrapper(json text) {
  json doc;
  doc["model_type"] = "kimi_k3";
  doc["architectures"] = {"KimiK3ForConditionalGeneration"};
  doc["media_placeholder_token_id"] = 163605;
  doc["vision_config"] = json::object();
  doc["text_config"] = std::move(text);
  return doc;
}

TEST(ModelConfig, KimiK3ReadsTextConfig) {
  json text = test::moonshot_48b();
  text["hidden_act"] = "situ";
  text["activation_situ_beta"] = 4.0;
  text["activation_situ_linear_beta"] = 25.0;
  text["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"}};
  text["mla_use_output_gate"] = true;
  text["attn_res_block_size"] = 12;
  ModelConfig cfg = parse(k3_wrapper(text));
  EXPECT_EQ(cfg.model_type, "kimi_k3");
  EXPECT_EQ(cfg.tensor_prefix, "language_model.");
  EXPECT_EQ(cfg.hidden_act, Activation::kSitu);
  EXPECT_EQ(layers_of(cfg.attn, AttnKind::kMla), (std::vector<int>{3, 7, 11, 15, 19, 23, 26}));
  EXPECT_EQ(cfg.kda_heads, 32);
  EXPECT_TRUE(cfg.mla_output_gate);
  EXPECT_EQ(cfg.attn_res_block_size, 12);
  EXPECT_TRUE(cfg.mxfp4_experts);
}

TEST(ModelConfig, PublishedKimiK3Config) {
  const ModelConfig cfg = load_model_config(std::string(HLM_FIXTURES_DIR) + "/configs/kimi-k3.json");
  EXPECT_EQ(cfg.num_layers, 93);
  EXPECT_EQ(cfg.num_kda_layers(), 69);
  EXPECT_EQ(cfg.num_mla_layers(), 24);
  EXPECT_EQ(cfg.attn[91], AttnKind::kMla);  // the last two layers are both MLA
  EXPECT_EQ(cfg.attn[92], AttnKind::kMla);
  EXPECT_EQ(cfg.kda_heads, 96);
  EXPECT_EQ(cfg.kda_gate_lower_bound, -5.0);
  EXPECT_TRUE(cfg.kda_full_rank_gate);
  EXPECT_EQ(cfg.q_lora_rank, 1536);
  EXPECT_EQ(cfg.moe_latent_size, 3584);
  EXPECT_TRUE(cfg.moe_latent_norm);
  EXPECT_EQ(cfg.situ_beta, 4.0);
  EXPECT_EQ(cfg.situ_linear_beta, 25.0);
  EXPECT_EQ(cfg.shared_intermediate_size(), 6144);
}

TEST(ModelConfig, KimiK3RejectsOtherQuantization) {
  json text = test::moonshot_48b();
  text["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "nvfp4-pack-quantized"}};
  std::string msg = parse_error(k3_wrapper(text));
  EXPECT_NE(msg.find("nvfp4-pack-quantized"), std::string::npos) << msg;
  text["quantization_config"] = {{"quant_method", "fp8"}};
  msg = parse_error(k3_wrapper(text));
  EXPECT_NE(msg.find("text_config.quantization_config.quant_method"), std::string::npos) << msg;
  text = test::moonshot_48b();
  text["linear_attn_config"]["gate_lower_bound"] = 5.0;
  msg = parse_error(k3_wrapper(text));
  EXPECT_NE(msg.find("gate_lower_bound` must be negative"), std::string::npos) << msg;
}

TEST(ModelConfig, KimiK3ErrorsNameTextConfigFields) {
  json text = test::moonshot_48b();
  text.erase("vocab_size");
  std::string msg = parse_error(k3_wrapper(text));
  EXPECT_NE(msg.find("`text_config.vocab_size`"), std::string::npos) << msg;

  text = test::moonshot_48b();
  text["linear_attn_config"]["kda_layers"][0] = 0;
  msg = parse_error(k3_wrapper(text));
  EXPECT_NE(msg.find("text_config.linear_attn_config.kda_layers[0]"), std::string::npos) << msg;
}

TEST(ModelConfig, KimiK3WithoutTextConfig) {
  json doc = k3_wrapper(nullptr);
  std::string msg = parse_error(doc);
  EXPECT_NE(msg.find("text_config"), std::string::npos) << msg;
  doc["text_config"] = "x";
  msg = parse_error(doc);
  EXPECT_NE(msg.find("`text_config` must be an object"), std::string::npos) << msg;
}

TEST(ModelConfig, KindNames) {
  EXPECT_STREQ(attn_kind_name(AttnKind::kKda), "KDA");
  EXPECT_STREQ(attn_kind_name(AttnKind::kMla), "MLA");
  EXPECT_STREQ(ffn_kind_name(FfnKind::kDense), "dense");
  EXPECT_STREQ(ffn_kind_name(FfnKind::kMoe), "MoE");
}

std::string write_scratch(const std::string& name, const std::string& text) {
  std::string path = std::string(HLM_SCRATCH_DIR) + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(LoadModelConfig, ReadsFile) {
  std::string path = write_scratch("moonshot_48b.json", test::moonshot_48b().dump(2));
  ModelConfig cfg = load_model_config(path);
  EXPECT_EQ(cfg.source, path);
  expect_same_model(cfg, parse(test::moonshot_48b()));
}

TEST(LoadModelConfig, MissingFile) {
  std::string path = std::string(HLM_SCRATCH_DIR) + "/no_such_config.json";
  std::string msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
}

TEST(LoadModelConfig, Directory) {
  std::string msg = load_error(HLM_SCRATCH_DIR);
  EXPECT_NE(msg.find(HLM_SCRATCH_DIR), std::string::npos) << msg;
  EXPECT_NE(msg.find("directory"), std::string::npos) << msg;
}

TEST(LoadModelConfig, InvalidJsonNamesPathAndPosition) {
  std::string path = write_scratch("broken.json", "{\n  \"vocab_size\": 163840,\n  \"hidden_size\": }\n");
  std::string msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
}

// Regression (issue 12): config.json goes through the bounded parser: duplicate keys and deep nesting.
TEST(LoadModelConfig, DuplicateKeysAndDeepNestingAreErrors) {
  std::string path = write_scratch("dup.json", R"({"vocab_size": 10, "vocab_size": 163840})");
  EXPECT_NE(load_error(path).find(path + ": key \"vocab_size\" appears twice"), std::string::npos);
  path = write_scratch("deep.json", R"({"text_config": )" + std::string(1000, '{'));
  EXPECT_NE(load_error(path).find("invalid JSON"), std::string::npos);
  path = write_scratch("deep2.json", R"({"text_config": )" + std::string(1000, '['));
  EXPECT_NE(load_error(path).find(path + ": JSON nested more than 64 levels deep"), std::string::npos);
}

TEST(LoadModelConfig, EmptyFile) {
  std::string path = write_scratch("empty.json", "");
  EXPECT_NE(load_error(path).find("invalid JSON"), std::string::npos);
}

// The tiny golden fixtures: one written by transformers, the same model rewritten in Moonshot style.
TEST(LoadModelConfig, TinyFixturesAgreeAcrossStyles) {
  const std::string dir = HLM_FIXTURES_DIR;
  const std::string tf = dir + "/kimi-tiny-dense-first/config.json";
  const std::string moonshot = dir + "/kimi-tiny-dense-first-moonshot/config.json";
  if (!std::filesystem::exists(tf) || !std::filesystem::exists(moonshot)) {
    GTEST_SKIP() << "tiny fixtures not generated yet: " << tf << ", " << moonshot;
  }
  ModelConfig a = load_model_config(tf);
  ModelConfig b = load_model_config(moonshot);
  expect_same_model(a, b);
  EXPECT_GT(a.num_kda_layers(), 0);
  EXPECT_GT(a.num_mla_layers(), 0);
  EXPECT_EQ(a.ffn.front(), FfnKind::kDense);  // "dense-first"
  EXPECT_GT(a.num_moe_layers(), 0);
}

// Every committed fixture must be accepted: the golden tests depend on it.
TEST(LoadModelConfig, AllFixturesParse) {
  int found = 0;
  if (std::filesystem::is_directory(HLM_FIXTURES_DIR)) {
    for (const auto& entry : std::filesystem::directory_iterator(HLM_FIXTURES_DIR)) {
      const std::filesystem::path path = entry.path() / "config.json";
      if (!std::filesystem::exists(path)) continue;
      ++found;
      EXPECT_NO_THROW(load_model_config(path.string())) << load_error(path.string());
    }
  }
  if (found == 0) GTEST_SKIP() << "no fixtures under " << HLM_FIXTURES_DIR;
}

}  // namespace
}  // namespace hlm
