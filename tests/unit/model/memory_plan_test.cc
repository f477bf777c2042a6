// Cache sizing before allocation and the bench floor. Regressions (issue 12): caches were never sized
// against memory (bench --batch 100000 met the OOM killer, -n 1e9 died in bad_alloc), page products
// wrapped, plan printed negative totals, and the K3 floor counted experts at the hidden width instead of
// the latent width they work in.
#include "model/memory_plan.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "ops/cpu/cpu_ops.h"
#include "parallel/comm.h"

namespace hlm {
namespace {

const std::string kConfigs = std::string(HLM_FIXTURES_DIR) + "/configs";

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MemoryPlan, CacheSizeOfThe48BModel) {
  const ModelConfig cfg = load_model_config(kConfigs + "/kimi-linear-48b-a3b.json");
  // cp 8, 4 sequences of 1M tokens, bf16 KV (2 B) and conv window: 8,064 B per token per CP group, so
  // 1,008 B per token on a rank; 5 MiB recurrent + 180 KiB conv per sequence (docs/HELIX.md §11).
  const CacheSize c = cache_size(cfg, Mapping::make(1, 8, 0), 64, 4, 1 << 20, 2, 2);
  EXPECT_EQ(c.pages, 4 * (1 << 20) / 64 / 8);
  EXPECT_EQ(c.kv_pool_bytes, int64_t{4} * (1 << 20) / 8 * 8064);
  EXPECT_EQ(c.kda_state_bytes, 4 * (5 * 1024 * 1024 + 20 * 3 * 4 * 128 * 3 * 2));
  EXPECT_EQ(c.total(), c.kv_pool_bytes + c.kda_state_bytes);
}

// Every size at the config's limits (model_config.h) fits int64 with room to spare: the largest dims
// everywhere, 4096 layers, and one MoE layer of the most experts (the bound on routed experts over all
// layers keeps the experts' share within the same margin; a layout of that many costs seconds).
TEST(MemoryPlan, SizesAtTheConfigLimitsStayWithinInt64) {
  nlohmann::json doc = {{"model_type", "kimi_linear"},
                        {"vocab_size", kMaxVocabSize},
                        {"hidden_size", kMaxHiddenSize},
                        {"num_hidden_layers", kMaxLayers},
                        {"rms_norm_eps", 1e-5},
                        {"linear_num_heads", kMaxHeads},
                        {"linear_head_dim", kMaxHeadDim},
                        {"linear_conv_kernel_dim", kMaxConvKernel},
                        {"num_attention_heads", kMaxHeads},
                        {"q_lora_rank", kMaxHiddenSize},
                        {"kv_lora_rank", kMaxHiddenSize},
                        {"qk_nope_head_dim", kMaxHeadDim},
                        {"qk_rope_head_dim", kMaxHeadDim},
                        {"v_head_dim", kMaxHeadDim},
                        {"num_experts", kMaxExperts},
                        {"num_experts_per_token", 8},
                        {"moe_intermediate_size", kMaxMoeIntermediateSize},
                        {"num_shared_experts", kMaxSharedExperts},
                        {"routed_scaling_factor", 1.0},
                        {"intermediate_size", kMaxIntermediateSize}};
  std::vector<std::string> attn, ffn;
  for (int64_t i = 0; i < kMaxLayers; ++i) {
    attn.push_back(i % 2 == 0 ? "full_attention" : "linear_attention");
    ffn.push_back(i == 1 ? "sparse" : "dense");
  }
  doc["layer_types"] = attn;
  doc["mlp_layer_types"] = ffn;
  const ModelConfig cfg = parse_model_config(doc, "limits/config.json");
  constexpr int64_t kRoom = int64_t{1} << 60;  // 8x below int64's limit
  EXPECT_GT(parameter_count(cfg), 0);
  EXPECT_LT(parameter_count(cfg), kRoom / 4);  // bytes in F32 too
  const Mapping one = Mapping::make(1, 1, 0);
  const RankWeightBytes w =
      rank_weight_bytes(weight_layout(cfg), one, [](const WeightSpec&) { return DType::kF32; });
  EXPECT_GT(w.total, 0);
  EXPECT_LT(w.total, kRoom);
  const StateBytes st = state_bytes(cfg, one, 4, 4);
  EXPECT_GT(st.kv_per_token, 0);
  EXPECT_LT(st.kda_recurrent + st.kda_conv, kRoom);
  const CacheSize c = cache_size(cfg, one, 64, 1, 64, 4, 4);
  EXPECT_GT(c.total(), 0);
}

TEST(MemoryPlan, CacheSizeIsWhatTheEngineAllocates) {
  const std::string dir = std::string(HLM_FIXTURES_DIR) + "/kimi-tiny-dense-first";
  const ModelConfig cfg = load_model_config(dir + "/config.json");
  const Checkpoint ckpt(dir);
  auto ops = make_cpu_ops();
  auto comm = make_single_comm();
  Model model(cfg, Mapping::make(1, 1, 0), *ops, *comm, ckpt);
  const CacheSize c = cache_size(cfg, model.mapping(), 16, 3, 100, 4, 4);
  model.allocate_caches(3, c.pages, 16);
  EXPECT_EQ(c.pages, 3 * 7);  // 100 tokens = 7 pages of 16
  EXPECT_EQ(c.kda_state_bytes, 3 * model.kda_state_bytes_per_slot());
  EXPECT_EQ(c.kv_pool_bytes, c.pages * 16 * cfg.num_mla_layers() * cfg.mla_cache_dim() * 4);
}

TEST(MemoryPlan, OverflowAndPageIdLimitsAreErrors) {
  const ModelConfig cfg = load_model_config(kConfigs + "/kimi-linear-48b-a3b.json");
  const Mapping m = Mapping::make(1, 1, 0);
  EXPECT_NE(error_of([&] { cache_size(cfg, m, 64, 2147483647, 66, 4, 4); }).find("page ids are int32"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              pages_per_rank(Placement{1, 1}, int64_t{1} << 40, int64_t{1} << 40);
            }).find("MLA pages per rank: 1099511627776 x 1099511627776 overflows"),
            std::string::npos);
  const StateBytes s = state_bytes(cfg, m, 2, 2);
  EXPECT_NE(error_of([&] {
              kv_bytes_at(s, Placement{64, 1}, 0, INT64_MAX);
            }).find("overflows"),
            std::string::npos);
}

