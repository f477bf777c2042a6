// Session: what every subcommand that runs the model sets up, in order: logging, MPI world and rank
// layout, threads, config, checkpoint, backend ops, Comm, the model and the engine.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "ops/ops.h"
#include "parallel/comm.h"
#include "runtime/engine.h"
#include "weights/safetensors.h"

namespace hlm {

struct SessionOptions {
  std::string model_dir = "models/kimi-linear-tiny";
  int tp = 1;
  int cp = 1;
  int moe_ep = 0;
  int moe_tp = 0;
  int threads = 0;          // 0: the machine's cores divided among the ranks on it
  int64_t max_seq_len = 0;  // 0: what the command needs, or 4096
  bool warmup = true;
  // Seconds a rank waits in one collective before it ends the job naming the ranks that did not answer.
  // No legitimate wait comes near it: a collective waits only for the peers' work since the previous
  // one (a layer of a step; between steps, rank 0's scheduling); weight loading gets its own allowance.
  double comm_timeout = 600;
  EngineOptions engine;
  // The options that sized the caches, for the error when they do not fit: the command's own option when
  // it set the batch or the sequence length (bench: --batch, --context), else --max-batch / --max-seq-len.
  std::string batch_option = "--max-batch";
  std::string length_option = "--max-seq-len";
};

// Adds -m, --tp, --cp, --moe-ep, --moe-tp, --threads, --tokens-per-block, --max-batch, --max-seq-len,
// --comm-timeout, --no-warmup.
void add_session_options(CLI::App& cmd, SessionOptions& o);

// Range checks of the options as the user gave them (before a command adjusts them), naming the option.
void check_session_options(const SessionOptions& o);

class Session {
 public:
  // Loads the model for this rank. `max_seq_len_hint` sizes the page pool when --max-seq-len is not
  // given (the CLI knows exactly how long its sequences get). The caches are sized against the host
  // memory available to this rank before any weight is read: a request that cannot fit is an error
  // naming the options that sized it.
  Session(const SessionOptions& options, int64_t max_seq_len_hint);
  ~Session();

  bool is_driver() const { return comm_->rank() == 0; }
  Engine& engine() { return *engine_; }
  Model& model() { return *model_; }
  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
};

// "5,17,300" -> {5, 17, 300}; errors name `flag`.
std::vector<int32_t> parse_ids(const std::string& text, const char* flag);

}  // namespace hlm
