// Golden tests: the single-rank CPU engine against transformers' kimi_linear (tools/make_golden.py) on
// every fixture and prompt. Tolerances are those of docs (DESIGN.md "Numerics"): max |Δlogit| <= 1e-3,
// greedy ids equal up to the first position where the reference's top-2 margin is below 1e-3. Each test
// prints its measured error so the figures in docs/benchmarks.md can be rerun.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "fixtures.h"
#include "runtime/generate.h"

namespace hlm::test {
namespace {

constexpr float kLogitTolerance = 1e-3f;
constexpr float kGreedyMargin = 1e-3f;
// Chunked and one-shot prefill are the same math with different summation orders.
constexpr float kChunkingTolerance = 1e-4f;

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    golden_ = load_golden_case(GetParam());
    comm_ = make_single_comm();
    runner_ = std::make_unique<Runner>(golden_.model_dir, Mapping::make(1, 1, 0), *comm_);
  }
  void report(const std::string& what, size_t prompt, float err) {
    std::cout << "[golden] " << GetParam() << " prompt " << prompt << " (len "
              << golden_.prompts[prompt].ids.size() << ") " << what << " max|dlogit| = " << err << "\n";
  }

  GoldenCase golden_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Runner> runner_;
};

TEST_P(Golden, PrefillLogitsMatchReference) {
  for (size_t i = 0; i < golden_.prompts.size(); ++i) {
    const GoldenPrompt& p = golden_.prompts[i];
    const std::vector<int32_t> ids = p.full_sequence();
    Tensor got = sequence_logits(runner_->engine(), 1, ids, static_cast<int64_t>(ids.size()));
    const float err = max_abs_diff(got, p.logits);
    report("prefill", i, err);
    EXPECT_LE(err, kLogitTolerance) << "prompt " << i;
  }
}

// Each MLA prefill form, forced, against the reference and against the other (auto, above, picks one
// per step by its cost model).
TEST_P(Golden, BothMlaPrefillFormsMatchReference) {
  std::vector<Tensor> forms;
  for (const MlaPrefillForm form : {MlaPrefillForm::kAbsorbed, MlaPrefillForm::kExpanded}) {
    EngineOptions o;
    o.mla_prefill = form;
    Runner runner(golden_.model_dir, Mapping::make(1, 1, 0), *comm_, o);
    const std::vector<int32_t> ids = golden_.prompts.back().full_sequence();
    forms.push_back(sequence_logits(runner.engine(), 1, ids, static_cast<int64_t>(ids.size())));
    const float err = max_abs_diff(forms.back(), golden_.prompts.back().logits);
    report(form == MlaPrefillForm::kAbsorbed ? "absorbed MLA prefill" : "expanded MLA prefill",
           golden_.prompts.size() - 1, err);
    EXPECT_LE(err, kLogitTolerance);
  }
  EXPECT_LE(max_abs_diff(forms[0], forms[1]), kChunkingTolerance);
}

// One step holding a long prompt (150 tokens: the cost model runs it expanded, break-even near 90
// queries per key) beside a one-token prompt and a 37-token one (absorbed): each sequence's logits equal
// its own run alone.
TEST_P(Golden, StepMixingBothMlaFormsEqualsEachSequenceAlone) {
  std::vector<Tensor> solo;
  StepPlan plan;
  for (size_t i = 0; i < golden_.prompts.size(); ++i) {
    const std::vector<int32_t>& ids = golden_.prompts[i].ids;
    solo.push_back(sequence_logits(runner_->engine(), 1, ids, static_cast<int64_t>(ids.size())));
    plan.entries.push_back(StepEntry{20 + static_cast<int64_t>(i), true, true, ids});
  }
  const std::vector<Tensor> mixed = runner_->engine().step(plan);
  ASSERT_EQ(mixed.size(), solo.size());
  for (size_t i = 0; i < solo.size(); ++i) {
    EXPECT_LE(max_abs_diff(mixed[i], solo[i]), kChunkingTolerance) << "prompt " << i;
  }
}

TEST_P(Golden, DecodePathLogitsMatchReference) {
  for (size_t i = 0; i < golden_.prompts.size(); ++i) {
    const GoldenPrompt& p = golden_.prompts[i];
    const std::vector<int32_t> ids = p.full_sequence();
    Tensor got = sequence_logits(runner_->engine(), 1, ids, static_cast<int64_t>(p.ids.size()));
    const float err = max_abs_diff(got, p.logits);
    report("prefill prompt + decode", i, err);
    EXPECT_LE(err, kLogitTolerance) << "prompt " << i;
  }
}

