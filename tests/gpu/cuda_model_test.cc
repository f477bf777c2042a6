// Every fixture end to end through the CUDA backend against the transformers / K3-reference goldens
// (DESIGN.md "Numerics", issue 7): relative L2 error of each prompt's logits <= 2e-2, through one prefill
// and through the decode path, and greedy ids equal up to the first position where the reference's top-2
// margin is below 0.1. Decode steps replayed as CUDA graphs must give what eager decode steps give, and the
// scheduler's host-logits paths (scored prompts, adjusted logits) work on the device.
//
// The loud fixtures (weights with std 0.2, made so that formula errors show in fp32) amplify bf16 rounding:
// the reference itself run in bf16 lies 0.05-0.26 (relative L2) from its fp32 logits and moves single logits
// by up to 6 (tools/bf16_reference.py writes these per prompt to bf16_reference.json), so 2e-2 is out of
// reach of any bf16 implementation there. The bound is therefore the larger of 2e-2 and twice the
// reference's own bf16 error (ours and the reference's are two independent bf16 roundings of a chaotic
// computation, each at about that distance from fp32; a wrong formula lands near 1), and greedy ids are
// compared only where the top-2 margin exceeds the largest logit change bf16 causes in the reference. The
// realistic fixtures (transformers' 0.02 init, reference bf16 error ~1e-2) carry the 2e-2 check itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "gpu_test_util.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"

namespace hlm::test {
namespace {

constexpr double kLogitRelL2 = 2e-2;
constexpr float kGreedyMargin = 0.1f;
constexpr double kOverReferenceBf16 = 2.0;
// Graph replay runs the same kernels on the same inputs as an eager step; only a split reduction could
// order its sums differently.
constexpr double kGraphRelL2 = 1e-5;

class CudaGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU: " << why;
    golden_ = load_golden_case(GetParam());
    comm_ = make_single_comm();
    // The -moonshot twin shares its base fixture's weights and references.
    std::ifstream in(golden_.model_dir + "/bf16_reference.json");
    if (!in)
      in = std::ifstream(golden_.model_dir.substr(0, golden_.model_dir.rfind("-moonshot")) +
                         "/bf16_reference.json");
    ASSERT_TRUE(in.good()) << "no bf16_reference.json for " << GetParam() << " (tools/bf16_reference.py)";
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& p : j.at("prompts")) {
      bound_.push_back(std::max(kLogitRelL2, kOverReferenceBf16 * p.at("rel_l2").get<double>()));
      margin_.push_back(std::max(kGreedyMargin, p.at("max_abs").get<float>()));
    }
    ASSERT_EQ(bound_.size(), golden_.prompts.size());
  }
  std::unique_ptr<Runner> runner(bool graphs, MlaPrefillForm mla_prefill = MlaPrefillForm::kAuto) {
    EngineOptions o;
    o.max_seq_len = 512;
    o.max_batch = 4;
    o.cuda_graphs = graphs;
    o.mla_prefill = mla_prefill;
    return std::make_unique<Runner>(golden_.model_dir, Mapping::make(1, 1, 0), *comm_, o, Device::kCuda);
  }
  void report(const std::string& what, size_t prompt, double err) {
    std::cout << "[cuda golden] " << GetParam() << " prompt " << prompt << " (len "
              << golden_.prompts[prompt].ids.size() << ") " << what << " rel L2 = " << err << " (bound "
              << bound_[prompt] << ")\n";
  }

  GoldenCase golden_;
  std::unique_ptr<Comm> comm_;
  std::vector<double> bound_;  // per prompt: allowed relative L2 error of the logits
  std::vector<float> margin_;  // per prompt: top-2 margin above which greedy ids must agree
};

TEST_P(CudaGolden, LogitsMatchReferenceThroughPrefillAndDecode) {
  auto r = runner(false);
  for (size_t i = 0; i < golden_.prompts.size(); ++i) {
    const GoldenPrompt& p = golden_.prompts[i];
    const std::vector<int32_t> ids = p.full_sequence();
    const double prefill =
        rel_l2(sequence_logits(r->engine(), 1, ids, static_cast<int64_t>(ids.size())), p.logits);
    const double decode =
        rel_l2(sequence_logits(r->engine(), 2, ids, static_cast<int64_t>(p.ids.size())), p.logits);
    report("prefill", i, prefill);
    report("prefill prompt + decode", i, decode);
    EXPECT_LE(prefill, bound_[i]) << "prompt " << i;
    EXPECT_LE(decode, bound_[i]) << "prompt " << i;
  }
}

// Each MLA prefill form, forced, against the reference (auto picks one per step by its cost model).
TEST_P(CudaGolden, BothMlaPrefillFormsMatchReference) {
  for (const auto& [form, name] :
       {std::pair{MlaPrefillForm::kAbsorbed, "absorbed"}, std::pair{MlaPrefillForm::kExpanded, "expanded"}}) {
    auto r = runner(false, form);
    for (size_t i = 0; i < golden_.prompts.size(); ++i) {
      const GoldenPrompt& p = golden_.prompts[i];
      const std::vector<int32_t> ids = p.full_sequence();
      const double err =
          rel_l2(sequence_logits(r->engine(), 1, ids, static_cast<int64_t>(ids.size())), p.logits);
      report(std::string(name) + " MLA prefill", i, err);
      EXPECT_LE(err, bound_[i]) << name << " prompt " << i;
    }
  }
}

