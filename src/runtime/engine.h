// Engine: runs step plans on every rank. Rank 0 calls step() / step_sample(), which broadcast the plan and
// execute it locally; the other ranks sit in serve() executing the same plans, so every rank enters every
// collective in the same order. Executing a plan means: admit new sequences (fresh KDA slot), reserve MLA
// pages, build this rank's StepContext on the host from the KV manager and the placement functions, stage
// it on the backend, run the model (or replay the CUDA graph of the step's batch size), and commit the new
// tokens to each sequence's global length.
#pragma once

#include <memory>
#include <vector>

#include "cache/kv_manager.h"
#include "model/memory_plan.h"
#include "model/model.h"
#include "runtime/decode_graphs.h"
#include "runtime/step_plan.h"

namespace hlm {

struct EngineOptions {
  int64_t tokens_per_block = 64;  // MLA page size P
  int32_t max_batch = 8;          // sequences held at once (KDA state slots)
  int64_t max_seq_len = 4096;     // tokens per sequence
  int64_t num_pages = 0;          // MLA pages on this rank; 0: what max_batch sequences of max_seq_len need
  bool cuda_graphs = true;        // decode steps as graphs where the backend has them
  MlaPrefillForm mla_prefill = MlaPrefillForm::kAuto;  // the form of MLA in steps that are not decode-only
};

class Engine {
 public:
  Engine(Model& model, Comm& comm, const EngineOptions& options);
  ~Engine();

  // Rank 0: runs `plan` on every rank; returns, per entry, host F32 logits [rows, vocab] (every token of
  // the entry if all_logits, else its last token).
  std::vector<Tensor> step(const StepPlan& plan);
  // Rank 0: runs `plan` and samples, on the backend, one token per entry from its last logits with
  // sampling[i]; -1 where that row's logits are not finite.
  std::vector<int32_t> step_sample(const StepPlan& plan, const std::vector<SampleParams>& sampling);
  // Other ranks: execute broadcast plans until rank 0 calls stop().
  void serve();
  // Rank 0: ends serve() on the other ranks.
  void stop();
  // Every rank, before serving: a prefill of cp·P + 1 tokens (so every CP rank holds KV) and one decode
  // step on a scratch sequence, then frees it (docs/HELIX.md §10); then, where the backend has graphs,
  // captures the decode graphs. Fails start-up with a clear error if that shape does not fit, and checks
  // that every rank ran it.
  void warmup();
  bool warmed_up() const { return warmed_up_; }

  const EngineOptions& options() const { return options_; }
  const KvManager& kv() const { return kv_; }
  Model& model() { return model_; }

 private:
  // Runs the plan inside one backend step and hands the backend logits [rows, vocab] to `consume` before
  // the step's scratch is released.
  void execute(const StepPlan& plan, const std::function<void(const Tensor&)>& consume);
  void broadcast(const StepPlan& plan);
  StepContext build_context(const StepPlan& plan);

  Model& model_;
  Comm& comm_;
  EngineOptions options_;
  KvManager kv_;
  std::unique_ptr<DecodeGraphs> graphs_;
  bool warmed_up_ = false;
};

}  // namespace hlm
