#include "runtime/generate.h"

#include <algorithm>

#include "base/log.h"
#include "runtime/logits_guard.h"

namespace hlm {

namespace {

struct Running {
  int64_t id = 0;
  const std::vector<int32_t>* prompt = nullptr;
  int64_t prefilled = 0;  // prompt tokens already sent
  bool started = false;
  bool done = false;
  std::vector<int32_t> output;
  Sampler sampler;
  std::string error;
};

}  // namespace

std::vector<Generation> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& o) {
  validate(o.sampling);
  HLM_CHECK(o.step_tokens > 0, "--prefill-chunk must be positive (got {})", o.step_tokens);
  HLM_CHECK(o.max_new_tokens >= 0, "-n must be >= 0 (got {})", o.max_new_tokens);
  const ModelConfig& cfg = engine.model().config();
  HLM_CHECK(static_cast<int64_t>(prompts.size()) <= engine.options().max_batch,
            "{} prompts exceed --max-batch {}", prompts.size(), engine.options().max_batch);
  std::vector<Running> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    HLM_CHECK(!prompts[i].empty(), "prompt {} is empty", i);
    for (int32_t t : prompts[i]) {
      HLM_CHECK(t >= 0 && t < cfg.vocab_size, "prompt {}: token id {} is outside the vocabulary [0, {})", i,
                t, cfg.vocab_size);
    }
    seqs.push_back(Running{static_cast<int64_t>(i),
                           &prompts[i],
                           0,
                           false,
                           o.max_new_tokens == 0,
                           {},
                           Sampler(o.sampling, i),
                           {}});
    if (seqs.back().done && o.on_done) o.on_done(i);
  }

  auto is_eos = [&](int32_t t) {
    return o.stop_at_eos &&
           std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), t) != cfg.eos_token_ids.end();
  };
  for (;;) {
    if (o.stop_requested && o.stop_requested()) break;
    StepPlan plan;
    std::vector<Running*> members;
    int64_t budget = o.step_tokens;
    // Decoding sequences first: one token each.
    for (Running& s : seqs) {
      if (s.done || s.prefilled < static_cast<int64_t>(s.prompt->size())) continue;
      plan.entries.push_back(StepEntry{s.id, false, false, {s.output.back()}});
      members.push_back(&s);
      --budget;
    }
    for (Running& s : seqs) {
      const auto len = static_cast<int64_t>(s.prompt->size());
      if (s.done || s.prefilled >= len || budget <= 0) continue;
      const int64_t n = std::min(budget, len - s.prefilled);
      StepEntry e{s.id, !s.started, false,
                  std::vector<int32_t>(s.prompt->begin() + s.prefilled, s.prompt->begin() + s.prefilled + n)};
      s.started = true;
      s.prefilled += n;
      budget -= n;
      plan.entries.push_back(std::move(e));
      members.push_back(&s);
    }
    if (plan.entries.empty()) break;

    std::vector<Tensor> logits = engine.step(plan);
    for (size_t i = 0; i < members.size(); ++i) {
      Running& s = *members[i];
      if (s.prefilled < static_cast<int64_t>(s.prompt->size())) continue;  // mid-prompt chunk
      const Tensor row = logits[i][0];
      s.error = non_finite_logits(row);
      if (!s.error.empty()) {
        s.error =
            fmt::format("step {} of its generation gave non-finite logits: {}", s.output.size() + 1, s.error);
        s.done = true;
      } else {
        const int32_t t = s.sampler.sample(row);
        s.output.push_back(t);
        if (o.on_token) o.on_token(static_cast<size_t>(s.id), t);
        if (static_cast<int64_t>(s.output.size()) >= o.max_new_tokens || is_eos(t)) s.done = true;
      }
      if (s.done && o.on_done) o.on_done(static_cast<size_t>(s.id));
    }
    // Finished sequences give their slot and pages back with the next step.
    StepPlan release;
    for (Running* s : members) {
      if (s->done) release.release.push_back(s->id);
    }
    if (!release.release.empty()) engine.step(release);
  }
  // Interrupted: the unfinished sequences still hold a slot and pages on every rank.
  StepPlan release;
  for (Running& s : seqs) {
    if (s.started && !s.done) release.release.push_back(s.id);
  }
  if (!release.release.empty()) engine.step(release);
  std::vector<Generation> out;
  for (Running& s : seqs) out.push_back(Generation{std::move(s.output), std::move(s.error)});
  return out;
}

}  // namespace hlm
