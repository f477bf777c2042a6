// The continuous-batching scheduler on a real tiny model: sequences batched with others (prompts split
// into chunks between other sequences' decode steps) give the reference's greedy ids; admission waits
// for a slot and for the pages of a sequence's whole length; cancelled and finished sequences give their
// slot and pages back at the next step; the token budget bounds every step; prompt log-probabilities are
// the reference's.
#include "runtime/scheduler.h"

#include <gtest/gtest.h>

#include <map>

#include "base/error.h"
#include "fixtures.h"

namespace hlm {
namespace {

using test::GoldenCase;
using test::GoldenPrompt;
using test::Runner;

class SchedulerTest : public ::testing::Test {
 protected:
  void make(EngineOptions eo) {
    golden_ = test::load_golden_case("kimi-tiny-dense-first");
    comm_ = make_single_comm();
    runner_ = std::make_unique<Runner>(golden_.model_dir, Mapping::make(1, 1, 0), *comm_, eo);
  }
  SeqRequest greedy(size_t prompt, int64_t n) const {
    SeqRequest r;
    r.prompt = golden_.prompts[prompt].ids;
    r.max_new_tokens = n;
    r.stop_at_eos = false;
    return r;
  }
  // Steps until idle; every output, in order.
  static std::vector<SeqOutput> run_all(Scheduler& s) {
    std::vector<SeqOutput> outs;
    while (s.has_work()) {
      for (SeqOutput& o : s.step()) outs.push_back(std::move(o));
    }
    return outs;
  }
  // Steps until idle; the ids each sequence produced.
  std::map<int64_t, std::vector<int32_t>> drain(Scheduler& s, int64_t* steps = nullptr) {
    std::map<int64_t, std::vector<int32_t>> out;
    int64_t n = 0;
    while (s.has_work()) {
      for (const SeqOutput& o : s.step()) {
        if (o.token) out[o.id].push_back(o.token->id);
      }
      ++n;
    }
    if (steps) *steps = n;
    return out;
  }

