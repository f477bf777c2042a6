#include "runtime/generate.h"

#include <algorithm>

#include "runtime/scheduler.h"

namespace hlm {

std::vector<Generation> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& o) {
  validate(o.sampling);
  HLM_CHECK(o.step_tokens > 0, "--prefill-chunk must be positive (got {})", o.step_tokens);
  HLM_CHECK(o.max_new_tokens >= 0, "-n must be >= 0 (got {})", o.max_new_tokens);
  const int32_t seqs = std::max<int32_t>(1, std::min<int32_t>(engine.options().max_batch, prompts.size()));
  // Every prompt is admitted at once when the engine holds them all, as before the scheduler existed.
  Scheduler scheduler(engine, SchedulerOptions{seqs, std::max<int64_t>(o.step_tokens, seqs)});
  for (size_t i = 0; i < prompts.size(); ++i) {
    SeqRequest r;
    r.prompt = prompts[i];
    r.max_new_tokens = o.max_new_tokens;
    r.sampling = o.sampling;
    r.adjust = o.adjust;
    r.sampler_stream = i;
    r.stop_at_eos = o.stop_at_eos;
    scheduler.add(static_cast<int64_t>(i), std::move(r));  // its errors name the prompt by its index
  }
  std::vector<Generation> out(prompts.size());
  std::vector<char> done(prompts.size(), 0);
  while (scheduler.has_work()) {
    if (o.stop_requested && o.stop_requested()) {
      // Interrupted: every prompt keeps what it has; the unfinished ones give their slots and pages back.
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (!done[i]) scheduler.cancel(static_cast<int64_t>(i));
      }
      scheduler.step();
      break;
    }
    for (const SeqOutput& s : scheduler.step()) {
      Generation& g = out[s.id];
      if (s.finish == FinishReason::kError) {
        g.error = s.error;
      } else if (s.token) {
        g.ids.push_back(s.token->id);
        if (o.on_token) o.on_token(static_cast<size_t>(s.id), s.token->id);
      }
      if (s.finish != FinishReason::kNone) {
        done[s.id] = 1;
        if (o.on_done) o.on_done(static_cast<size_t>(s.id));
      }
    }
  }
  return out;
}

}  // namespace hlm
