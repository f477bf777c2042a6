// Memory planning from a config alone (docs/HELIX.md §11): per-rank weight bytes by category (the shard
// plan's boxes times the stored dtypes), KV bytes per token, KDA state per sequence, the exact parameter
// count, and the caches an engine allocates, checked against the memory that exists before anything is
// allocated. `helixlm plan` prints these; a test checks the weight bytes against what a rank actually
// reads from the checkpoint.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>

#include "model/step_sections.h"
#include "model/weight_layout.h"
#include "ops/ops.h"
#include "parallel/placement.h"

namespace hlm {

// The dtype a tensor is stored in: from the checkpoint headers when available, else the published
// checkpoint's (WeightSpec::typical_dtype).
using StoredDType = std::function<DType(const WeightSpec&)>;

struct RankWeightBytes {
  std::array<int64_t, kNumWeightCategories> by_category{};
  int64_t total = 0;
};

// `layout` is weight_layout(cfg), computed once by the caller (K3's has half a million entries).
RankWeightBytes rank_weight_bytes(const std::vector<WeightSpec>& layout, const Mapping& mapping,
                                  const StoredDType& dtype_of);

// Parameters of the model: elements of every checkpoint tensor the model uses, each counted once
// (MXFP4 weights count their unpacked elements, not their bytes; group scales are not parameters).
int64_t parameter_count(const ModelConfig& cfg);

struct StateBytes {
  int64_t kv_per_token = 0;   // MLA latent cache bytes per cached token, all MLA layers
  int64_t kda_recurrent = 0;  // per sequence on one rank, all KDA layers (fp32)
  int64_t kda_conv = 0;       // per sequence on one rank, all KDA layers
};

// Per-rank state sizes for `mapping`, with `kv_bytes` / `conv_bytes` per stored value.
StateBytes state_bytes(const ModelConfig& cfg, const Mapping& mapping, int64_t kv_bytes, int64_t conv_bytes);

// MLA cache bytes rank r holds for one sequence of `global_len` tokens, in whole pages. Throws if the
// product overflows int64.
int64_t kv_bytes_at(const StateBytes& s, const Placement& placement, int r, int64_t global_len);

// MLA pages one rank needs to hold `max_batch` sequences of `max_seq_len` tokens (CP rank 0 holds the
// most: lower ranks never hold fewer tokens). Throws beyond kMaxPagesPerRank (page ids are int32).
int64_t pages_per_rank(const Placement& placement, int64_t max_batch, int64_t max_seq_len);

// The caches an engine allocates on one rank: the MLA page pool and `max_batch` KDA state slots.
struct CacheSize {
  int64_t pages = 0;            // MLA pages of tokens_per_block tokens
  int64_t kv_pool_bytes = 0;    // the page pool, all MLA layers
  int64_t kda_state_bytes = 0;  // conv window + recurrent state of every slot, all KDA layers
  int64_t total() const { return kv_pool_bytes + kda_state_bytes; }
};

// Sizes the caches for `mapping`'s rank with `kv_bytes` / `conv_bytes` per stored value (the CPU backend
// holds both as fp32; the recurrent state is fp32 everywhere). Overflow is an error, never a wrap.
CacheSize cache_size(const ModelConfig& cfg, const Mapping& mapping, int64_t tokens_per_block,
                     int64_t max_batch, int64_t max_seq_len, int64_t kv_bytes, int64_t conv_bytes);

// Throws unless `need` fits in `available` bytes. The error says what sized the caches (`sized_by`, e.g.
// "--max-batch 8 sequences of --max-seq-len 4096 tokens"), the bytes by cache, the memory available and
// where that figure comes from (`memory`, e.g. "host memory (MemAvailable)"), and what to lower (`remedy`).
void check_cache_fits(const CacheSize& need, int64_t available, const std::string& memory,
                      const std::string& sized_by, const std::string& remedy);

// Bytes one decode step of `batch` sequences at `context` tokens must move on `m`'s rank (the physical
// floor of `bench`): the weights as the backend holds them (`held` gives each tensor's dtype there), of
// the routed experts only the distinct ones a batch is expected to touch (batch·k uniform draws from E;
// batch 1 touches exactly k) and of the embedding table one row per token, plus each sequence's KV cache
// read (`kv_bytes` per value) and its KDA state (fp32 recurrent, `conv_bytes` per conv value) read and
// written. Expert bytes come from the layout, so a latent MoE's experts count at their input width and
// MXFP4 experts at their packed size.
// `section` splits the same bytes by step section (step_sections.h): the embedding rows, the KDA weights and
// state, the MLA weights and KV, the dense MLPs, the MoE layers' router, touched experts, shared experts
// and latent projections, and lm_head. The per-layer norms and AttnRes vectors (under 0.1% of a step) are
// in `weights` only.
struct StepBytes {
  double weights = 0;
  double kv = 0;
  double state = 0;
  std::array<double, kNumStepSections> section{};
  double total() const { return weights + kv + state; }
};
StepBytes decode_step_bytes(const ModelConfig& cfg, const Mapping& m, int64_t context, int64_t batch,
                            int64_t tokens_per_block, const StoredDType& held, int64_t kv_bytes,
                            int64_t conv_bytes);

// Upper bound of the scratch one engine step of `tokens` tokens returning `logit_rows` rows of logits
// allocates on this rank (the live intermediates of the widest layer, in F32, with room for allocator
// fragmentation), plus a fixed part for routing buffers, library workspaces and sampling.
int64_t step_scratch_bytes(const ModelConfig& cfg, const Mapping& mapping, int64_t tokens,
                           int64_t logit_rows);

// How a device's memory is split once the weights are loaded: everything under the budget
// (fraction · total, minus what others use) goes to the step arena, the KDA state slots, and MLA pages.
struct DeviceCachePlan {
  int64_t budget = 0;  // bytes helixlm may hold on the device
  int64_t weights = 0;
  int64_t workspace_bytes = 0;
  int32_t slots = 0;
  int64_t state_bytes_per_slot = 0;
  int64_t page_bytes = 0;  // one MLA page of every MLA layer
  int64_t pages = 0;
  int64_t tokens_per_block = 0;
};

// Fails when max_batch sequences of max_seq_len tokens do not fit, saying what sized them (`sized_by`)
// and what to lower (`remedy`), as check_cache_fits does.
DeviceCachePlan plan_device_caches(const ModelConfig& cfg, const Mapping& mapping, int64_t weight_bytes,
                                   const MemoryInfo& mem, double fraction, int64_t tokens_per_block,
                                   int32_t max_batch, int64_t max_seq_len, int64_t step_tokens,
                                   int64_t logit_rows, const std::string& sized_by,
                                   const std::string& remedy);
void log_device_cache_plan(const DeviceCachePlan& plan);

}  // namespace hlm
