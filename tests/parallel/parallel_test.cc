// Helix parity under mpirun: every golden fixture run on tp·cp CPU ranks must reproduce the single-rank
// engine (logits within 1e-4, identical greedy ids) and transformers (1e-3). Started once per layout by
// CTest as `mpirun -np N parallel_test --tp T --cp C`. Rank 0 drives the engine and checks results; the
// other ranks serve the same steps. Per-rank checks (pages held = local_len, weight bytes read = plan,
// KDA state sized by the local heads) run on every rank, because each rank only knows its own state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "fixtures.h"
#include "helix_checks.h"
#include "parallel/layout_rules.h"
#include "runtime/generate.h"

namespace hlm::test {
namespace {

int g_tp = 1;
int g_cp = 1;
int g_moe_ep = 0;  // 0: the default split (EP over all ranks)
int g_moe_tp = 0;
std::unique_ptr<Comm> g_comm;

constexpr float kParityTolerance = 1e-4f;
constexpr float kGoldenTolerance = 1e-3f;
constexpr int64_t kPageSize = 16;  // small pages: prompts span many pages and every rank owns several

Mapping mapping() { return Mapping::make(g_tp, g_cp, g_comm->rank(), g_moe_ep, g_moe_tp); }

EngineOptions engine_options() {
  EngineOptions o;
  o.tokens_per_block = kPageSize;
  o.max_batch = 4;
  o.max_seq_len = 256;
  return o;
}

class Helix : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // A layout the model cannot take is refused by the CLI before loading (layout_rules tests); here
    // such a (fixture, layout) pair is skipped, e.g. MoE-TP shards of K3's MXFP4 experts narrower than
    // one 32-column scale group.
    const ModelConfig cfg =
        load_model_config(std::string(HLM_FIXTURES_DIR) + "/" + GetParam() + "/config.json");
    const std::vector<std::string> violations =
        layout_violations(cfg, LayoutRequest{g_tp, g_cp, g_moe_ep, g_moe_tp, kPageSize});
    if (!violations.empty()) GTEST_SKIP() << violations.front();
    golden_ = load_golden_case(GetParam());
    runner_ = std::make_unique<Runner>(golden_.model_dir, mapping(), *g_comm, engine_options());
  }
  bool driver() const { return g_comm->rank() == 0; }

  GoldenCase golden_;
  std::unique_ptr<Runner> runner_;
};

TEST_P(Helix, LogitsAndGreedyIdsMatchSingleRank) {
  Engine& engine = runner_->engine();
  if (!driver()) {
    engine.serve();
    return;
  }
  auto single_comm = make_single_comm();
  Runner single(golden_.model_dir, Mapping::make(1, 1, 0), *single_comm, engine_options());
  for (size_t i = 0; i < golden_.prompts.size(); ++i) {
    const GoldenPrompt& p = golden_.prompts[i];
    const std::vector<int32_t> ids = p.full_sequence();
    const auto prompt_len = static_cast<int64_t>(p.ids.size());
    // Prefill in chunks that straddle pages and ranks, then decode every continuation token.
    Tensor helix = sequence_logits(engine, 1, ids, prompt_len, 23);
    Tensor reference = sequence_logits(single.engine(), 1, ids, prompt_len, 23);
    const float parity = max_abs_diff(helix, reference);
    const float golden = max_abs_diff(helix, p.logits);
    std::cout << "[helix] tp " << g_tp << " cp " << g_cp << " moe_tp " << mapping().moe_tp << " "
              << GetParam() << " prompt " << i << " max|dlogit| vs single-rank = " << parity
              << ", vs transformers = " << golden << "\n";
    EXPECT_LE(parity, kParityTolerance) << "prompt " << i;
    EXPECT_LE(golden, kGoldenTolerance) << "prompt " << i;
  }
  std::vector<std::vector<int32_t>> prompts;
  for (const GoldenPrompt& p : golden_.prompts) prompts.push_back(p.ids);
  GenerateOptions o;
  o.max_new_tokens = 24;
  o.stop_at_eos = false;
  o.step_tokens = 40;
  EXPECT_EQ(generate(engine, prompts, o), generate(single.engine(), prompts, o));
  engine.stop();
}

TEST_P(Helix, EveryRankHoldsExactlyItsPages) {
  expect_each_rank_holds_its_pages(runner_->engine(), *g_comm, mapping(),
                                   golden_.prompts.back().full_sequence());
}

TEST_P(Helix, WeightBytesReadEqualPlan) {
  expect_weight_bytes_equal_plan(*runner_, golden_.model_dir, mapping());
}

TEST_P(Helix, WarmupLeavesLiveResultsUnchanged) {
  const GoldenPrompt& p = golden_.prompts.back();
  const std::vector<int32_t> ids = p.full_sequence();
  Runner warm(golden_.model_dir, mapping(), *g_comm, engine_options());
  warm.engine().warmup();  // every rank, collectively
  ASSERT_TRUE(warm.engine().warmed_up());
  std::vector<Tensor> logits;
  for (Engine* e : {&warm.engine(), &runner_->engine()}) {
    if (!driver()) {
      e->serve();
      continue;
    }
    logits.push_back(sequence_logits(*e, 3, ids, static_cast<int64_t>(p.ids.size()), 50));
    e->stop();
  }
  if (driver()) {
    EXPECT_EQ(max_abs_diff(logits[0], logits[1]), 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Helix, ::testing::ValuesIn(golden_case_names()), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

}  // namespace
}  // namespace hlm::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--tp") == 0) hlm::test::g_tp = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--cp") == 0) hlm::test::g_cp = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--moe-ep") == 0) hlm::test::g_moe_ep = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--moe-tp") == 0) hlm::test::g_moe_tp = std::atoi(argv[i + 1]);
  }
  int world = 1, rank = 0;
  hlm::mpi_world(&world, &rank);
  if (world != hlm::test::g_tp * hlm::test::g_cp) {
    std::cerr << "parallel_test: launched with " << world << " ranks for --tp " << hlm::test::g_tp << " --cp "
              << hlm::test::g_cp << "\n";
    return 2;
  }
  const hlm::Mapping m =
      hlm::Mapping::make(hlm::test::g_tp, hlm::test::g_cp, rank, hlm::test::g_moe_ep, hlm::test::g_moe_tp);
  hlm::test::g_comm = world > 1 ? hlm::make_mpi_comm(m) : hlm::make_single_comm();
  const int rc = RUN_ALL_TESTS();
  hlm::test::g_comm.reset();
  return rc;
}
