// Kimi Delta Attention layer (docs/MODEL.md §5), written once for any rank layout: this rank runs its
// Hk/N heads (HELIX.md §7) end to end and the row-split o_proj partial sums are all-reduced over N.
// It owns its per-sequence state: the conv window and the fp32 recurrent state, sized by local heads.
#pragma once

#include "model/fused_projection.h"
#include "model/layer_env.h"
#include "model/step_context.h"
#include "model/weight_source.h"

namespace hlm {

class KdaLayer {
 public:
  KdaLayer(const LayerEnv& env, int layer, WeightSource& weights);

  // x: input-normed hidden [T, hidden] -> attention output [T, hidden], complete on every rank.
  Tensor forward(const LayerEnv& env, const Tensor& x, const StepContext& ctx);

  void allocate_state(const LayerEnv& env, int32_t slots);
  void reset_slot(const LayerEnv& env, int32_t slot);
  void randomize_state(const LayerEnv& env, uint64_t seed);
  int64_t state_bytes_per_slot() const {
    return static_cast<int64_t>(conv_state_[0].nbytes() + recurrent_state_[0].nbytes());
  }

 private:
  int64_t heads_ = 0;  // local heads
  int64_t head_dim_ = 0;
  // Every projection of the layer input in one GEMM: q, k and v of this rank's heads [3·Dl], f_a [K],
  // the output gate's g_a [K] (K3: its full-rank g_proj [Dl]) and b_proj [Hl] (kInputParts order).
  FusedProjection in_proj_;
  Tensor conv_;             // [3·Dl, W]
  KdaHeadParams head_;      // A_log [Hl], dt_bias [Dl], the gate's lower bound, o_norm [K] and its eps
  Tensor f_b_;              // [Dl, K]
  Tensor g_b_;              // [Dl, K] (low-rank output gate; undefined with K3's g_proj)
  Tensor o_proj_;           // [hidden, Dl]
  Tensor conv_state_;       // [slots, 3·Dl, W-1]
  Tensor recurrent_state_;  // [slots, Hl, K, V] fp32
};

}  // namespace hlm
