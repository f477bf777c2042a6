// FusedProjection against the projections it stacks, on the CPU reference with a fixture checkpoint: every
// part equals its own GEMM, for one row (the stacked GEMM, parts as column views), a decode batch (the
// stacked GEMM, parts copied out) and a prefill-sized batch (a GEMM per part on the stacked rows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/fused_projection.h"
#include "model/weight_source.h"
#include "ops/cpu/cpu_ops.h"

namespace hlm {
namespace {

const std::string kKimi = std::string(HLM_FIXTURES_DIR) + "/kimi-tiny-realistic";

// The fixture's config, checkpoint and CPU ops.
struct Fixture {
  ModelConfig cfg = load_model_config(kKimi + "/config.json");
  Checkpoint ckpt{kKimi};
  std::unique_ptr<Ops> ops = make_cpu_ops();

  // "layers.L.kda." of the first KDA layer.
  std::string kda_prefix(const WeightSource& w) const {
    int layer = 0;
    while (!w.has("layers." + std::to_string(layer) + ".kda.q_proj")) ++layer;
    return "layers." + std::to_string(layer) + ".kda.";
  }
};

double max_rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double worst = 0.0, scale = 1e-30;
  for (int64_t i = 0; i < a.numel(); ++i) scale = std::max(scale, std::abs(double{b.data<float>()[i]}));
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::abs(double{a.data<float>()[i]} - double{b.data<float>()[i]}) / scale);
  }
  return worst;
}

TEST(FusedProjection, EveryPartIsItsOwnGemmAtEveryRowCount) {
  const Fixture f;
  Ops& ops = *f.ops;
  WeightReader w(f.ckpt, f.cfg, Mapping::make(1, 1, 0), f.ops.get());
  const std::string k = f.kda_prefix(w);
  const std::vector<std::string> keys = {k + "q_proj", k + "k_proj", k + "v_proj",
                                         k + "f_a",    k + "g_a",    k + "b_proj"};
  const FusedProjection proj(
      ops, w, {{keys[0], true}, {keys[1], true}, {keys[2], true}, {keys[3]}, {keys[4]}, {keys[5]}},
      f.cfg.hidden_size);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t rows : {int64_t{1}, int64_t{5}, FusedProjection::kFusedMaxRows,
                       FusedProjection::kFusedMaxRows + 1, int64_t{40}}) {
    Tensor x = Tensor::empty({rows, f.cfg.hidden_size}, DType::kF32);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
    const Tensor out = proj.forward(ops, x);
    EXPECT_EQ(out.defined(), rows <= FusedProjection::kFusedMaxRows) << rows << " rows";
    std::vector<Tensor> own;
    for (size_t i = 0; i < keys.size(); ++i) {
      const Tensor wi = w.load(keys[i]);
      own.push_back(ops.linear(x, wi.reshape({wi.numel() / f.cfg.hidden_size, f.cfg.hidden_size})));
      EXPECT_EQ(proj.rows(i), own.back().dim(1)) << keys[i];
      EXPECT_LE(max_rel_diff(proj.part(ops, x, out, i), own.back()), 1e-5)
          << keys[i] << ", " << rows << " rows";
    }
    const Tensor qkv = ops.concat_last(ops.concat_last(own[0], own[1]), own[2]);
    EXPECT_LE(max_rel_diff(proj.parts(ops, x, out, 0, 2), qkv), 1e-5) << "q|k|v, " << rows << " rows";
  }
}

// A weight whose shard is not [rows, hidden] is refused, naming the tensor.
TEST(FusedProjection, ShardsThatAreNotRowsOfTheHiddenSizeAreRefused) {
  const Fixture f;
  Ops& ops = *f.ops;
  WeightReader w(f.ckpt, f.cfg, Mapping::make(1, 1, 0), f.ops.get());
  const std::string k = f.kda_prefix(w);
  try {
    FusedProjection(ops, w, {{k + "f_a"}, {k + "b_proj"}}, f.cfg.hidden_size + 1);
    FAIL() << "a hidden size the shards do not have was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f_a"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hlm
