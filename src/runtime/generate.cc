#include "runtime/generate.h"

#include <algorithm>

#include "runtime/scheduler.h"

namespace hlm {

std::vector<std::vector<int32_t>> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
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
    r.sampler_stream = i;
    r.stop_at_eos = o.stop_at_eos;
    scheduler.add(static_cast<int64_t>(i), std::move(r));
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  while (scheduler.has_work()) {
    for (const SeqOutput& s : scheduler.step()) {
      HLM_CHECK(s.finish != FinishReason::kError, "prompt {}: {}", s.id, s.error);
      if (s.token) out[s.id].push_back(s.token->id);
    }
  }
  return out;
}

}  // namespace hlm
