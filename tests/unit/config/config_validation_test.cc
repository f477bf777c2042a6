// Tests that every unsupported, inconsistent or mistyped config is rejected with an hlm::Error naming the
// config file and the field at fault: one case per rule, each a single edit of the published 48B config.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "config/model_config.h"
#include "kimi_configs.h"

namespace hlm {
namespace {

using nlohmann::json;

constexpr char kSource[] = "bad/config.json";

struct BadConfig {
  std::string name;                  // the test name
  std::function<json()> make;        // the rejected config
  std::vector<std::string> needles;  // substrings the message must contain (besides the file name)
};

json moonshot(const std::function<void(json&)>& edit) {
  json doc = test::moonshot_48b();
  edit(doc);
  return doc;
}

json transformers(const std::function<void(json&)>& edit) {
  json doc = test::transformers_48b();
  edit(doc);
  return doc;
}

json& lac(json& doc) { return doc["linear_attn_config"]; }

const std::vector<BadConfig>& bad_configs() {
  static const std::vector<BadConfig> cases = {
      // Document and model type.
      {"NotAnObject", [] { return json::array(); }, {"JSON object"}},
      {"ModelTypeMissing",
       [] { return moonshot([](json& d) { d.erase("model_type"); }); },
       {"model_type", "kimi_linear", "kimi_k3"}},
      {"ModelTypeUnknown",
       [] { return moonshot([](json& d) { d["model_type"] = "deepseek_v3"; }); },
       {"model_type", "deepseek_v3", "kimi_linear"}},
      {"ModelTypeNotString",
       [] { return moonshot([](json& d) { d["model_type"] = 3; }); },
       {"`model_type` must be a string"}},

      // Required base fields and their types.
      {"VocabSizeMissing",
       [] { return moonshot([](json& d) { d.erase("vocab_size"); }); },
       {"`vocab_size`", "required"}},
      {"VocabSizeNull",
       [] { return moonshot([](json& d) { d["vocab_size"] = nullptr; }); },
       {"`vocab_size`", "required"}},
      {"HiddenSizeZero",
       [] { return moonshot([](json& d) { d["hidden_size"] = 0; }); },
       {"`hidden_size`", "positive", "got 0"}},
      {"HiddenSizeString",
       [] { return moonshot([](json& d) { d["hidden_size"] = "2304"; }); },
       {"`hidden_size`", "integer", "string"}},
      {"HiddenSizeFloat",
       [] { return moonshot([](json& d) { d["hidden_size"] = 2304.5; }); },
       {"`hidden_size`", "integer"}},
      {"NumLayersNegative",
       [] { return moonshot([](json& d) { d["num_hidden_layers"] = -1; }); },
       {"`num_hidden_layers`", "positive"}},
      {"RmsNormEpsMissing",
       [] { return moonshot([](json& d) { d.erase("rms_norm_eps"); }); },
       {"`rms_norm_eps`", "required"}},
      {"RmsNormEpsString",
       [] { return moonshot([](json& d) { d["rms_norm_eps"] = "1e-5"; }); },
       {"`rms_norm_eps`", "number"}},
      {"RmsNormEpsZero",
       [] { return moonshot([](json& d) { d["rms_norm_eps"] = 0.0; }); },
       {"`rms_norm_eps`", "positive"}},

      // Attention schedule.
      {"NoSchedule",
       [] {
         return moonshot([](json& d) {
           lac(d).erase("kda_layers");
           lac(d).erase("full_attn_layers");
         });
       },
       {"layer_types", "kda_layers", "full_attn_layers", "never assumes a default"}},
      {"OnlyFullAttnLayers",
       [] { return moonshot([](json& d) { lac(d).erase("kda_layers"); }); },
       {"linear_attn_config.full_attn_layers", "linear_attn_config.kda_layers"}},
      {"LayerListZeroBased",
       [] { return moonshot([](json& d) { lac(d)["kda_layers"][0] = 0; }); },
       {"linear_attn_config.kda_layers[0]", "1-based", "1..27"}},
      {"LayerListOutOfRange",
       [] { return moonshot([](json& d) { lac(d)["full_attn_layers"][6] = 28; }); },
       {"linear_attn_config.full_attn_layers[6]", "28", "1..27"}},
      {"LayerListedTwice",
       [] { return moonshot([](json& d) { lac(d)["kda_layers"].push_back(4); }); },
       {"layer 4", "linear_attn_config.full_attn_layers[0]", "linear_attn_config.kda_layers[20]"}},
      {"LayerMissing",
       [] { return moonshot([](json& d) { lac(d)["full_attn_layers"].erase(6); }); },
       {"layer(s) 27 (1-based)", "kda_layers", "full_attn_layers"}},
      {"LayerListNotList",
       [] { return moonshot([](json& d) { lac(d)["kda_layers"] = "1-3"; }); },
       {"linear_attn_config.kda_layers", "list"}},
      {"LayerListEntryString",
       [] { return moonshot([](json& d) { lac(d)["kda_layers"][2] = "3"; }); },
       {"linear_attn_config.kda_layers[2]", "integer"}},
      // An absurd layer count is reported quickly, not allocated: as beyond the bound on layers, before
      // the layer lists are read.
      {"HugeLayerCount",
       [] { return moonshot([](json& d) { d["num_hidden_layers"] = 1000000000000000; }); },
       {"`num_hidden_layers` = 1000000000000000 exceeds 4096"}},
      {"LinearAttnConfigNotObject",
       [] { return moonshot([](json& d) { d["linear_attn_config"] = json::array(); }); },
       {"`linear_attn_config`", "object"}},
      {"LayerTypesWrongLength",
       [] { return transformers([](json& d) { d["layer_types"].erase(0); }); },
       {"`layer_types`", "26 entries", "27"}},
      {"LayerTypesBadValue",
       [] { return transformers([](json& d) { d["layer_types"][2] = "sliding_attention"; }); },
       {"`layer_types[2]`", "sliding_attention", "linear_attention", "full_attention"}},
      {"LayerTypesEntryNotString",
       [] { return transformers([](json& d) { d["layer_types"][2] = 1; }); },
       {"`layer_types[2]`", "string"}},

      // FFN schedule.
      {"MlpLayerTypesBadValue",
       [] { return transformers([](json& d) { d["mlp_layer_types"][5] = "moe"; }); },
       {"`mlp_layer_types[5]`", "dense", "sparse"}},
      {"MlpLayerTypesWrongLength",
       [] { return transformers([](json& d) { d["mlp_layer_types"].push_back("dense"); }); },
       {"`mlp_layer_types`", "28 entries"}},
      {"FirstKDenseReplaceMissing",
       [] { return moonshot([](json& d) { d.erase("first_k_dense_replace"); }); },
       {"mlp_layer_types", "first_k_dense_replace"}},
      {"FirstKDenseReplaceNegative",
       [] { return moonshot([](json& d) { d["first_k_dense_replace"] = -1; }); },
       {"`first_k_dense_replace`", ">= 0"}},
      {"MoeLayerFreqZero",
       [] { return moonshot([](json& d) { d["moe_layer_freq"] = 0; }); },
       {"`moe_layer_freq`", "positive"}},
      {"SparseLayersWithoutExperts",
       [] { return transformers([](json& d) { d["num_experts"] = 0; }); },
       {"`num_experts`", "positive"}},
      {"NumExpertsNegative",
       [] { return moonshot([](json& d) { d["num_experts"] = -8; }); },
       {"`num_experts`", ">= 0"}},

      // KDA dims.
      {"KdaHeadsMissing",
       [] { return moonshot([](json& d) { lac(d).erase("num_heads"); }); },
       {"linear_attn_config.num_heads", "linear_num_heads", "KDA"}},
      {"KdaHeadDimZero",
       [] { return moonshot([](json& d) { lac(d)["head_dim"] = 0; }); },
       {"`linear_attn_config.head_dim`", "positive"}},
      {"KdaConvKernelFlatMissing",
       [] { return transformers([](json& d) { d.erase("linear_conv_kernel_dim"); }); },
       {"linear_conv_kernel_dim", "short_conv_kernel_size"}},
      {"KdaHeadDimDisagree",
       [] { return moonshot([](json& d) { d["linear_head_dim"] = 64; }); },
       {"linear_attn_config.head_dim", "linear_head_dim", "disagree"}},

      // MLA.
      {"MlaHeadsMissing",
       [] { return moonshot([](json& d) { d.erase("num_attention_heads"); }); },
       {"`num_attention_heads`", "MLA"}},
      {"KvLoraRankMissing",
       [] { return moonshot([](json& d) { d.erase("kv_lora_rank"); }); },
       {"`kv_lora_rank`", "MLA"}},
      {"QkNopeHeadDimZero",
       [] { return moonshot([](json& d) { d["qk_nope_head_dim"] = 0; }); },
       {"`qk_nope_head_dim`", "positive"}},
      {"QkRopeHeadDimMissing",
       [] { return moonshot([](json& d) { d.erase("qk_rope_head_dim"); }); },
       {"`qk_rope_head_dim`"}},
      {"VHeadDimString",
       [] { return moonshot([](json& d) { d["v_head_dim"] = "128"; }); },
       {"`v_head_dim`", "integer"}},
      {"QLoraRankZero",
       [] { return moonshot([](json& d) { d["q_lora_rank"] = 0; }); },
       {"`q_lora_rank`", "positive"}},
      {"KvHeadsDiffer",
       [] { return moonshot([](json& d) { d["num_key_value_heads"] = 8; }); },
       {"`num_key_value_heads`", "num_attention_heads"}},

      // Dense FFN and MoE.
      {"IntermediateSizeMissing",
       [] { return moonshot([](json& d) { d.erase("intermediate_size"); }); },
       {"`intermediate_size`", "dense"}},
      {"ExpertsPerTokenMissing",
       [] { return moonshot([](json& d) { d.erase("num_experts_per_token"); }); },
       {"`num_experts_per_token`", "num_experts_per_tok", "MoE"}},
      {"MoeIntermediateSizeMissing",
       [] { return moonshot([](json& d) { d.erase("moe_intermediate_size"); }); },
       {"`moe_intermediate_size`"}},
      {"SharedExpertsMissing",
       [] { return moonshot([](json& d) { d.erase("num_shared_experts"); }); },
       {"`num_shared_experts`", "n_shared_experts"}},
      {"SharedExpertsNegative",
       [] { return moonshot([](json& d) { d["num_shared_experts"] = -1; }); },
       {"`num_shared_experts`", ">= 0"}},
      {"RoutedScalingFactorMissing",
       [] { return moonshot([](json& d) { d.erase("routed_scaling_factor"); }); },
       {"`routed_scaling_factor`", "required"}},
      {"RoutedScalingFactorString",
       [] { return moonshot([](json& d) { d["routed_scaling_factor"] = "2.446"; }); },
       {"`routed_scaling_factor`", "number"}},
      {"MoeRenormalizeNotBool",
       [] { return moonshot([](json& d) { d["moe_renormalize"] = 1; }); },
       {"`moe_renormalize`", "true or false"}},
      {"RouterSoftmax",
       [] { return moonshot([](json& d) { d["moe_router_activation_func"] = "softmax"; }); },
       {"`moe_router_activation_func`", "softmax", "sigmoid"}},
      {"UngroupedTopkWithGroups",
       [] {
         return moonshot([](json& d) {
           d["use_grouped_topk"] = false;
           d["num_expert_group"] = 8;
         });
       },
       {"`use_grouped_topk`", "num_expert_group"}},
      {"GroupsDoNotDivideExperts",
       [] { return moonshot([](json& d) { d["num_expert_group"] = 3; }); },
       {"`num_expert_group`", "3", "256"}},
      {"OneExpertPerGroup",
       [] {
         return moonshot([](json& d) {
           d["num_expert_group"] = 256;
           d["num_experts_per_token"] = 1;
         });
       },
       {"`num_expert_group`", "at least 2", "top 2"}},
      {"TopkGroupExceedsGroups",
       [] { return moonshot([](json& d) { d["topk_group"] = 2; }); },
       {"`topk_group`", "num_expert_group", "1..1"}},
      {"TopkGroupZero",
       [] { return moonshot([](json& d) { d["topk_group"] = 0; }); },
       {"`topk_group`", "positive"}},
      {"ExpertsPerTokenUnreachable",
       [] {
         return moonshot([](json& d) {
           d["num_expert_group"] = 8;
           d["num_experts_per_token"] = 40;
         });
       },
       {"`num_experts_per_token`", "40", "reachable", "<= 32"}},
      {"ExpertsPerTokenExceedsExperts",
       [] { return moonshot([](json& d) { d["num_experts"] = 4; }); },
       {"`num_experts_per_token`", "num_experts = 4"}},
      {"AliasDisagrees",
       [] { return moonshot([](json& d) { d["n_group"] = 2; }); },
       {"`num_expert_group`", "`n_group`", "disagree"}},
      {"AliasTyped",
       [] {
         return transformers([](json& d) {
           d.erase("num_experts_per_token");
           d["num_experts_per_tok"] = "8";
         });
       },
       {"`num_experts_per_tok`", "integer"}},

      // Unsupported settings.
      {"MlaUseNopeFalse",
       [] { return moonshot([](json& d) { d["mla_use_nope"] = false; }); },
       {"`mla_use_nope`", "NoPE"}},
      {"MlaUseNopeString",
       [] { return moonshot([](json& d) { d["mla_use_nope"] = "true"; }); },
       {"`mla_use_nope`", "true or false"}},
      {"HiddenActGelu",
       [] { return moonshot([](json& d) { d["hidden_act"] = "gelu"; }); },
       {"`hidden_act`", "gelu", "silu"}},
      {"HiddenActSituOnKimiLinear",
       [] { return moonshot([](json& d) { d["hidden_act"] = "situ"; }); },
       {"`hidden_act`", "situ"}},
      {"TiedEmbeddings",
       [] { return moonshot([](json& d) { d["tie_word_embeddings"] = true; }); },
       {"`tie_word_embeddings`"}},
      {"QuantizationConfig",
       [] { return moonshot([](json& d) {
              d["quantization_config"] = {{"quant_method", "fp8"}};
            }); },
       {"`quantization_config`"}},
      {"AttentionBias",
       [] { return transformers([](json& d) { d["attention_bias"] = true; }); },
       {"`attention_bias`"}},
      {"K3FeatureOnKimiLinear",
       [] { return moonshot([](json& d) { d["mla_use_output_gate"] = true; }); },
       {"`mla_use_output_gate`", "Kimi K3"}},
      {"K3GateOnKimiLinear",
       [] { return moonshot([](json& d) { lac(d)["use_full_rank_gate"] = true; }); },
       {"`linear_attn_config.use_full_rank_gate`", "Kimi K3"}},

      // Regression: sizes had no upper bound, so a config alone made every command allocate without
      // limit or overflow int64 ("negative dimension in shape"). Each is bounded, naming field and limit.
      {"VocabSizeBeyondLimit",
       [] { return moonshot([](json& d) { d["vocab_size"] = 20000000000; }); },
       {"`vocab_size` = 20000000000 exceeds 16777216, the most helixlm supports"}},
      {"HiddenSizeBeyondLimit",
       [] { return moonshot([](json& d) { d["hidden_size"] = int64_t{1} << 62; }); },
       {"`hidden_size` = 4611686018427387904 exceeds 131072"}},
      {"NumLayersBeyondLimit",
       [] { return moonshot([](json& d) { d["num_hidden_layers"] = 10000000; }); },
       {"`num_hidden_layers` = 10000000 exceeds 4096"}},
      {"LayerTypesBeyondLimit",
       [] {
         return transformers([](json& d) {
           d["num_hidden_layers"] = 5000;
           d["layer_types"] = std::vector<std::string>(5000, "linear_attention");
         });
       },
       {"`num_hidden_layers` = 5000 exceeds 4096"}},
      {"NumExpertsBeyondLimit",
       [] { return moonshot([](json& d) { d["num_experts"] = int64_t{1} << 40; }); },
       {"`num_experts` = 1099511627776 exceeds 65536"}},
      {"RoutedExpertsOverAllLayersBeyondLimit",
       [] { return moonshot([](json& d) { d["num_experts"] = 65536; }); },
       {"`num_experts` = 65536 routed experts in each of 26 MoE layers make 1703936", "524288",
        "valid: num_experts <= 20164"}},
      {"NumLocalExpertsAliasBeyondLimit",
       [] {
         return transformers([](json& d) {
           d.erase("num_experts");
           d["num_local_experts"] = 100000;
         });
       },
       {"`num_local_experts` = 100000 exceeds 65536"}},
      {"IntermediateSizeBeyondLimit",
       [] { return moonshot([](json& d) { d["intermediate_size"] = int64_t{1} << 62; }); },
       {"`intermediate_size` = 4611686018427387904 exceeds 1048576"}},
      {"MoeIntermediateSizeBeyondLimit",
       [] { return moonshot([](json& d) { d["moe_intermediate_size"] = 1000000; }); },
       {"`moe_intermediate_size` = 1000000 exceeds 262144"}},
      {"SharedExpertsBeyondLimit",
       [] { return moonshot([](json& d) { d["num_shared_experts"] = 1000; }); },
       {"`num_shared_experts` = 1000 exceeds 64"}},
      {"KdaHeadsBeyondLimit",
       [] { return moonshot([](json& d) { lac(d)["num_heads"] = 1000000; }); },
       {"`linear_attn_config.num_heads` = 1000000 exceeds 4096"}},
      {"KdaConvKernelBeyondLimit",
       [] { return transformers([](json& d) { d["linear_conv_kernel_dim"] = 1000000000; }); },
       {"`linear_conv_kernel_dim` = 1000000000 exceeds 256"}},
      {"MlaHeadsBeyondLimit",
       [] {
         return moonshot([](json& d) {
           d["num_attention_heads"] = 8192;
           d["num_key_value_heads"] = 8192;
         });
       },
       {"`num_attention_heads` = 8192 exceeds 4096"}},
      {"KvLoraRankBeyondLimit",
       [] { return moonshot([](json& d) { d["kv_lora_rank"] = int64_t{1} << 32; }); },
       {"`kv_lora_rank` = 4294967296 exceeds 131072"}},
      {"QkRopeHeadDimBeyondLimit",
       [] { return moonshot([](json& d) { d["qk_rope_head_dim"] = 100000; }); },
       {"`qk_rope_head_dim` = 100000 exceeds 4096"}},

      // Token ids.
      {"EosString",
       [] { return moonshot([](json& d) { d["eos_token_id"] = "</s>"; }); },
       {"`eos_token_id`", "integer or a list of integers"}},
      {"EosListEntryString",
       [] { return moonshot([](json& d) {
              d["eos_token_id"] = {163586, "x"};
            }); },
       {"`eos_token_id[1]`", "integer"}},
      {"BosNegative",
       [] { return moonshot([](json& d) { d["bos_token_id"] = -5; }); },
       {"`bos_token_id`", ">= 0"}},
      // Regression (issue 12): ids the lm_head cannot produce were accepted.
      {"EosOutsideVocab",
       [] { return moonshot([](json& d) { d["eos_token_id"] = 163840; }); },
       {"`eos_token_id` = 163840 is outside the vocabulary [0, 163840)"}},
      {"EosListEntryOutsideVocab",
       [] { return moonshot([](json& d) {
              d["eos_token_id"] = {163586, 200000};
            }); },
       {"`eos_token_id[1]` = 200000 is outside the vocabulary"}},
      {"BosOutsideVocab",
       [] { return moonshot([](json& d) { d["bos_token_id"] = 163840; }); },
       {"`bos_token_id` = 163840 is outside the vocabulary"}},
      {"ModelMaxLengthZero",
       [] { return moonshot([](json& d) { d["model_max_length"] = 0; }); },
       {"`model_max_length`", "positive"}},
  };
  return cases;
}

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, RejectedNamingFileAndField) {
  const BadConfig& c = GetParam();
  json doc = c.make();
  try {
    parse_model_config(doc, kSource);
    FAIL() << "accepted: " << doc.dump();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(kSource, 0), 0u) << "message does not start with the file name: " << msg;
    for (const std::string& needle : c.needles) {
      EXPECT_NE(msg.find(needle), std::string::npos) << "missing \"" << needle << "\" in: " << msg;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ModelConfig, BadConfigTest, ::testing::ValuesIn(bad_configs()),
                         [](const ::testing::TestParamInfo<BadConfig>& info) { return info.param.name; });

}  // namespace
}  // namespace hlm