TEST(MemoryPlan, CheckCacheFitsNamesOptionsNeedAndAvailable) {
  CacheSize need;
  need.pages = 10;
  need.kv_pool_bytes = int64_t{3} << 30;
  need.kda_state_bytes = int64_t{1} << 30;
  EXPECT_NO_THROW(
      check_cache_fits(need, int64_t{4} << 30, "host memory", "8 sequences (--batch)", "lower --batch"));
  const std::string e = error_of([&] {
    check_cache_fits(need, int64_t{2} << 30, "host memory", "8 sequences (--batch)", "lower --batch");
  });
  EXPECT_NE(e.find("the caches for 8 sequences (--batch) need 4.00 GiB"), std::string::npos) << e;
  EXPECT_NE(e.find("MLA page pool 3.00 GiB: 10 pages; KDA state 1.00 GiB"), std::string::npos) << e;
  EXPECT_NE(e.find("host memory has 2.00 GiB available; lower --batch"), std::string::npos) << e;
}

TEST(MemoryPlan, DecodeFloorCountsK3ExpertsAtTheLatentWidth) {
  const ModelConfig cfg = load_model_config(kConfigs + "/kimi-k3.json");
  ASSERT_GT(cfg.moe_latent_size, 0);
  ASSERT_NE(cfg.moe_latent_size, cfg.hidden_size);
  ASSERT_TRUE(cfg.mxfp4_experts);
  const Mapping m = Mapping::make(1, 16, 0);
  // Held as the CPU backend holds them: floats in fp32, the MXFP4 experts packed.
  const StoredDType held = [](const WeightSpec& s) {
    return s.typical_dtype == DType::kU8 ? DType::kU8 : DType::kF32;
  };
  const RankWeightBytes w = rank_weight_bytes(weight_layout(cfg), m, held);
  const auto cat = [&](WeightCategory c) {
    return static_cast<double>(w.by_category[static_cast<size_t>(c)]);
  };
  const double dense = static_cast<double>(w.total) - cat(WeightCategory::kRoutedExperts) -
                       cat(WeightCategory::kEmbedding) + 4.0 * static_cast<double>(cfg.hidden_size);
  // Batch 1 on one of 16 EP ranks: k / 16 of the experts a token touches, each three I x latent matrices in
  // e2m1 codes (half a byte per weight) plus one scale byte per 32 weights.
  const double expert =
      3.0 * static_cast<double>(cfg.moe_intermediate_size * cfg.moe_latent_size) * (0.5 + 1.0 / 32);
  const double experts = cfg.num_moe_layers() * (static_cast<double>(cfg.experts_per_token) / 16.0) * expert;
  const StateBytes s = state_bytes(cfg, m, 4, 4);
  const int64_t context = 4096;
  const double kv = static_cast<double>(Placement{64, 16}.local_len(context, 0) * s.kv_per_token);
  const double state = 2.0 * static_cast<double>(s.kda_recurrent + s.kda_conv);
  const StepBytes b = decode_step_bytes(cfg, m, context, 1, 64, held, 4, 4);
  EXPECT_NEAR(b.weights, dense + experts, 1e-6 * (dense + experts));
  EXPECT_DOUBLE_EQ(b.kv, kv);
  EXPECT_DOUBLE_EQ(b.state, state);
}

