#include "runtime/scheduler.h"

#include <algorithm>
#include <exception>

#include "base/error.h"
#include "runtime/logits_guard.h"

namespace hlm {

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& options)
    : engine_(engine), options_(options), pages_total_(engine.kv().free_pages()) {
  HLM_CHECK(options.max_num_seqs > 0 && options.max_num_seqs <= engine.options().max_batch,
            "--max-num-seqs must be in [1, {}] (the engine's state slots), got {}",
            engine.options().max_batch, options.max_num_seqs);
  // Every running sequence decodes one token per step, so a smaller budget could starve prompts forever.
  HLM_CHECK(options.max_num_batched_tokens >= options.max_num_seqs,
            "--max-num-batched-tokens ({}) must be at least --max-num-seqs ({})",
            options.max_num_batched_tokens, options.max_num_seqs);
  // Built before any request: the pool is whole (warmup releases its scratch sequence).
  HLM_CHECK(engine.kv().free_slots() == engine.options().max_batch,
            "the scheduler must be created while no sequence is held");
}

int64_t Scheduler::pages_for(int64_t len) const { return engine_.kv().placement().local_pages(len, 0); }

void Scheduler::add(int64_t id, SeqRequest r) {
  const ModelConfig& cfg = engine_.model().config();
  HLM_CHECK(!r.prompt.empty(), "prompt {} is empty", id);
  for (int32_t t : r.prompt) {
    HLM_CHECK(t >= 0 && t < cfg.vocab_size, "prompt {}: token id {} is outside the vocabulary [0, {})", id, t,
              cfg.vocab_size);
  }
  HLM_CHECK(r.max_new_tokens >= 0, "sequence {}: max_new_tokens must be >= 0 (got {})", id, r.max_new_tokens);
  validate(r.sampling);
  validate(r.adjust, cfg.vocab_size);
  const int64_t len = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  HLM_CHECK(len <= engine_.options().max_seq_len,
            "sequence {}: {} prompt + {} new tokens exceed the {} tokens a sequence may hold", id,
            r.prompt.size(), r.max_new_tokens, engine_.options().max_seq_len);
  HLM_CHECK(pages_for(len) <= pages_total_, "sequence {}: {} tokens need {} KV pages, the pool has {}", id,
            len, pages_for(len), pages_total_);
  Sampler sampler(r.sampling, r.sampler_stream);
  // The ids that would end the sequence, which min_tokens holds back.
  std::vector<int32_t> end_ids = r.stop_ids;
  if (r.stop_at_eos) {
    for (int64_t e : cfg.eos_token_ids) end_ids.push_back(static_cast<int32_t>(e));
  }
  LogitsProcessor processor(r.adjust, r.prompt, std::move(end_ids));
  waiting_.push_back(Seq{id, std::move(r), std::move(sampler), std::move(processor)});
}

void Scheduler::cancel(int64_t id) {
  auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](const Seq& s) { return s.id == id; });
  if (w != waiting_.end()) {
    waiting_.erase(w);
    return;
  }
  auto r = std::find_if(running_.begin(), running_.end(), [&](const Seq& s) { return s.id == id; });
  if (r == running_.end()) return;
  if (r->started) ended_.push_back(id);
  running_.erase(r);
}

bool Scheduler::has_work() const { return !waiting_.empty() || !running_.empty() || !ended_.empty(); }

void Scheduler::release_ended() {
  if (ended_.empty()) return;
  StepPlan plan;
  plan.release = std::move(ended_);
  ended_.clear();
  engine_.step(plan);
}

void Scheduler::admit() {
  // Pages promised to running sequences but not yet taken from the pool.
  int64_t promised = 0;
  int32_t slots = engine_.kv().free_slots();
  for (const Seq& s : running_) {
    const int64_t held = s.started ? static_cast<int64_t>(engine_.kv().pages(s.id).size()) : 0;
    promised += s.reserved_pages - held;
    if (!s.started) --slots;
  }
  // First come, first served: the head waits for room rather than being overtaken by smaller requests.
  while (!waiting_.empty() && num_running() < options_.max_num_seqs && slots > 0) {
    Seq& s = waiting_.front();
    const int64_t need = pages_for(static_cast<int64_t>(s.request.prompt.size()) + s.request.max_new_tokens);
    if (need > engine_.kv().free_pages() - promised) break;
    s.reserved_pages = need;
    promised += need;
    --slots;
    running_.push_back(std::move(s));
    waiting_.pop_front();
  }
}

