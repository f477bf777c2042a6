// Test support: the golden fixtures made by tools/make_golden.py, a model + engine on any Comm, and
// helpers that run the engine the way the CLI does (prefill chunks, one-token decode steps).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "parallel/comm.h"
#include "runtime/engine.h"
#include "weights/safetensors.h"

namespace hlm::test {

struct GoldenPrompt {
  std::vector<int32_t> ids;     // the prompt
  std::vector<int32_t> greedy;  // the reference's greedy continuation
  Tensor logits;                // [len(ids) + len(greedy), vocab]: one pass over prompt + continuation
  // The prompt followed by the greedy continuation: the tokens `logits` covers.
  std::vector<int32_t> full_sequence() const {
    std::vector<int32_t> all = ids;
    all.insert(all.end(), greedy.begin(), greedy.end());
    return all;
  }
};

struct GoldenCase {
  std::string name;       // fixture directory name
  std::string model_dir;  // config.json + weights
  std::vector<GoldenPrompt> prompts;
};

// Every fixture under HLM_FIXTURES_DIR with a golden.json, plus each "-moonshot" twin (same weights,
// Moonshot-style config) checked against its base fixture's references.
std::vector<std::string> golden_case_names();
GoldenCase load_golden_case(const std::string& name);

// How far bf16 rounding alone moves a fixture's reference, per prompt, from its bf16_reference.json
// (tools/bf16_reference.py: the reference run in bf16 against its fp32 logits): the relative L2 error of
// the logits and the largest change of a single logit. The "loud" fixtures (weights with std 0.2) amplify
// rounding to 0.05-0.26; the realistic ones stay near 1e-2 (tests/gpu/cuda_model_test.cc).
struct Bf16Noise {
  std::vector<double> rel_l2;
  std::vector<float> max_abs;
};
Bf16Noise load_bf16_noise(const GoldenCase& c);

// A model and engine for one rank, on the CPU or the CUDA backend (the GPU of the rank's local index under
// mpirun, GPU 0 otherwise). A CUDA runner on several ranks runs its collectives through a GPU Comm built
// over `comm` (collectively: every rank builds its runners in the same order). A CUDA runner reserves the
// step workspace for steps of up to options.max_seq_len tokens and, with options.cuda_graphs, warms up and
// captures the decode graphs.
class Runner {
 public:
  Runner(const std::string& model_dir, const Mapping& mapping, Comm& comm, EngineOptions options = {},
         Device device = Device::kCpu);
  Engine& engine() { return *engine_; }
  Model& model() { return *model_; }
  Ops& ops() { return *ops_; }
  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Comm> device_comm_;  // the GPU Comm on several GPUs
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
};

// Logits at every position of `ids` for a new sequence `seq_id`: positions < prefill_len in prefill
// steps of at most `chunk` tokens (0: one step), then one token per step. [len(ids), vocab]
Tensor sequence_logits(Engine& engine, int64_t seq_id, const std::vector<int32_t>& ids, int64_t prefill_len,
                       int64_t chunk = 0);

float max_abs_diff(const Tensor& a, const Tensor& b);
// Rows [begin, end) of a [rows, vocab] tensor.
Tensor rows(const Tensor& t, int64_t begin, int64_t end);
// Top-1 minus top-2 of a row.
float top2_margin(const float* row, int64_t n);

}  // namespace hlm::test
