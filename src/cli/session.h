// Session: what every subcommand that runs the model sets up, in order: logging, MPI world and rank
// layout, the backend (CPU or CUDA), config, weights (a checkpoint, or random weights for benchmarks), the
// memory plan (on a GPU: KV pages and state slots from the memory left after the weights), Comm, the
// model and the engine.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "model/weight_layout.h"
#include "ops/backend.h"
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
  DeviceChoice device = DeviceChoice::kAuto;
  double gpu_memory_fraction = 0.90;
  bool cuda_graphs = true;
  // Seconds a rank waits in one collective before it ends the job naming the ranks that did not answer.
  // No legitimate wait comes near it: a collective waits only for the peers' work since the previous
  // one (a layer of a step; between steps, rank 0's scheduling); weight loading gets its own allowance.
  double comm_timeout = 600;
  // GPU collectives over NVLink peer memory up to these sizes, NCCL above (0: NCCL only).
  int64_t ll_all_reduce_max_bytes = 64 << 10;
  int64_t ll_all_to_all_max_bytes = 1 << 20;
  EngineOptions engine;
  // The options that sized the caches, for the error when they do not fit: the command's own option when
  // it set the batch or the sequence length (bench: --batch, --context), else --max-batch / --max-seq-len.
  std::string batch_option = "--max-batch";
  std::string length_option = "--max-seq-len";
  // The most tokens one engine step runs (sizes a device backend's scratch arena); 0: max_seq_len.
  int64_t max_step_tokens = 0;
  int64_t max_logit_rows = 0;  // the most logit rows one step returns; 0: max_step_tokens
  // Benchmarks without a checkpoint: the model of `config_path` with random weights made on the backend,
  // optionally cut to its first `num_layers` layers.
  std::string config_path;
  bool random_weights = false;
  int num_layers = 0;
  // Time the sections of every step (Ops::section; bench --layer-split).
  bool section_timing = false;
};

// Adds -m, --tp, --cp, --moe-ep, --moe-tp, --threads, --tokens-per-block, --max-batch, --max-seq-len,
// --device, --gpu-memory-fraction, --no-cuda-graphs, --comm-timeout, --ll-all-reduce-max-bytes,
// --ll-all-to-all-max-bytes, --no-warmup.
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

  bool is_driver() const { return host_comm_->rank() == 0; }
  // The Comm the model uses: the GPU Comm on several GPUs, the MPI or single-rank Comm otherwise.
  Comm& comm() { return device_comm_ != nullptr ? *device_comm_ : *host_comm_; }
  Engine& engine() { return *engine_; }
  Model& model() { return *model_; }
  Ops& ops() { return *ops_; }
  const ModelConfig& config() const { return config_; }
  Device device() const { return ops_->device(); }
  // The dtype a tensor of the layout is stored in: the checkpoint's, or the published one (random weights).
  DType stored_dtype(const WeightSpec& spec) const;
  // The checkpoint directory -m resolved to (weights/model_source.h).
  const std::string& model_dir() const { return model_dir_; }

 private:
  std::string model_dir_;
  ModelConfig config_;
  std::unique_ptr<Comm> host_comm_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Comm> device_comm_;  // after ops_: it runs on their stream
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
};

// "5,17,300" -> {5, 17, 300}; errors name `flag`.
std::vector<int32_t> parse_ids(const std::string& text, const char* flag);

}  // namespace hlm
