// Loading a K3 checkpoint: MXFP4 experts dequantized per rank, the zero padding of A_log checked, the
// vision tower skipped, and malformed K3 tensors refused with the tensor named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/model.h"
#include "model/weight_source.h"
#include "ops/cpu/cpu_ops.h"
#include "weights/mxfp4.h"

namespace hlm {
namespace {

namespace fs = std::filesystem;
const std::string kK3 = std::string(HLM_FIXTURES_DIR) + "/k3-tiny";

TEST(K3Loading, ExpertsAreDequantizedFromTheirOwnerRanksBoxes) {
  const ModelConfig cfg = load_model_config(kK3 + "/config.json");
  ASSERT_TRUE(cfg.mxfp4_experts);
  const Checkpoint ckpt(kK3);
  const std::string name = "language_model.model.layers.1.block_sparse_moe.experts.5.w2";
  const Tensor whole = dequantize_mxfp4(ckpt.read_raw(name + ".weight_packed", {32, 16}),
                                        ckpt.read_raw(name + ".weight_scale", {32, 1}), name);
  // moe_tp 1: expert 5 lives on the EP rank that owns it, whole.
  for (int r = 0; r < 4; ++r) {
    WeightReader w(ckpt, cfg, Mapping::make(1, 4, r));
    EXPECT_EQ(w.holds("layers.1.moe.experts.5.w2.packed"), r == 1);
  }
  WeightReader owner(ckpt, cfg, Mapping::make(1, 4, 1));
  const Tensor mine = dequantize_mxfp4(owner.read_raw("layers.1.moe.experts.5.w2.packed"),
                                       owner.read_raw("layers.1.moe.experts.5.w2.scale"), name);
  ASSERT_EQ(mine.shape(), whole.shape());
  for (int64_t i = 0; i < mine.numel(); ++i) ASSERT_EQ(mine.data<float>()[i], whole.data<float>()[i]);
}

TEST(K3Loading, VisionTowerIsNotPartOfTheModel) {
  const ModelConfig cfg = load_model_config(kK3 + "/config.json");
  const Checkpoint ckpt(kK3);
  ASSERT_TRUE(ckpt.has("vision_tower.patch_embed.weight"));
  for (const WeightSpec& s : weight_layout(cfg)) {
    EXPECT_EQ(s.name.rfind("language_model.", 0), 0u) << s.name;
  }
}

TEST(K3Loading, MisshapedPackedExpertsNameTheTensor) {
  ModelConfig cfg = load_model_config(kK3 + "/config.json");
  cfg.moe_intermediate_size = 64;  // the checkpoint's packed experts are [32, 16]
  const Checkpoint ckpt(kK3);
  try {
    WeightReader w(ckpt, cfg, Mapping::make(1, 1, 0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_packed"), std::string::npos) << e.what();
  }
}

TEST(K3Loading, NonZeroALogPaddingIsALoadError) {
  // A copy of the fixture whose first KDA layer has a non-zero A_log entry past its 8 heads.
  const fs::path dir = fs::path(HLM_SCRATCH_DIR) / "k3-bad-alog";
  fs::create_directories(dir);
  fs::copy_file(kK3 + "/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  fs::copy_file(kK3 + "/model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
  const std::string name = "language_model.model.layers.0.self_attn.A_log";
  const size_t offset = SafetensorsFile((dir / "model.safetensors").string()).tensors().at(name).data_begin;
  std::ifstream in(dir / "model.safetensors", std::ios::binary);
  uint64_t header = 0;
  in.read(reinterpret_cast<char*>(&header), 8);
  in.close();
  std::fstream out(dir / "model.safetensors", std::ios::binary | std::ios::in | std::ios::out);
  out.seekp(static_cast<std::streamoff>(8 + header + offset + 10 * sizeof(float)));  // entry 10 of 128
  const float poison = 0.5f;
  out.write(reinterpret_cast<const char*>(&poison), sizeof(poison));
  out.close();

  const ModelConfig cfg = load_model_config((dir / "config.json").string());
  const Checkpoint ckpt(dir.string());
  auto ops = make_cpu_ops();
  auto comm = make_single_comm();
  try {
    Model model(cfg, Mapping::make(1, 1, 0), *ops, *comm, ckpt);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("padding entry 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hlm