  GoldenCase golden_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Runner> runner_;
};

TEST_F(SchedulerTest, BatchedChunkedSequencesGiveTheReferenceGreedyIds) {
  make(EngineOptions{16, 8, 512});
  // A 16-token budget splits the 37- and 150-token prompts into chunks that share steps with the
  // decode tokens of the others; several copies of each prompt run at once.
  Scheduler s(runner_->engine(), SchedulerOptions{8, 16});
  int64_t id = 0;
  std::map<int64_t, size_t> prompt_of;
  for (int copy = 0; copy < 2; ++copy) {
    for (size_t p = 0; p < golden_.prompts.size(); ++p) {
      s.add(id, greedy(p, static_cast<int64_t>(golden_.prompts[p].greedy.size())));
      prompt_of[id++] = p;
    }
  }
  const auto out = drain(s);
  ASSERT_EQ(out.size(), prompt_of.size());
  for (const auto& [seq, ids] : out)
    EXPECT_EQ(ids, golden_.prompts[prompt_of[seq]].greedy) << "sequence " << seq;
  EXPECT_EQ(s.pages_free(), s.pages_total());
  EXPECT_EQ(runner_->engine().kv().free_slots(), 8);
}

TEST_F(SchedulerTest, ATokenBudgetBoundsEachStep) {
  make(EngineOptions{16, 2, 256});
  // 150 prompt tokens in chunks of at most 16: the first token comes with the 10th step.
  Scheduler s(runner_->engine(), SchedulerOptions{2, 16});
  s.add(0, greedy(2, 3));
  int64_t steps = 0;
  int64_t first = -1;
  while (s.has_work()) {
    ++steps;
    for (const SeqOutput& o : s.step()) {
      if (o.token && first < 0) first = steps;
    }
  }
  EXPECT_EQ(first, 10);
}

TEST_F(SchedulerTest, AdmissionWaitsForThePagesOfTheWholeSequence) {
  // 16-token pages, 6 pages: a 37-token prompt + 40 new tokens needs 5 pages, so a second such
  // sequence must wait although a state slot is free, and start once the first has finished.
  make(EngineOptions{16, 4, 256, 6});
  Scheduler s(runner_->engine(), SchedulerOptions{4, 64});
  ASSERT_EQ(s.pages_for(77), 5);
  s.add(0, greedy(1, 40));
  s.add(1, greedy(1, 40));
  int32_t most_running = 0;
  std::map<int64_t, std::vector<int32_t>> out;
  while (s.has_work()) {
    for (const SeqOutput& o : s.step()) out[o.id].push_back(o.token->id);
    most_running = std::max(most_running, s.num_running());
    EXPECT_LE(s.pages_total() - s.pages_free(), 6);
  }
  EXPECT_EQ(most_running, 1);
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(s.pages_free(), 6);
}

TEST_F(SchedulerTest, CancelFreesTheSlotAndPagesAtTheNextStep) {
  make(EngineOptions{16, 2, 256});
  Scheduler s(runner_->engine(), SchedulerOptions{2, 64});
  s.add(0, greedy(1, 100));
  s.add(1, greedy(0, 100));
  s.step();
  s.step();
  EXPECT_EQ(s.num_running(), 2);
  EXPECT_LT(s.pages_free(), s.pages_total());
  s.cancel(0);
  s.cancel(1);
  s.cancel(7);  // unknown ids are ignored
  EXPECT_EQ(s.num_running(), 0);
  EXPECT_TRUE(s.has_work());  // the release is still due
  EXPECT_TRUE(s.step().empty());
  EXPECT_EQ(s.pages_free(), s.pages_total());
  EXPECT_EQ(runner_->engine().kv().free_slots(), 2);
  EXPECT_FALSE(s.has_work());
}

// The step that gives a sequence its last token also gives back its slot and pages (the server publishes its
// KV gauges right after a step, before the tokens go out).
TEST_F(SchedulerTest, AFinishedSequenceIsReleasedByTheStepThatFinishesIt) {
  make(EngineOptions{16, 2, 256});
  Scheduler s(runner_->engine(), SchedulerOptions{2, 64});
  s.add(0, greedy(1, 3));
  bool finished = false;
  while (!finished) {
    ASSERT_TRUE(s.has_work());
    for (const SeqOutput& o : s.step()) finished = finished || o.finish != FinishReason::kNone;
    if (!finished) {
      EXPECT_LT(s.pages_free(), s.pages_total());
    }
  }
  EXPECT_EQ(s.pages_free(), s.pages_total());
  EXPECT_EQ(runner_->engine().kv().free_slots(), 2);
  EXPECT_FALSE(s.has_work());
}

TEST_F(SchedulerTest, StopIdsEndASequenceAndAreReported) {
  make(EngineOptions{16, 2, 256});
  Scheduler s(runner_->engine(), SchedulerOptions{2, 64});
  const std::vector<int32_t>& ref = golden_.prompts[1].greedy;
  SeqRequest r = greedy(1, 24);
  r.stop_ids = {ref[3]};
  s.add(0, r);
  const std::vector<SeqOutput> outs = run_all(s);
  // The first occurrence of ref[3] ends it (it may appear earlier than index 3).
  const size_t end = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
  ASSERT_EQ(outs.size(), end + 1);
  EXPECT_TRUE(outs.back().stop_token);
  EXPECT_EQ(outs.back().finish, FinishReason::kStop);
  EXPECT_EQ(outs.back().token->id, ref[3]);
  EXPECT_EQ(outs[0].finish, FinishReason::kNone);
}

TEST_F(SchedulerTest, LogprobsAreALogSoftmaxWithTheSampledTokenFirstWhenGreedy) {
  make(EngineOptions{16, 2, 256});
  Scheduler s(runner_->engine(), SchedulerOptions{2, 64});
  SeqRequest r = greedy(1, 2);
  r.top_logprobs = 3;
  s.add(0, r);
  while (s.has_work()) {
    for (const SeqOutput& o : s.step()) {
      ASSERT_EQ(o.token->top.size(), 3u);
      EXPECT_EQ(o.token->top[0].id, o.token->id);
      EXPECT_FLOAT_EQ(o.token->top[0].logprob, o.token->logprob);
      EXPECT_LT(o.token->logprob, 0.0f);
      EXPECT_GE(o.token->top[0].logprob, o.token->top[1].logprob);
    }
  }
}

// The 150-token prompt is scored kPromptLogprobRowsPerStep positions a step, beside another sequence's
// chunks and decode steps; every position's log-probability is the reference's (transformers' logits over
// the whole prompt at once, DESIGN.md's 1e-3 on a logit, so 2e-3 on a log-softmax).
TEST_F(SchedulerTest, PromptLogprobsAreTheReferencesAtEveryPosition) {
  make(EngineOptions{16, 2, 512});
  Scheduler s(runner_->engine(), SchedulerOptions{2, 128});
  const GoldenPrompt& golden = golden_.prompts[2];
  const auto len = static_cast<int64_t>(golden.ids.size());
  ASSERT_GT(len, 2 * kPromptLogprobRowsPerStep);
  SeqRequest scored = greedy(2, 3);
  scored.prompt_logprobs = 2;
  s.add(0, scored);
  s.add(1, greedy(1, 3));
  std::map<int64_t, std::vector<int32_t>> ids;
  std::vector<SampledToken> prompt_logprobs;
  int64_t steps = 0;
  while (s.has_work()) {
    for (SeqOutput& o : s.step()) {
      ASSERT_TRUE(o.token) << o.error;
      if (o.id == 0 && ids[0].empty()) {
        prompt_logprobs = std::move(o.prompt_logprobs);
      } else {
        EXPECT_TRUE(o.prompt_logprobs.empty());  // only the first token of a scored sequence carries them
      }
      ids[o.id].push_back(o.token->id);
    }
    ++steps;
  }
  EXPECT_GE(steps, (len + kPromptLogprobRowsPerStep - 1) / kPromptLogprobRowsPerStep + 2);
  EXPECT_EQ(ids[0], std::vector<int32_t>(golden.greedy.begin(), golden.greedy.begin() + 3));
  EXPECT_EQ(ids[1],
            std::vector<int32_t>(golden_.prompts[1].greedy.begin(), golden_.prompts[1].greedy.begin() + 3));
  ASSERT_EQ(static_cast<int64_t>(prompt_logprobs.size()), len - 1);
  for (int64_t i = 0; i + 1 < len; ++i) {
    const SampledToken& got = prompt_logprobs[i];
    const SampledToken want = token_logprobs(golden.logits[i], golden.ids[i + 1], 2);
    EXPECT_EQ(got.id, golden.ids[i + 1]) << "position " << i + 1;
    EXPECT_NEAR(got.logprob, want.logprob, 2e-3) << "position " << i + 1;
    ASSERT_EQ(got.top.size(), 2u);
    EXPECT_EQ(got.top[0].id, want.top[0].id) << "position " << i + 1;
    EXPECT_NEAR(got.top[0].logprob, want.top[0].logprob, 2e-3) << "position " << i + 1;
  }
}

// On the real model: a +100 bias makes a token the greedy choice, a frequency penalty of 200 (beyond the
// API's range, to dominate any logit) keeps it from coming twice, and min_tokens holds back a stop id the
// model would take at once.
TEST_F(SchedulerTest, AdjustedLogitsSteerTheDraws) {
  make(EngineOptions{16, 2, 256});
  Scheduler s(runner_->engine(), SchedulerOptions{2, 64});
  const std::vector<int32_t>& ref = golden_.prompts[1].greedy;
  const int32_t forced = ref[0] == 7 ? 8 : 7;
  SeqRequest steered = greedy(1, 6);
  steered.adjust.logit_bias = {{forced, 100.0f}};
  steered.adjust.frequency_penalty = 200.0f;
  s.add(0, steered);
  SeqRequest held = greedy(1, 6);
  held.stop_ids = {ref[0]};  // the first greedy token: without min_tokens the sequence would end at once
  held.adjust.min_tokens = 4;
  s.add(1, held);
  std::map<int64_t, std::vector<SeqOutput>> outs;
  for (SeqOutput& o : run_all(s)) outs[o.id].push_back(std::move(o));
  ASSERT_EQ(outs[0].size(), 6u);
  EXPECT_EQ(outs[0][0].token->id, forced);
  for (size_t i = 1; i < outs[0].size(); ++i) EXPECT_NE(outs[0][i].token->id, forced) << i;
  ASSERT_GE(outs[1].size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(outs[1][i].token->id, ref[0]) << i;
  EXPECT_EQ(outs[1].back().finish, outs[1].size() == 6 ? FinishReason::kLength : FinishReason::kStop);
}

TEST_F(SchedulerTest, APromptIsScoredWithoutNewTokens) {
  make(EngineOptions{16, 2, 256});
  Scheduler s(runner_->engine(), SchedulerOptions{2, 64});
  SeqRequest scored = greedy(1, 0);
  scored.prompt_logprobs = 0;
  s.add(3, scored);
  const std::vector<SeqOutput> outs = run_all(s);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_FALSE(outs[0].token.has_value());
  EXPECT_EQ(outs[0].finish, FinishReason::kLength);
  const GoldenPrompt& golden = golden_.prompts[1];
  ASSERT_EQ(outs[0].prompt_logprobs.size(), golden.ids.size() - 1);
  for (size_t i = 0; i + 1 < golden.ids.size(); ++i) {
    EXPECT_NEAR(outs[0].prompt_logprobs[i].logprob,
                token_logprobs(golden.logits[i], golden.ids[i + 1], 0).logprob, 2e-3);
  }
  EXPECT_EQ(s.pages_free(), s.pages_total());
  EXPECT_EQ(runner_->engine().kv().free_slots(), 2);
}

TEST_F(SchedulerTest, RefusesSequencesThatCouldNeverRun) {
  make(EngineOptions{16, 2, 64, 2});
  Scheduler s(runner_->engine(), SchedulerOptions{2, 64});
  SeqRequest empty;
  EXPECT_THROW(s.add(0, empty), Error);
  SeqRequest too_long = greedy(1, 40);  // 77 > max_seq_len 64
  EXPECT_THROW(s.add(1, too_long), Error);
  SeqRequest too_many_pages = greedy(1, 20);  // 57 tokens = 4 pages of 16, the pool has 2
  EXPECT_THROW(s.add(2, too_many_pages), Error);
  SeqRequest bad_id = greedy(0, 1);
  bad_id.prompt = {100000};
  EXPECT_THROW(s.add(3, bad_id), Error);
  EXPECT_FALSE(s.has_work());
  EXPECT_THROW(Scheduler(runner_->engine(), SchedulerOptions{3, 64}), Error);  // more than the slots
  EXPECT_THROW(Scheduler(runner_->engine(), SchedulerOptions{2, 1}), Error);   // budget below the batch
}

TEST_F(SchedulerTest, ZeroNewTokensEndsWithoutRunning) {
  make(EngineOptions{16, 2, 256});
  Scheduler s(runner_->engine(), SchedulerOptions{2, 64});
  s.add(5, greedy(1, 0));
  const std::vector<SeqOutput> outs = s.step();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].id, 5);
  EXPECT_FALSE(outs[0].token.has_value());
  EXPECT_EQ(outs[0].finish, FinishReason::kLength);
  EXPECT_FALSE(s.has_work());
}

}  // namespace
}  // namespace hlm
