// `helixlm inspect`: what a checkpoint holds, from config.json and the safetensors headers alone (no
// weight is read): the layer schedule, the dimensions, the exact parameter count and the bytes by
// category, each tensor checked as the loader checks it (shape the config implies, dtype it reads).
#include <array>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/format.h"
#include "model/weight_layout.h"
#include "weights/model_source.h"
#include "weights/safetensors.h"

namespace hlm {

namespace {

void print_schedule(const ModelConfig& c) {
  std::cout << fmt::format("layers: {} ({} KDA, {} MLA; {} dense FFN, {} MoE)\n", c.num_layers,
                           c.num_kda_layers(), c.num_mla_layers(), c.num_layers - c.num_moe_layers(),
                           c.num_moe_layers());
  for (int i = 0; i < c.num_layers; ++i) {
    std::cout << fmt::format("  {:>3}  {:<3}  {}\n", i, attn_kind_name(c.attn[i]), ffn_kind_name(c.ffn[i]));
  }
  std::cout << fmt::format("hidden {}, vocab {}, rms_norm_eps {}\n", c.hidden_size, c.vocab_size,
                           c.rms_norm_eps);
  if (c.num_kda_layers() > 0) {
    std::cout << fmt::format("KDA: {} heads x {}, conv kernel {}\n", c.kda_heads, c.kda_head_dim,
                             c.kda_conv_kernel);
  }
  if (c.num_mla_layers() > 0) {
    std::cout << fmt::format("MLA: {} heads, q_lora_rank {}, kv_lora_rank {}, qk nope/rope {}/{}, v {}\n",
                             c.mla_heads, c.q_lora_rank == 0 ? "none" : std::to_string(c.q_lora_rank),
                             c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
  }
  if (c.num_moe_layers() > 0) {
    std::cout << fmt::format(
        "MoE: {} experts, top-{}, intermediate {}, {} shared; groups {} (top {}), renormalize {}, scaling "
        "{}\n",
        c.num_experts, c.experts_per_token, c.moe_intermediate_size, c.num_shared_experts, c.num_expert_group,
        c.topk_group, c.moe_renormalize ? "on" : "off", c.routed_scaling_factor);
  }
  if (c.num_moe_layers() < c.num_layers)
    std::cout << fmt::format("dense MLP: intermediate {}\n", c.intermediate_size);
}

int run_inspect(const std::string& dir) {
  const ModelConfig cfg = load_model_config(dir + "/config.json");
  const Checkpoint ckpt(dir);
  // Every tensor is checked before anything is printed: a checkpoint the loader refuses gets no report.
  std::array<int64_t, kNumWeightCategories> params{}, bytes{};
  std::set<std::string> used;
  for (const WeightSpec& s : weight_layout(cfg)) {
    const TensorInfo& info = checked_tensor(ckpt, s, cfg.source);
    if (!used.insert(info.name).second) continue;  // kv_b_proj feeds two logical weights
    const auto c = static_cast<size_t>(s.category);
    params[c] += stored_parameters(s);
    bytes[c] += static_cast<int64_t>(info.data_end - info.data_begin);
  }

  std::cout << fmt::format("model: {} ({})\n", dir, cfg.model_type);
  print_schedule(cfg);
  int64_t total_params = 0, total_bytes = 0;
  std::cout << fmt::format("{:<16} {:>16} {:>16}\n", "category", "parameters", "bytes");
  for (int c = 0; c < kNumWeightCategories; ++c) {
    if (params[c] == 0) continue;
    std::cout << fmt::format("{:<16} {:>16} {:>16}\n", weight_category_name(static_cast<WeightCategory>(c)),
                             grouped(params[c]), grouped(bytes[c]));
    total_params += params[c];
    total_bytes += bytes[c];
  }
  std::cout << fmt::format("{:<16} {:>16} {:>16}\n", "total", grouped(total_params), grouped(total_bytes));
  std::vector<std::string> unused;
  for (const std::string& n : ckpt.names()) {
    if (!used.count(n)) unused.push_back(n);
  }
  if (!unused.empty()) {
    std::cout << fmt::format("{} checkpoint tensors are not used by the model, e.g. '{}'\n", unused.size(),
                             unused.front());
  }
  return 0;
}

}  // namespace

CommandRunner add_inspect_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>("models/kimi-linear-tiny");
  CLI::App* cmd = app.add_subcommand("inspect", "Describe a checkpoint: schedule, parameters, bytes");
  cmd->add_option("-m,--model", *dir, "Checkpoint directory or cached Hugging Face repo id")
      ->capture_default_str();
  return [dir] { return run_inspect(resolve_model_dir(*dir)); };
}

}  // namespace hlm
