// Load-time rearrangements of host F32 weights into the layouts the ops want (fused projections, stacked
// experts, per-head transposes). They run once per weight, before upload, so they are plain loops.
#pragma once

#include <vector>

#include "base/tensor.h"

namespace hlm {

// Concatenates tensors along dimension 0; trailing dimensions must agree.
Tensor concat_rows(const std::vector<Tensor>& parts);
// Stacks equally shaped tensors along a new leading dimension.
Tensor stack(const std::vector<Tensor>& parts);
// [H, a, b] -> [H, b, a]
Tensor transpose_last2(const Tensor& t);

}  // namespace hlm
