// Memory planning from a config alone (docs/HELIX.md §11): per-rank weight bytes by category (the shard
// plan's boxes times the stored dtypes), KV bytes per token, KDA state per sequence, and the exact
// parameter count. `helixlm plan` prints these; a test checks the weight bytes against what a rank
// actually reads from the checkpoint.
#pragma once

#include <array>
#include <cstdint>
#include <functional>

#include "model/weight_layout.h"
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

}  // namespace hlm
