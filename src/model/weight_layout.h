// The shard plan: one table naming every checkpoint tensor the model uses, its stored shape, and how it
// splits across the ranks of a Mapping (docs/HELIX.md §2). The loader reads exactly the box this table
// gives for a rank, `inspect` counts parameters and bytes from it, and `plan` sizes a deployment from it
// without any weights, so the three can never disagree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "base/tensor.h"
#include "config/model_config.h"
#include "parallel/mapping.h"
#include "weights/safetensors.h"

namespace hlm {

enum class WeightCategory {
  kEmbedding,
  kLmHead,
  kNorm,
  kKda,
  kMla,
  kDenseMlp,
  kRouter,
  kRoutedExperts,
  kSharedExperts,
  kLatentMoe,  // K3: the projections around the routed experts
  kAttnRes,    // K3: block attention residual weights
};
const char* weight_category_name(WeightCategory c);
constexpr int kNumWeightCategories = 11;

// Which rank index splits `split_dim` of the view, evenly.
enum class ShardBy {
  kNone,   // replicated
  kWorld,  // over N = tp·cp by the repurposed rank r'
  kTp,     // over tp by tp_rank (MLA query heads)
  kMoeTp,  // over moe_tp inside an expert
};

struct WeightSpec {
  std::string key;                     // logical name the layers ask for, e.g. "layers.3.mla.w_uv"
  std::string name;                    // checkpoint tensor name
  std::vector<std::string> alt_names;  // other names the same tensor is stored under
  Shape shape;                         // stored shape
  Shape view;                          // reshape used for the box (empty: shape)
  int split_dim = 0;
  ShardBy by = ShardBy::kNone;
  // (view dim, [begin, end)) always taken; a split of the same dim divides this range.
  std::vector<std::pair<int, std::pair<int64_t, int64_t>>> fixed;
  // How stored elements relate to model parameters: MXFP4 codes hold two parameters per byte, their
  // group scales are not parameters.
  enum class Storage { kPlain, kMxfp4Codes, kMxfp4Scales };
  Storage storage = Storage::kPlain;
  int64_t expert = -1;      // routed expert index: held only by the EP rank owning it
  int64_t num_experts = 0;  // the layer's routed experts (with `expert`)
  WeightCategory category = WeightCategory::kNorm;
  DType typical_dtype = DType::kBF16;  // the published checkpoint's dtype, for planning without weights
  int layer = -1;
};

// Every tensor of the model described by `cfg`, in a stable order.
std::vector<WeightSpec> weight_layout(const ModelConfig& cfg);

// The part of `spec` rank `m` holds, or nullopt if it holds none of it.
std::optional<TensorBox> rank_box(const WeightSpec& spec, const Mapping& m);

// Elements inside a box of `spec` (the whole tensor when `box` is empty), and the box's shape (what a read
// of it returns).
int64_t box_numel(const WeightSpec& spec, const TensorBox& box);
Shape box_shape(const WeightSpec& spec, const TensorBox& box);

// Model parameters a stored tensor of `spec` holds (its elements, unpacked for MXFP4 codes).
int64_t stored_parameters(const WeightSpec& spec);

// The name `spec`'s tensor has in `ckpt`: its own, or the first of its aliases present. When none is
// present: its own name if it has no aliases (a lookup then reports it missing), else an error naming
// every name looked for.
const std::string& stored_name(const Checkpoint& ckpt, const WeightSpec& spec);

// The header of `spec`'s tensor in `ckpt`, checked against the spec: the shape the config (`cfg_source`,
// for messages) implies, and a dtype the loader reads for it (F32, F16 or BF16 for a float weight, U8 for
// MXFP4 codes and scales). Errors name the tensor, its file and what would be valid. The loader, `inspect`
// and `plan -m` check a checkpoint with it before reading any weight.
const TensorInfo& checked_tensor(const Checkpoint& ckpt, const WeightSpec& spec,
                                 const std::string& cfg_source);

}  // namespace hlm