// bench --layer-split rates each section against its own bytes: together they must be the step's floor
// less the per-layer norms and AttnRes vectors, with the KV in MLA and the state in KDA.
TEST(MemoryPlan, StepSectionsSplitTheFloor) {
  for (const char* name : {"kimi-linear-48b-a3b.json", "kimi-k3.json"}) {
    const ModelConfig cfg = load_model_config(kConfigs + "/" + name);
    for (const Mapping& m : {Mapping::make(1, 1, 0), Mapping::make(2, 4, 5)}) {
      const StoredDType held = [](const WeightSpec& s) { return s.typical_dtype; };
      const RankWeightBytes w = rank_weight_bytes(weight_layout(cfg), m, held);
      const auto cat = [&](WeightCategory c) {
        return static_cast<double>(w.by_category[static_cast<size_t>(c)]);
      };
      for (int64_t batch : {1, 8}) {
        const StepBytes b = decode_step_bytes(cfg, m, 131072, batch, 64, held, 2, 2);
        const auto section = [&](StepSection x) { return b.section[static_cast<size_t>(x)]; };
        double sum = 0;
        for (double x : b.section) sum += x;
        const double expected = b.total() - cat(WeightCategory::kNorm) - cat(WeightCategory::kAttnRes);
        EXPECT_NEAR(sum, expected, 1e-9 * expected) << name << " batch " << batch;
        EXPECT_DOUBLE_EQ(section(StepSection::kMlaAttention), cat(WeightCategory::kMla) + b.kv) << name;
        EXPECT_DOUBLE_EQ(section(StepSection::kKdaAttention), cat(WeightCategory::kKda) + b.state) << name;
        EXPECT_DOUBLE_EQ(section(StepSection::kHead), cat(WeightCategory::kLmHead)) << name;
        EXPECT_GT(section(StepSection::kMoeFfn), cat(WeightCategory::kRouter)) << name;
      }
    }
  }
}

}  // namespace
}  // namespace hlm