void Scheduler::score_prompt(Seq& s, const Tensor& logits, int64_t begin) {
  const std::vector<int32_t>& prompt = s.request.prompt;
  const auto len = static_cast<int64_t>(prompt.size());
  // Row j holds the logits after prompt position begin + j: the distribution of position begin + j + 1.
  for (int64_t j = 0; j < logits.dim(0) && begin + j + 1 < len; ++j) {
    const Tensor row = logits[j];  // [vocab]
    if (s.bad_prompt_logits.empty()) {
      const std::string bad = non_finite_logits(row);
      if (!bad.empty()) s.bad_prompt_logits = fmt::format("after prompt position {}: {}", begin + j, bad);
    }
    s.prompt_logprobs.push_back(token_logprobs(row, prompt[begin + j + 1], s.request.prompt_logprobs));
  }
}

SeqOutput Scheduler::emit(Seq& s, std::optional<SampledToken> sampled, const std::string& bad_logits) {
  SeqOutput out;
  out.id = s.id;
  if (!s.bad_prompt_logits.empty()) {
    out.finish = FinishReason::kError;
    out.error = fmt::format("the logits of its prompt were not finite: {}", s.bad_prompt_logits);
    return out;
  }
  if (s.generated == 0) out.prompt_logprobs = std::move(s.prompt_logprobs);
  if (!sampled) {  // a scored prompt of no new tokens
    out.finish = FinishReason::kLength;
    return out;
  }
  SampledToken& token = *sampled;
  if (token.id < 0) {
    out.finish = FinishReason::kError;
    out.error = fmt::format("step {} of its generation gave non-finite logits{}{}", s.generated + 1,
                            bad_logits.empty() ? "" : ": ", bad_logits);
    return out;
  }
  const int32_t id = token.id;
  out.token = std::move(token);
  s.last = id;
  ++s.generated;
  s.processor.observe(id);
  const std::vector<int64_t>& eos = engine_.model().config().eos_token_ids;
  const std::vector<int32_t>& stops = s.request.stop_ids;
  out.stop_token = (s.request.stop_at_eos && std::find(eos.begin(), eos.end(), id) != eos.end()) ||
                   std::find(stops.begin(), stops.end(), id) != stops.end();
  if (out.stop_token) {
    out.finish = FinishReason::kStop;
  } else if (s.generated >= s.request.max_new_tokens) {
    out.finish = FinishReason::kLength;
  }
  return out;
}

