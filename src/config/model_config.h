// ModelConfig: everything the model math needs, parsed from a checkpoint's config.json. One parser reads
// both config styles of docs/MODEL.md §2 (Moonshot `linear_attn_config` with 1-based layer lists, and the
// transformers-native `layer_types` / `mlp_layer_types`), plus Kimi K3's nested `text_config`. Fields whose
// defaults differ between code bases are required; anything unsupported is an error naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hlm {

enum class AttnKind { kKda, kMla };
enum class FfnKind { kDense, kMoe };
enum class Activation { kSilu, kSitu };

// Upper bounds on the sizes a config.json may give, checked when it is parsed. Each sits far above any
// released model (Kimi K3 in brackets) and low enough that every size the config alone implies (a
// tensor's elements, the whole model's parameters and its bytes in F32, the MLA cache per token, the KDA
// state per sequence) stays below 2^60, well inside int64, and that the weight layout, one entry per
// checkpoint tensor, stays a few million entries long.
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;   // 16,777,216 (163,840)
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 17;  // 131,072 (7,168); also the LoRA ranks
inline constexpr int64_t kMaxLayers = 4096;                  // (93)
inline constexpr int64_t kMaxHeads = 4096;                   // KDA and MLA heads (96)
inline constexpr int64_t kMaxHeadDim = 4096;                 // KDA head_dim, MLA qk_nope/qk_rope/v (128)
inline constexpr int64_t kMaxConvKernel = 256;               // KDA short convolution (4)
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;     // dense MLP, 1,048,576 (33,792)
inline constexpr int64_t kMaxMoeIntermediateSize = int64_t{1} << 18;  // one expert, 262,144 (3,072)
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;              // per MoE layer, 65,536 (896)
inline constexpr int64_t kMaxSharedExperts = 64;                      // (2)
// Routed experts summed over the MoE layers, 524,288 (896 x 92 = 82,432): the layout holds three
// matrices (six tensors with MXFP4) for each.
inline constexpr int64_t kMaxRoutedExperts = int64_t{1} << 19;

// Fields of a component that no layer uses keep their initializers (0 for dims and counts: e.g. the KDA
// dims when every layer is MLA): the parser reads and requires them only when the schedule needs them.
struct ModelConfig {
  std::string source;         // the config.json path, for error messages
  std::string model_type;     // "kimi_linear" or "kimi_k3"
  std::string tensor_prefix;  // prepended to every checkpoint key: "" or "language_model." (K3)

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  double rms_norm_eps = 0;
  std::vector<AttnKind> attn;                 // per layer, 0-based
  std::vector<FfnKind> ffn;                   // per layer, 0-based
  Activation hidden_act = Activation::kSilu;  // FFN activation (the KDA conv always uses silu)

  // KDA (linear attention)
  int64_t kda_heads = 0;
  int64_t kda_head_dim = 0;  // K = V
  int64_t kda_conv_kernel = 0;

  // MLA (full attention)
  int64_t mla_heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q-LoRA (plain q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // FFN
  int64_t intermediate_size = 0;  // dense MLP
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_shared_experts = 0;
  int64_t num_expert_group = 1;
  int64_t topk_group = 1;
  bool moe_renormalize = true;
  double routed_scaling_factor = 1.0;

  // Kimi K3 (docs/k3.md). The defaults are Kimi Linear's behaviour.
  double kda_gate_lower_bound = 0;  // < 0: bounded forget gate lb·sigmoid(...)
  bool kda_full_rank_gate = false;  // KDA output gate g_proj [D, hidden] instead of g_b(g_a(x))
  bool mla_output_gate = false;     // MLA attn ⊙ sigmoid(g_proj(x)) before o_proj
  int64_t attn_res_block_size = 0;  // > 0: block attention residuals with this block size
  double situ_beta = 4.0;           // SiTU (hidden_act "situ")
  double situ_linear_beta = 25.0;
  int64_t moe_latent_size = 0;   // > 0: routed experts work in this latent width
  bool moe_latent_norm = false;  // RMSNorm of the routed sum in the latent space
  bool mxfp4_experts = false;    // routed experts stored as compressed-tensors MXFP4

  // Token ids (-1 when absent).
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  int64_t max_position_embeddings = 0;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t kda_dim() const { return kda_heads * kda_head_dim; }
  int64_t mla_cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // latent + shared k_pe
  int64_t shared_intermediate_size() const { return moe_intermediate_size * num_shared_experts; }
  int num_kda_layers() const;
  int num_mla_layers() const;
  int num_moe_layers() const;
};

// Reads and validates `path` (a config.json); errors name the file and the field.
ModelConfig load_model_config(const std::string& path);

// The same from an already parsed document; `source` names it in errors.
ModelConfig parse_model_config(const nlohmann::json& doc, const std::string& source);

const char* attn_kind_name(AttnKind k);  // "KDA" / "MLA"
const char* ffn_kind_name(FfnKind k);    // "dense" / "MoE"

}  // namespace hlm
