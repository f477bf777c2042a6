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
  EngineOptions engine;
};

// Adds -m, --tp, --cp, --moe-ep, --moe-tp, --threads, --tokens-per-block, --max-batch, --max-seq-len.
void add_session_options(CLI::App& cmd, SessionOptions& o);

class Session {
 public:
  // Loads the model for this rank. `max_seq_len_hint` sizes the page pool when --max-seq-len is not
  // given (the CLI knows exactly how long its sequences get).
  Session(const SessionOptions& options, int64_t max_seq_len_hint);
  ~Session();

  bool is_driver() const { return comm_->rank() == 0; }
  Engine& engine() { return *engine_; }
  Model& model() { return *model_; }
  const ModelConfig& config() const { return config_; }
  // The checkpoint directory -m resolved to (weights/model_source.h).
  const std::string& model_dir() const { return model_dir_; }

 private:
  std::string model_dir_;
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