// All prompts in one step: the longest (150 tokens) runs the expanded form, the others the absorbed one,
// beside each other in the same layers.
TEST_P(CudaGolden, StepMixingBothMlaFormsMatchesReference) {
  auto r = runner(false);
  StepPlan plan;
  for (size_t i = 0; i < golden_.prompts.size(); ++i) {
    plan.entries.push_back(StepEntry{20 + static_cast<int64_t>(i), true, true, golden_.prompts[i].ids});
  }
  const std::vector<Tensor> got = r->engine().step(plan);
  ASSERT_EQ(got.size(), golden_.prompts.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const GoldenPrompt& p = golden_.prompts[i];
    const double err = rel_l2(got[i], rows(p.logits, 0, static_cast<int64_t>(p.ids.size())));
    report("one step with every prompt", i, err);
    EXPECT_LE(err, bound_[i]) << "prompt " << i;
  }
}

TEST_P(CudaGolden, GreedyIdsMatchReference) {
  auto r = runner(true);
  std::vector<std::vector<int32_t>> prompts;
  for (const GoldenPrompt& p : golden_.prompts) prompts.push_back(p.ids);
  GenerateOptions o;
  o.max_new_tokens = static_cast<int64_t>(golden_.prompts[0].greedy.size());
  o.stop_at_eos = false;
  o.step_tokens = 48;  // mixed ragged steps, then decode steps of 3 sequences through the batch-4 graph
  const std::vector<Generation> got = generate(r->engine(), prompts, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GoldenPrompt& p = golden_.prompts[i];
    const int64_t vocab = p.logits.dim(1);
    ASSERT_EQ(got[i].error, "") << "prompt " << i;
    ASSERT_EQ(got[i].ids.size(), p.greedy.size());
    size_t checked = 0;
    for (size_t j = 0; j < p.greedy.size(); ++j) {
      const float* row = p.logits.data<float>() + (p.ids.size() - 1 + j) * vocab;
      if (top2_margin(row, vocab) < margin_[i]) break;  // beyond here bf16 may legitimately flip
      ASSERT_EQ(got[i].ids[j], p.greedy[j]) << "prompt " << i << " position " << j;
      ++checked;
    }
    std::cout << "[cuda golden] " << GetParam() << " prompt " << i << ": " << checked << " of "
              << p.greedy.size() << " greedy ids checked (margin >= " << margin_[i] << ")\n";
  }
}

// The scheduler's host-logits paths on the device: a scored prompt (the server's echo with logprobs) gets
// the reference's log-probabilities within the prompt's logit bound, position for position, while another
// sequence decodes beside it through the device sampler; and a +100 logit_bias decides a greedy draw.
TEST_P(CudaGolden, SchedulerScoresPromptsAndAdjustsLogitsOnTheHost) {
  auto r = runner(true);
  Scheduler s(r->engine(), SchedulerOptions{2, 96});
  const size_t last = golden_.prompts.size() - 1;
  const GoldenPrompt& p = golden_.prompts[last];
  SeqRequest scored;
  scored.prompt = p.ids;
  scored.max_new_tokens = 1;
  scored.stop_at_eos = false;
  scored.prompt_logprobs = 0;
  s.add(0, scored);
  SeqRequest steered;
  steered.prompt = golden_.prompts[0].ids;
  steered.max_new_tokens = 3;
  steered.stop_at_eos = false;
  const int32_t forced = golden_.prompts[0].greedy[0] == 7 ? 8 : 7;
  steered.adjust.logit_bias = {{forced, 100.0f}};
  s.add(1, steered);
  std::vector<SampledToken> got;
  std::vector<int32_t> steered_ids;
  while (s.has_work()) {
    for (SeqOutput& o : s.step()) {
      ASSERT_TRUE(o.token) << o.error;
      if (o.id == 0) got = std::move(o.prompt_logprobs);
      if (o.id == 1) steered_ids.push_back(o.token->id);
    }
  }
  EXPECT_EQ(steered_ids, std::vector<int32_t>(3, forced));
  ASSERT_EQ(got.size(), p.ids.size() - 1);
  std::vector<float> ours, reference;
  for (size_t i = 0; i + 1 < p.ids.size(); ++i) {
    ASSERT_EQ(got[i].id, p.ids[i + 1]) << "position " << i + 1;
    ours.push_back(got[i].logprob);
    reference.push_back(token_logprobs(p.logits[static_cast<int64_t>(i)], p.ids[i + 1], 0).logprob);
  }
  const auto n = static_cast<int64_t>(ours.size());
  const double err = rel_l2(Tensor::from_vector({n}, ours), Tensor::from_vector({n}, reference));
  report("scheduler prompt log-probabilities", last, err);
  EXPECT_LE(err, bound_[last]);
}

TEST_P(CudaGolden, GraphDecodeEqualsEagerDecode) {
  auto eager = runner(false);
  auto graphs = runner(true);
  const GoldenPrompt& p = golden_.prompts.back();
  const std::vector<int32_t> ids = p.full_sequence();
  const auto prompt = static_cast<int64_t>(p.ids.size());
  const Tensor a = sequence_logits(eager->engine(), 1, ids, prompt);
  const Tensor b = sequence_logits(graphs->engine(), 1, ids, prompt);
  const double err = rel_l2(rows(b, prompt, b.dim(0)), rows(a, prompt, a.dim(0)));
  std::cout << "[cuda golden] " << GetParam() << " graph vs eager decode rel L2 = " << err << "\n";
  EXPECT_LE(err, kGraphRelL2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden, ::testing::ValuesIn(golden_case_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace hlm::test
