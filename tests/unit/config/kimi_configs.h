// Kimi-Linear-48B-A3B config.json in both published styles (docs/MODEL.md §2.1, §2.2), shared by the config
// tests: the Moonshot Hub file and what transformers writes for the same model. Raw strings rather than
// fixture files so each test shows exactly what it parses.
#pragma once

#include <nlohmann/json.hpp>

namespace hlm::test {

// The Hub config of moonshotai/Kimi-Linear-48B-A3B-Instruct: 1-based layer lists, nested KDA dims.
inline nlohmann::json moonshot_48b() {
  return nlohmann::json::parse(R"({
    "model_type": "kimi_linear",
    "architectures": ["KimiLinearForCausalLM"],
    "dtype": "bfloat16",
    "tie_word_embeddings": false,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 27,
    "vocab_size": 163840,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "model_max_length": 1048576,
    "bos_token_id": 163584,
    "eos_token_id": 163586,
    "pad_token_id": 163839,
    "linear_attn_config": {
      "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
      "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
      "num_heads": 32,
      "head_dim": 128,
      "short_conv_kernel_size": 4
    },
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "q_lora_rank": null,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": true,
    "rope_theta": 10000.0,
    "rope_scaling": null,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "moe_intermediate_size": 1024,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "moe_router_activation_func": "sigmoid",
    "use_grouped_topk": true,
    "num_expert_group": 1,
    "topk_group": 1,
    "moe_renormalize": true,
    "routed_scaling_factor": 2.446,
    "head_dim": 72
  })");
}

// The same model as transformers 5.x `KimiLinearConfig(...).save_pretrained` writes it: 0-based explicit
// schedules, flat KDA dims, no linear_attn_config / first_k_dense_replace / moe_layer_freq.
inline nlohmann::json transformers_48b() {
  return nlohmann::json::parse(R"({
    "model_type": "kimi_linear",
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 163584,
    "eos_token_id": 163586,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2304,
    "initializer_range": 0.02,
    "intermediate_size": 9216,
    "kv_lora_rank": 512,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_head_dim": 128,
    "linear_num_heads": 32,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse",
                        "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse",
                        "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse"],
    "model_max_length": 1048576,
    "moe_intermediate_size": 1024,
    "moe_renormalize": true,
    "num_attention_heads": 32,
    "num_expert_group": 1,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_hidden_layers": 27,
    "num_key_value_heads": 32,
    "num_shared_experts": 1,
    "output_router_logits": false,
    "pad_token_id": 163839,
    "pretraining_tp": 1,
    "q_lora_rank": null,
    "qk_head_dim": 192,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-05,
    "routed_scaling_factor": 2.446,
    "tie_word_embeddings": false,
    "topk_group": 1,
    "transformers_version": "5.24.0",
    "use_cache": true,
    "v_head_dim": 128,
    "vocab_size": 163840
  })");
}

}  // namespace hlm::test