TEST_P(Golden, EveryTokenThroughDecodeMatchesReference) {
  const GoldenPrompt& p = golden_.prompts.back();
  const std::vector<int32_t> ids = p.full_sequence();
  Tensor got = sequence_logits(runner_->engine(), 1, ids, 0);
  const float err = max_abs_diff(got, p.logits);
  report("decode only", golden_.prompts.size() - 1, err);
  EXPECT_LE(err, kLogitTolerance);
}

TEST_P(Golden, ChunkedPrefillEqualsOneShot) {
  const GoldenPrompt& p = golden_.prompts.back();
  const std::vector<int32_t> ids = p.full_sequence();
  const auto len = static_cast<int64_t>(ids.size());
  Tensor one_shot = sequence_logits(runner_->engine(), 1, ids, len);
  for (int64_t chunk : {1, 7, 64, 100}) {
    Tensor chunked = sequence_logits(runner_->engine(), 2, ids, len, chunk);
    EXPECT_LE(max_abs_diff(chunked, one_shot), kChunkingTolerance) << "chunk " << chunk;
    EXPECT_LE(max_abs_diff(chunked, p.logits), kLogitTolerance) << "chunk " << chunk;
  }
}

TEST_P(Golden, GreedyIdsMatchReference) {
  std::vector<std::vector<int32_t>> prompts;
  for (const GoldenPrompt& p : golden_.prompts) prompts.push_back(p.ids);
  GenerateOptions o;
  o.max_new_tokens = static_cast<int64_t>(golden_.prompts[0].greedy.size());
  o.stop_at_eos = false;
  o.step_tokens = 48;  // prompts prefill in chunks while others decode: mixed ragged steps
  const std::vector<Generation> gen = generate(runner_->engine(), prompts, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(gen[i].error, "") << "prompt " << i;
    const std::vector<int32_t>& got = gen[i].ids;
    const GoldenPrompt& p = golden_.prompts[i];
    const int64_t vocab = p.logits.dim(1);
    ASSERT_EQ(got.size(), p.greedy.size());
    for (size_t j = 0; j < p.greedy.size(); ++j) {
      const float* row = p.logits.data<float>() + (p.ids.size() - 1 + j) * vocab;
      if (top2_margin(row, vocab) < kGreedyMargin) break;  // beyond here the reference itself is ambiguous
      ASSERT_EQ(got[j], p.greedy[j]) << "prompt " << i << " position " << j;
    }
  }
}

TEST_P(Golden, MixedBatchEqualsEachSequenceAlone) {
  // Solo logits of every prompt + continuation.
  std::vector<std::vector<int32_t>> seqs;
  std::vector<Tensor> solo;
  for (const GoldenPrompt& p : golden_.prompts) {
    seqs.push_back(p.full_sequence());
    solo.push_back(sequence_logits(runner_->engine(), 1, seqs.back(), static_cast<int64_t>(p.ids.size())));
  }
  // All sequences in the same steps: each feeds its prompt in chunks of 16, then one token per step, so
  // most steps mix prefill chunks and decode tokens of different sequences.
  const int64_t n = static_cast<int64_t>(seqs.size());
  std::vector<int64_t> done(n, 0);
  std::vector<std::vector<Tensor>> got(n);
  for (;;) {
    StepPlan plan;
    std::vector<int64_t> members;
    for (int64_t s = 0; s < n; ++s) {
      const auto len = static_cast<int64_t>(seqs[s].size());
      if (done[s] == len) continue;
      const auto prompt = static_cast<int64_t>(golden_.prompts[s].ids.size());
      const int64_t take = done[s] < prompt ? std::min<int64_t>(16, prompt - done[s]) : 1;
      plan.entries.push_back(
          StepEntry{10 + s, done[s] == 0, true,
                    std::vector<int32_t>(seqs[s].begin() + done[s], seqs[s].begin() + done[s] + take)});
      members.push_back(s);
      done[s] += take;
    }
    if (plan.entries.empty()) break;
    std::vector<Tensor> out = runner_->engine().step(plan);
    for (size_t i = 0; i < members.size(); ++i) got[members[i]].push_back(out[i].clone());
  }
  for (int64_t s = 0; s < n; ++s) {
    int64_t row = 0;
    for (const Tensor& part : got[s]) {
      EXPECT_LE(max_abs_diff(part, rows(solo[s], row, row + part.dim(0))), kChunkingTolerance)
          << "sequence " << s << " rows from " << row;
      row += part.dim(0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(golden_case_names()), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

}  // namespace
}  // namespace hlm::test
