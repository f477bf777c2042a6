// `helixlm plan`: sizes a Helix deployment without weights. From a config.json (or a checkpoint
// directory, whose headers give the exact stored dtypes) and a layout it prints the verdict of every
// layout rule (with the layouts that would work), the exact parameter count, per-rank weight bytes by
// category, MLA KV bytes per token and at the requested context, KDA state per sequence, and totals for
// a batch.
//
// With --layer-times (the JSON of `bench --layer-split`, run on one GPU over the first layers of the
// model) it also extrapolates a whole decode step for the layout: each section kind keeps the time per
// byte it took in that measurement, applied to the bytes one of the layout's ranks must move per layer
// (in the dtypes the measured backend holds, KV included), times the model's layers of that kind.
// Communication, and any fixed cost per layer that does not shrink with the bytes, are not in the estimate:
// for N > 1 it is a lower bound.
#include <algorithm>
#include <array>
#include <fstream>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/checked_math.h"
#include "base/json_parse.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "model/memory_plan.h"
#include "ops/backend.h"
#include "parallel/layout_rules.h"
#include "weights/model_source.h"
#include "weights/safetensors.h"

namespace hlm {

namespace {

struct PlanArgs {
  std::string config;
  std::string model_dir;
  LayoutRequest layout;
  int64_t context = 131072;
  int64_t batch = 1;
  std::string kv_dtype = "bf16";
  std::string layer_times;  // bench --layer-split --json output
};

std::string bytes_str(int64_t b) {
  return fmt::format("{:>20} B  {:>10.3f} GiB", grouped(b), static_cast<double>(b) / (1024.0 * 1024 * 1024));
}

int64_t kv_value_bytes(const std::string& name) {
  if (name == "bf16" || name == "f16") return 2;
  if (name == "fp8") return 1;
  if (name == "f32") return 4;
  HLM_FAIL("--kv-dtype must be one of bf16, f16, fp8, f32 (got '{}')", name);
}

// The whole-model decode step for rank 0 of `m` from measured per-layer section times (see the header).
void extrapolate_step(const ModelConfig& cfg, const Mapping& m, const PlanArgs& a,
                      const StoredDType& dtype_of) {
  const std::string& path = a.layer_times;
  std::ifstream in(path);
  HLM_CHECK(in, "--layer-times {}: cannot open the file", path);
  // bench --json prints one object on one line; log lines may precede it in a saved output.
  std::string line, report;
  while (std::getline(in, line)) {
    if (!line.empty() && line.front() == '{') report = line;
  }
  HLM_CHECK(!report.empty(),
            "--layer-times {}: no JSON line: give it the output of `bench --layer-split --json`", path);
  const nlohmann::json j = parse_json(report, path);
  HLM_CHECK(j.is_object() && j.contains("sections") && j["sections"].is_array(),
            "--layer-times {}: no \"sections\": give it the output of `bench --layer-split --json`", path);
  auto field = [&](const nlohmann::json& o, const char* key) -> const nlohmann::json& {
    HLM_CHECK(o.contains(key), "--layer-times {}: missing field \"{}\"", path, key);
    return o[key];
  };
  HLM_CHECK(field(j, "model_type").get<std::string>() == cfg.model_type &&
                field(j, "hidden_size").get<int64_t>() == cfg.hidden_size &&
                field(j, "num_experts").get<int64_t>() == cfg.num_experts,
            "--layer-times {}: measured on a {} model (hidden {}, {} experts), not this {} (hidden {}, {} "
            "experts)",
            path, j["model_type"].get<std::string>(), j["hidden_size"].get<int64_t>(),
            j["num_experts"].get<int64_t>(), cfg.model_type, cfg.hidden_size, cfg.num_experts);
  const int64_t batch = field(j, "batch").get<int64_t>();
  HLM_CHECK(batch == a.batch,
            "--layer-times {}: measured at batch {}, but --batch is {} (the experts a step touches, and so "
            "the MoE bytes and their efficiency, depend on the batch)",
            path, batch, a.batch);
  const double bandwidth = field(j, "copy_bandwidth_gb_s").get<double>() * 1e9;
  // The layout's bytes in the dtypes the measured backend holds, so that time per byte carries over.
  const std::string device = field(j, "device").get<std::string>();
  HLM_CHECK(device == "cpu" || device == "cuda", "--layer-times {}: unknown device \"{}\"", path, device);
  const Device measured_on = device == "cpu" ? Device::kCpu : Device::kCuda;
  const StoredDType held = [&](const WeightSpec& spec) {
    return held_weight_dtype(measured_on, dtype_of(spec));
  };
  const int64_t held_kv = field(j, "kv_bytes_per_value").get<int64_t>();
  HLM_CHECK(held_kv == 1 || held_kv == 2 || held_kv == 4,
            "--layer-times {}: kv_bytes_per_value {} is not 1, 2 or 4", path, held_kv);
  const StepBytes bytes =
      decode_step_bytes(cfg, m, a.context, a.batch, a.layout.tokens_per_block, held, held_kv, held_kv);
  const std::array<int, kNumStepSections> layers = step_section_counts(cfg);
  std::cout << fmt::format(
      "decode step extrapolated from {} (measured: {} layers, {} context, batch {}, {:.0f} GB/s copy "
      "bandwidth), rank 0 of this layout at {} tokens; communication not included:\n",
      path, field(j, "layers").get<int64_t>(), field(j, "context").get<int64_t>(), batch, bandwidth / 1e9,
      grouped(a.context));
  std::cout << fmt::format("  {:<14} {:>6} {:>17} {:>16} {:>13} {:>10}\n", "section", "layers",
                           "measured ms/layer", "layout ms/layer", "layout ms", "floor ms");
  double total = 0, floor = 0;
  for (int i = 0; i < kNumStepSections; ++i) {
    if (layers[i] == 0) continue;
    const nlohmann::json* measured = nullptr;
    for (const nlohmann::json& sec : j["sections"]) {
      if (field(sec, "name").get<std::string>() == kStepSectionNames[i]) measured = &sec;
    }
    HLM_CHECK(measured != nullptr,
              "--layer-times {}: no {} section was measured, but the model has {} such layers: run the "
              "bench with --num-layers covering one",
              path, kStepSectionNames[i], layers[i]);
    const double ms_per_layer = field(*measured, "ms_per_layer").get<double>();
    const double measured_bytes =
        field(*measured, "floor_bytes").get<double>() / field(*measured, "layers").get<double>();
    const double layout_bytes = bytes.section[i] / layers[i];
    HLM_CHECK(measured_bytes > 0, "--layer-times {}: section {} has no floor bytes", path,
              kStepSectionNames[i]);
    const double per_layer = ms_per_layer * layout_bytes / measured_bytes;
    total += per_layer * layers[i];
    floor += bytes.section[i] / bandwidth * 1e3;
    std::cout << fmt::format("  {:<14} {:>6} {:>17.4f} {:>16.4f} {:>13.3f} {:>10.3f}\n", kStepSectionNames[i],
                             layers[i], ms_per_layer, per_layer, per_layer * layers[i],
                             bytes.section[i] / bandwidth * 1e3);
  }
  std::cout << fmt::format(
      "  total {:.3f} ms per step ({:.1f} tokens/s), floor {:.3f} ms: {:.2f}x the floor\n", total,
      a.batch / total * 1e3, floor, total / floor);
  if (m.world() > 1) {
    std::cout
        << "  a lower bound: a layer's fixed cost (launches, latency) does not shrink with its bytes, and "
           "the collectives are not counted\n";
  }
}

int run_plan(const PlanArgs& a) {
  HLM_CHECK(a.config.empty() != a.model_dir.empty(), "plan needs exactly one of --config FILE or -m DIR");
  HLM_CHECK(a.context > 0 && a.batch > 0, "--context and --batch must be positive (got {}, {})", a.context,
            a.batch);
  const int64_t kv_bytes = kv_value_bytes(a.kv_dtype);
  const std::string model_dir = a.model_dir.empty() ? "" : resolve_model_dir(a.model_dir);
  const std::string config_path = a.config.empty() ? model_dir + "/config.json" : a.config;
  const ModelConfig cfg = load_model_config(config_path);
  const std::vector<WeightSpec> layout = weight_layout(cfg);
  std::unique_ptr<Checkpoint> ckpt;
  if (!model_dir.empty()) {
    ckpt = std::make_unique<Checkpoint>(model_dir);
    // The checkpoint must be one the loader accepts, or the plan would approve what cannot run.
    for (const WeightSpec& s : layout) checked_tensor(*ckpt, s, cfg.source);
  }

  const LayoutRequest& req = a.layout;
  const int64_t n = int64_t{req.tp} * req.cp;  // --tp 46341 --cp 46341 must not wrap
  std::cout << fmt::format("model: {} ({}), {} parameters\n", config_path, cfg.model_type,
                           grouped(parameter_count(cfg)));
  std::vector<std::string> violations = layout_violations(cfg, req);
  if (!violations.empty()) {
    std::cout << fmt::format("layout tp={} cp={} (N = {}): INVALID\n", req.tp, req.cp, n);
    for (const std::string& v : violations) std::cout << "  - " << v << "\n";
    std::cout << describe_valid_sizes(cfg, std::max<int64_t>(1, req.tokens_per_block)) << "\n";
    return 1;
  }
  const Mapping m0 = Mapping::make(req.tp, req.cp, 0, req.moe_ep, req.moe_tp);
  std::cout << fmt::format("layout tp={} cp={} (N = {}), MoE EP {} x TP {}: valid\n", req.tp, req.cp, n,
                           m0.moe_ep, m0.moe_tp);
  std::cout << fmt::format(
      "per rank: {} of {} KDA heads, {} MLA query heads (tp-local) and a chunk of {}, {} of {} routed "
      "experts, "
      "{} lm_head rows (vocab-parallel)\n",
      m0.kda_heads(cfg.kda_heads).size(), cfg.kda_heads, m0.mla_tp_heads(cfg.mla_heads).size(),
      m0.mla_chunk_heads(cfg.mla_heads).size(), m0.experts(cfg.num_experts).size(), cfg.num_experts,
      m0.vocab_rows(cfg.vocab_size).size());

  const StoredDType dtype_of = [&](const WeightSpec& s) {
    return ckpt ? ckpt->info(stored_name(*ckpt, s)).dtype : s.typical_dtype;
  };
  std::cout << fmt::format("weights per rank ({}):\n",
                           ckpt ? "dtypes as stored in the checkpoint"
                                : "dtypes of the published checkpoint, as the shard plan records them");
  const Placement placement{req.tokens_per_block, req.cp};
  int64_t worst_total = 0;
  for (int r = 0; r < n; ++r) {  // a valid layout's rank count fits int: it divides the head counts
    const Mapping m = Mapping::make(req.tp, req.cp, r, req.moe_ep, req.moe_tp);
    const RankWeightBytes w = rank_weight_bytes(layout, m, dtype_of);
    const StateBytes st = state_bytes(cfg, m, kv_bytes, 2);
    int64_t kv = 0;
    try {
      kv = kv_bytes_at(st, placement, m.cp_rank(), a.context);
    } catch (const Error& e) {
      HLM_FAIL("--context {}: {}", a.context, e.what());
    }
    const int64_t per_seq = checked_add(kv, st.kda_recurrent + st.kda_conv, "bytes per sequence");
    const int64_t total =
        checked_add(w.total, checked_mul(a.batch, per_seq, "--batch x bytes per sequence"), "rank total");
    worst_total = std::max(worst_total, total);
    // Ranks with identical figures are summarized by the first; print rank 0 in full.
    if (r > 0) continue;
    for (int c = 0; c < kNumWeightCategories; ++c) {
      if (w.by_category[c] == 0) continue;
      std::cout << fmt::format("  {:<16}{}\n", weight_category_name(static_cast<WeightCategory>(c)),
                               bytes_str(w.by_category[c]));
    }
    std::cout << fmt::format("  {:<16}{}\n", "total", bytes_str(w.total));
    std::cout << fmt::format("state per rank ({} KV, bf16 conv window, fp32 recurrent state):\n", a.kv_dtype);
    std::cout << fmt::format(
        "  MLA KV per global token: {} B over all ranks of a CP group, {:.1f} B per rank\n",
        grouped(st.kv_per_token), static_cast<double>(st.kv_per_token) / req.cp);
    std::cout << fmt::format("  MLA KV of one sequence at {} tokens (rank 0, whole pages of {}):{}\n",
                             grouped(a.context), req.tokens_per_block, bytes_str(kv));
    std::cout << fmt::format("  KDA recurrent state per sequence: {}\n", bytes_str(st.kda_recurrent));
    std::cout << fmt::format("  KDA conv window per sequence:     {}\n", bytes_str(st.kda_conv));
    std::cout << fmt::format("total for batch {} at {} tokens (rank 0):{}\n", a.batch, grouped(a.context),
                             bytes_str(total));
  }
  std::cout << fmt::format("largest rank total:{}\n", bytes_str(worst_total));
  if (!a.layer_times.empty()) extrapolate_step(cfg, m0, a, dtype_of);
  return 0;
}

}  // namespace

CommandRunner add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "Size a Helix deployment from a config, without weights");
  cmd->add_option("--config", a->config, "config.json of the model");
  cmd->add_option("-m,--model", a->model_dir,
                  "Checkpoint directory or cached Hugging Face repo id (uses the stored dtypes)");
  cmd->add_option("--tp", a->layout.tp, "MLA tensor-parallel width")->capture_default_str();
  cmd->add_option("--cp", a->layout.cp, "MLA context-parallel width")->capture_default_str();
  cmd->add_option("--moe-ep", a->layout.moe_ep, "MoE expert-parallel width (default: tp*cp)");
  cmd->add_option("--moe-tp", a->layout.moe_tp, "MoE tensor-parallel width (default: 1)");
  cmd->add_option("--tokens-per-block", a->layout.tokens_per_block, "MLA KV page size")
      ->capture_default_str();
  cmd->add_option("--context", a->context, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--batch", a->batch, "Sequences")->capture_default_str();
  cmd->add_option("--kv-dtype", a->kv_dtype, "MLA cache dtype: bf16, f16, fp8, f32")->capture_default_str();
  cmd->add_option("--layer-times", a->layer_times,
                  "JSON of `bench --layer-split --json`: extrapolate the whole model's decode step for this "
                  "layout from its per-layer section times");
  return [a] { return run_plan(*a); };
}

}  // namespace hlm