std::vector<SeqOutput> Scheduler::step() {
  release_ended();
  std::vector<SeqOutput> outputs;
  // A request for no tokens ends without touching the engine, unless its prompt is to be scored.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->request.max_new_tokens == 0 && it->request.prompt_logprobs < 0) {
      SeqOutput out;
      out.id = it->id;
      out.finish = FinishReason::kLength;
      outputs.push_back(std::move(out));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  admit();

  StepPlan plan;
  std::vector<Seq*> members;
  int64_t budget = options_.max_num_batched_tokens;
  for (Seq& s : running_) {
    if (s.prefilled < static_cast<int64_t>(s.request.prompt.size())) continue;
    plan.entries.push_back(StepEntry{s.id, false, false, {s.last}});
    members.push_back(&s);
    --budget;
  }
  std::vector<int64_t> chunk_begin(members.size(), 0);  // where each member's tokens start in its sequence
  int64_t logprob_rows = kPromptLogprobRowsPerStep;
  for (Seq& s : running_) {
    const auto len = static_cast<int64_t>(s.request.prompt.size());
    if (s.prefilled >= len || budget <= 0) continue;
    const bool scored = s.request.prompt_logprobs >= 0;
    int64_t n = std::min(budget, len - s.prefilled);
    if (scored) n = std::min(n, logprob_rows);
    if (n == 0) continue;
    if (scored) logprob_rows -= n;
    const auto begin = s.request.prompt.begin() + s.prefilled;
    plan.entries.push_back(StepEntry{s.id, !s.started, scored, std::vector<int32_t>(begin, begin + n)});
    chunk_begin.push_back(s.prefilled);
    s.started = true;
    s.prefilled += n;
    budget -= n;
    members.push_back(&s);
  }
  if (plan.entries.empty()) return outputs;

  // A device backend samples on the device (only ids come back), unless a member asked for
  // log-probabilities, a scored prompt, or adjusted logits (penalties, logit_bias, min_p, min_tokens): then,
  // as on the CPU, the step returns host logits and the same draws are made on the host
  // (ops/cpu/sampling.cc), with the guard's account of non-finite rows. A mid-prompt chunk gets no
  // draw, so its sequence's random counter does not advance.
  auto wants_token = [](const Seq& s) {
    return s.prefilled >= static_cast<int64_t>(s.request.prompt.size());
  };
  const bool host = engine_.model().ops().device() == Device::kCpu ||
                    std::any_of(plan.entries.begin(), plan.entries.end(),
                                [](const StepEntry& e) { return e.all_logits; }) ||
                    std::any_of(members.begin(), members.end(), [&](const Seq* s) {
                      return wants_token(*s) && (s->request.top_logprobs >= 0 || s->processor.needed());
                    });
  std::vector<SampledToken> tokens(members.size());
  std::vector<std::string> bad(members.size());
  if (host) {
    const std::vector<Tensor> logits = engine_.step(plan);  // per entry [1, vocab], or [n, vocab] if scored
    // Each member's work reads its own rows and changes only its own sequence (sampler counter, processor,
    // scored prompt), and at a vocabulary of 163,840 it is passes of exp, log and selection over the row:
    // the members run on the host's threads.
    std::vector<std::exception_ptr> failed(members.size());
#pragma omp parallel for schedule(dynamic) if (members.size() > 1)
    for (size_t i = 0; i < members.size(); ++i) {
      try {
        Seq& s = *members[i];
        if (plan.entries[i].all_logits) score_prompt(s, logits[i], chunk_begin[i]);
        if (!wants_token(s) || s.request.max_new_tokens == 0) continue;
        const Tensor row = logits[i][logits[i].dim(0) - 1];  // [vocab]
        bad[i] = non_finite_logits(row);
        int32_t id = -1;
        if (s.processor.needed() && bad[i].empty()) {
          Tensor adjusted = row.clone();  // [vocab]; the log-probabilities below stay the raw row's
          s.processor.apply(adjusted.data<float>(), adjusted.numel(), s.request.sampling.temperature);
          id = s.sampler.sample(adjusted);
        } else {
          id = s.sampler.sample(row);
        }
        tokens[i] = s.request.top_logprobs >= 0 && id >= 0 ? token_logprobs(row, id, s.request.top_logprobs)
                                                           : SampledToken{id, 0.0f, {}};
      } catch (...) {
        failed[i] = std::current_exception();
      }
    }
    for (const std::exception_ptr& e : failed) {
      if (e) std::rethrow_exception(e);
    }
  } else {
    std::vector<SampleParams> params;
    for (Seq* s : members) params.push_back(wants_token(*s) ? s->sampler.next() : SampleParams{});
    const std::vector<int32_t> ids = engine_.step_sample(plan, params);
    for (size_t i = 0; i < members.size(); ++i) tokens[i].id = ids[i];
  }
  std::vector<int64_t> finished;
  for (size_t i = 0; i < members.size(); ++i) {
    Seq& s = *members[i];
    if (!wants_token(s)) continue;  // mid-prompt chunk
    // A scored prompt of no new tokens drew none.
    std::optional<SampledToken> sampled;
    if (s.request.max_new_tokens > 0) sampled = std::move(tokens[i]);
    SeqOutput out = emit(s, std::move(sampled), bad[i]);
    if (out.finish != FinishReason::kNone) finished.push_back(s.id);
    outputs.push_back(std::move(out));
  }
  for (int64_t id : finished) cancel(id);
  // A finished sequence's slot and pages go back before its last token is handed out, so whoever sees
  // that token (a server client reading the KV gauges next) sees them free.
  release_ended();
  return outputs;
}

}  // namespace hlm
