// The shard plan: the published 48B model's exact parameter and tensor counts, boxes that tile every
// split tensor exactly once across the ranks, and a loader test that each rank reads its own slice
// chosen by r' (TensorRT-LLM PR #17796 shipped a loader where every rank read shard 0).
#include "model/weight_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "model/memory_plan.h"
#include "model/weight_source.h"

namespace hlm {
namespace {

namespace fs = std::filesystem;

const std::string kConfigs = std::string(HLM_FIXTURES_DIR) + "/configs";
const std::string kTiny = std::string(HLM_FIXTURES_DIR) + "/kimi-tiny-dense-first";

TEST(WeightLayout, Kimi48BParameterAndTensorCounts) {
  const ModelConfig cfg = load_model_config(kConfigs + "/kimi-linear-48b-a3b.json");
  EXPECT_EQ(parameter_count(cfg), 49122681728);  // docs/MODEL.md §1
  std::set<std::string> names;
  for (const WeightSpec& s : weight_layout(cfg)) names.insert(s.name);
  EXPECT_EQ(names.size(), 20493u);  // docs/MODEL.md §3
}

// Every element of every tensor is held by exactly the ranks its split says: once per replica group.
TEST(WeightLayout, BoxesTileEveryTensor) {
  const ModelConfig cfg = load_model_config(kTiny + "/config.json");
  for (auto [tp, cp] :
       {std::pair{1, 1}, std::pair{1, 4}, std::pair{2, 2}, std::pair{4, 2}, std::pair{1, 8}}) {
    const int n = tp * cp;
    std::map<std::string, int64_t> held;  // logical key -> elements summed over ranks
    for (int r = 0; r < n; ++r) {
      const Mapping m = Mapping::make(tp, cp, r);
      for (const WeightSpec& s : weight_layout(cfg)) {
        if (auto box = rank_box(s, m)) held[s.key] += box_numel(s, *box);
      }
    }
    for (const WeightSpec& s : weight_layout(cfg)) {
      int64_t whole = shape_numel(s.shape);
      for (const auto& [dim, range] : s.fixed) whole = whole / (s.view[dim]) * (range.second - range.first);
      int64_t copies = 1;
      if (s.by == ShardBy::kNone && s.expert < 0) copies = n;  // replicated
      if (s.by == ShardBy::kTp) copies = cp;                   // the same tp shard on every cp peer
      EXPECT_EQ(held[s.key], whole * copies) << s.key << " at tp " << tp << " cp " << cp;
    }
  }
}

TEST(WeightLayout, EachRankReadsTheSliceOfItsRepurposedRank) {
  const ModelConfig cfg = load_model_config(kTiny + "/config.json");
  const Checkpoint ckpt(kTiny);
  const Mapping one = Mapping::make(1, 1, 0);
  WeightReader full_reader(ckpt, cfg, one);
  const Tensor gate = full_reader.read("layers.0.mlp.gate_proj");  // [128, 64], dense MLP of layer 0
  const Tensor uv = full_reader.read("layers.2.mla.w_uv");         // [8, 16, 32]
  for (auto [tp, cp] : {std::pair{1, 4}, std::pair{2, 2}, std::pair{4, 1}}) {
    for (int r = 0; r < tp * cp; ++r) {
      const Mapping m = Mapping::make(tp, cp, r);
      WeightReader reader(ckpt, cfg, m);
      const Tensor shard = reader.read("layers.0.mlp.gate_proj");
      const Range rows = m.mlp_rows(cfg.intermediate_size);
      ASSERT_EQ(shard.dim(0), rows.size());
      for (int64_t i = 0; i < shard.numel(); ++i) {
        ASSERT_EQ(shard.data<float>()[i], gate.data<float>()[rows.begin * cfg.hidden_size + i])
            << "rank " << r;
      }
      const Tensor uv_shard = reader.read("layers.2.mla.w_uv");
      const Range heads = m.mla_chunk_heads(cfg.mla_heads);
      const int64_t per_head = uv.numel() / uv.dim(0);
      for (int64_t i = 0; i < uv_shard.numel(); ++i) {
        ASSERT_EQ(uv_shard.data<float>()[i], uv.data<float>()[heads.begin * per_head + i]) << "rank " << r;
      }
    }
  }
}

TEST(WeightLayout, ExpertsAreReadOnlyByTheirOwner) {
  const ModelConfig cfg = load_model_config(kTiny + "/config.json");
  const Checkpoint ckpt(kTiny);
  for (int r = 0; r < 4; ++r) {
    const Mapping m = Mapping::make(1, 4, r);
    WeightReader reader(ckpt, cfg, m);
    const Range mine = m.experts(cfg.num_experts);
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      EXPECT_EQ(reader.holds("layers.1.moe.experts." + std::to_string(e) + ".w1"),
                e >= mine.begin && e < mine.end);
    }
  }
}

TEST(WeightLayout, MissingOrMisshapedTensorsNameTheTensor) {
  ModelConfig cfg = load_model_config(kTiny + "/config.json");
  cfg.kda_head_dim = 8;  // the checkpoint's KDA tensors no longer match
  const Checkpoint ckpt(kTiny);
  try {
    WeightReader reader(ckpt, cfg, Mapping::make(1, 1, 0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected shape"), std::string::npos) << e.what();
  }
}

// A copy of the one-file checkpoint `src` under the scratch directory where tensor `name` is stored as
// `dtype` (`elem_size` bytes per element), its bytes cut or zero-padded to that size and every offset
// moved to match: a consistent file whose only fault is that dtype.
std::string with_dtype(const std::string& src, const std::string& name, const std::string& dtype,
                       size_t elem_size) {
  const fs::path dir = fs::path(HLM_SCRATCH_DIR) / ("dtype-" + name + "-" + dtype);
  fs::create_directories(dir);
  fs::copy_file(src + "/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  std::ifstream in(src + "/model.safetensors", std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  const std::string data = bytes.substr(8 + n);
  std::string out_data;
  for (auto& [tensor, entry] : header.items()) {
    if (tensor == "__metadata__") continue;
    const auto offsets = entry["data_offsets"].get<std::vector<size_t>>();
    std::string blob = data.substr(offsets[0], offsets[1] - offsets[0]);
    if (tensor == name) {
      entry["dtype"] = dtype;
      blob.resize(shape_numel(entry["shape"].get<Shape>()) * elem_size, '\0');
    }
    entry["data_offsets"] = {out_data.size(), out_data.size() + blob.size()};
    out_data += blob;
  }
  const std::string text = header.dump();
  const uint64_t len = text.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << text << out_data;
  return dir.string();
}

std::string load_error(const std::string& dir) {
  const ModelConfig cfg = load_model_config(dir + "/config.json");
  const Checkpoint ckpt(dir);
  try {
    WeightReader reader(ckpt, cfg, Mapping::make(1, 1, 0));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Regression: a weight stored as integers of the right byte size loaded, and the first step failed in an
// op naming no tensor ("moe_route: w must be F32[E, D], got I32[16, 64]"). The loader now refuses it
// from the header, naming the tensor, its file and the valid dtypes.
TEST(WeightLayout, WrongDtypeClassIsALoadErrorNamingTheTensor) {
  const std::string kK3 = std::string(HLM_FIXTURES_DIR) + "/k3-tiny";
  const std::string gate = "model.layers.1.block_sparse_moe.gate.weight";
  std::string dir = with_dtype(kTiny, gate, "I32", 4);
  EXPECT_EQ(load_error(dir),
            "tensor '" + gate + "' in " + dir +
                "/model.safetensors: stored as I32, but it is a float weight; valid: F32, F16 "
                "or BF16");
  dir = with_dtype(kTiny, "lm_head.weight", "U8", 1);
  EXPECT_NE(load_error(dir).find("tensor 'lm_head.weight' in " + dir + "/model.safetensors: stored as U8"),
            std::string::npos);
  dir = with_dtype(kTiny, "model.layers.0.self_attn.dt_bias", "I64", 8);
  EXPECT_NE(load_error(dir).find("dt_bias' in " + dir + "/model.safetensors: stored as I64"),
            std::string::npos);
  // MXFP4 codes and scales are bytes: a float there is as wrong as an integer elsewhere.
  const std::string scale = "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight_scale";
  dir = with_dtype(kK3, scale, "BF16", 2);
  EXPECT_EQ(load_error(dir), "tensor '" + scale + "' in " + dir +
                                 "/model.safetensors: stored as BF16, but it holds MXFP4 expert scales (the "
                                 "quantization_config of " +
                                 dir + "/config.json); valid: U8");
  // Every float dtype the loader converts from is accepted, for any float weight.
  EXPECT_EQ(load_error(with_dtype(kTiny, "lm_head.weight", "F16", 2)), "");
  EXPECT_EQ(load_error(with_dtype(kTiny, gate, "BF16", 2)), "");
  EXPECT_EQ(load_error(kK3), "");
}

}  // namespace
}  // namespace hlm
