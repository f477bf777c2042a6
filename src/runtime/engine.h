// Engine: runs step plans on every rank. Rank 0 calls step(), which broadcasts the plan and executes it
// locally; the other ranks sit in serve() executing the same plans, so every rank enters every collective
// in the same order. Executing a plan means: admit new sequences (fresh KDA slot), reserve MLA pages,
// build this rank's StepContext from the KV manager and the placement functions, run the model, and
// commit the new tokens to each sequence's global length.
#pragma once

#include <memory>
#include <vector>

#include "cache/kv_manager.h"
#include "model/memory_plan.h"
#include "model/model.h"
#include "runtime/step_plan.h"

namespace hlm {

struct EngineOptions {
  int64_t tokens_per_block = 64;  // MLA page size P
  int32_t max_batch = 8;          // sequences held at once (KDA state slots)
  int64_t max_seq_len = 4096;     // tokens per sequence the MLA page pool is sized for
};

class Engine {
 public:
  Engine(Model& model, Comm& comm, const EngineOptions& options);

  // Rank 0: runs `plan` on every rank; returns, per entry, host F32 logits [rows, vocab] (every token of
  // the entry if all_logits, else its last token).
  std::vector<Tensor> step(const StepPlan& plan);
  // Other ranks: execute broadcast plans until rank 0 calls stop().
  void serve();
  // Rank 0: ends serve() on the other ranks.
  void stop();
  // Every rank, before serving: a prefill of cp·P + 1 tokens (so every CP rank holds KV) and one decode
  // step on a scratch sequence, then frees it (docs/HELIX.md §10). Fails start-up with a clear error if
  // that shape does not fit, and checks that every rank ran it.
  void warmup();
  bool warmed_up() const { return warmed_up_; }

  const EngineOptions& options() const { return options_; }
  const KvManager& kv() const { return kv_; }
  Model& model() { return model_; }

 private:
  std::vector<Tensor> execute(const StepPlan& plan);
  StepContext build_context(const StepPlan& plan);

  Model& model_;
  Comm& comm_;
  EngineOptions options_;
  KvManager kv_;
  bool warmed_up_ = false;
};

}  // namespace hlm
