// Scheduler: continuous batching on rank 0, the one mechanism behind `generate` and `serve`. Each step()
// takes one decode token from every running sequence that has read its prompt and fills the rest of a
// token budget with prompt chunks of the others (chunked prefill), so sequences join and leave between
// steps of one ragged batch. Sequences wait in arrival order until a KDA state slot and the MLA pages of
// their whole length (prompt + max_new_tokens, on CP rank 0, which holds the most) are free, so a running
// sequence can never run out of pages. Not thread-safe: one thread owns it (the server hands requests over
// through its own queue).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/logits_processor.h"
#include "runtime/logprobs.h"
#include "runtime/sampler.h"

namespace hlm {

// Prompt positions per step whose logits come back for prompt log-probabilities (a vocabulary of floats
// each, on the device and on the host): a session that serves them sizes its logits scratch for this many
// rows more than its sequences.
inline constexpr int64_t kPromptLogprobRowsPerStep = 64;

struct SchedulerOptions {
  int32_t max_num_seqs = 8;              // running sequences at once (at most the engine's state slots)
  int64_t max_num_batched_tokens = 512;  // tokens per engine step: decode tokens plus prompt chunks
};

struct SeqRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  LogitsAdjustments adjust;       // penalties, logit_bias, min_p, min_tokens: applied on the host
  uint64_t sampler_stream = 0;    // picks the sequence's random stream under sampling.seed
  bool stop_at_eos = true;        // end at an end-of-sequence id of the model's config
  std::vector<int32_t> stop_ids;  // further ids that end the sequence (the chat format's, the request's)
  int32_t top_logprobs = -1;      // -1: no log-probabilities; n >= 0: the sampled token's and the n best
  // -1: none; n >= 0: the log-probability of each prompt token after the first, given the ones before it,
  // and the n best at its position. Such a prompt is read kPromptLogprobRowsPerStep tokens a step at most,
  // and may ask for no new tokens (it is then only scored).
  int32_t prompt_logprobs = -1;
};

// kError: the sequence failed (its logits were not finite); it ends without a token, the others go on.
enum class FinishReason { kNone, kStop, kLength, kError };

struct SeqOutput {
  int64_t id = 0;
  std::optional<SampledToken> token;  // none for a sequence that asked for no tokens, or that failed
  bool stop_token = false;            // the token is the eos / stop id that ended the sequence
  FinishReason finish = FinishReason::kNone;
  std::string error;  // with kError
  // With a sequence's first output, when its request asked: prompt positions 1 .. len-1 in order (a scored
  // sequence of no new tokens ends with them, kLength and no token).
  std::vector<SampledToken> prompt_logprobs;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const SchedulerOptions& options);

  // Queues a sequence. Refuses (hlm::Error) one that could never run: empty prompt, ids outside the
  // vocabulary, a length beyond the engine's max_seq_len, or more pages than the whole pool.
  void add(int64_t id, SeqRequest request);
  // Ends a sequence wherever it is; its slot and pages go back at the start of the next step. Unknown or
  // finished ids are ignored (a cancel may cross the sequence's natural end).
  void cancel(int64_t id);

  bool has_work() const;
  // One engine step (plus the release of sequences that ended, those it finishes included); the token each
  // sequence produced.
  std::vector<SeqOutput> step();

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int64_t pages_total() const { return pages_total_; }
  int64_t pages_free() const { return engine_.kv().free_pages(); }
  // MLA pages (on CP rank 0) a sequence of `len` tokens holds; admission reserves this many.
  int64_t pages_for(int64_t len) const;

 private:
  struct Seq {
    int64_t id = 0;
    SeqRequest request;
    Sampler sampler;
    LogitsProcessor processor;
    int64_t prefilled = 0;  // prompt tokens sent to the engine
    bool started = false;   // the engine holds a slot for it
    int64_t generated = 0;
    int32_t last = 0;  // last sampled token, fed by the next decode step
    int64_t reserved_pages = 0;
    std::vector<SampledToken> prompt_logprobs{};  // gathered chunk by chunk until the first token
    std::string bad_prompt_logits{};              // why a prompt position's logits were not finite
  };

  void release_ended();
  void admit();
  // Log-probabilities of the prompt tokens that the rows of `logits` ([n, vocab], the chunk starting at
  // prompt position `begin`) predict.
  void score_prompt(Seq& s, const Tensor& logits, int64_t begin);
  // The sequence's output for the token `sampled` (nullopt: the end of a scored prompt of no new tokens),
  // or a failure when its id is -1 (non-finite logits; `bad_logits` says what was wrong where the host saw
  // them) or its prompt's logits were not finite.
  SeqOutput emit(Seq& s, std::optional<SampledToken> sampled, const std::string& bad_logits);

  Engine& engine_;
  SchedulerOptions options_;
  int64_t pages_total_ = 0;
  std::deque<Seq> waiting_;
  std::vector<Seq> running_;  // oldest first: prompt chunks go in this order
  // Started sequences to release: at the end of the step that finished them, or (cancelled) at the start
  // of the next step.
  std::vector<int64_t> ended_;
};

}  // namespace hlm
