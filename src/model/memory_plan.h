// Memory planning from a config alone (docs/HELIX.md §11): per-rank weight bytes by category (the shard
// plan's boxes times the stored dtypes), KV bytes per token, KDA state per sequence, and the exact
// parameter count. `helixlm plan` prints these; a test checks the weight bytes against what a rank
// actually reads from the checkpoint.
#pragma once

#include <array>
#include <cstdint>
#include <functional>

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

// MLA cache bytes rank r holds for one sequence of `global_len` tokens, in whole pages.
int64_t kv_bytes_at(const StateBytes& s, const Placement& placement, int r, int64_t global_len);

// Upper bound of the scratch one engine step of `tokens` tokens returning `logit_rows` rows of logits
// allocates on this rank (the live intermediates of the widest layer, in F32, with room for allocator
// fragmentation), plus a fixed part for routing buffers, library workspaces and sampling.
int64_t step_scratch_bytes(const ModelConfig& cfg, const Mapping& mapping, int64_t tokens, int64_t logit_rows);

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

// Fails, naming the options, when max_batch sequences of max_seq_len tokens do not fit.
DeviceCachePlan plan_device_caches(const ModelConfig& cfg, const Mapping& mapping, int64_t weight_bytes,
                                   const MemoryInfo& mem, double fraction,
                                   int64_t tokens_per_block, int32_t max_batch, int64_t max_seq_len,
                                   int64_t step_tokens, int64_t logit_rows);
void log_device_cache_plan(const DeviceCachePlan& plan);

}  // namespace hlm
