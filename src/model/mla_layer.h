// Multi-head Latent Attention layer (docs/MODEL.md §6) in the weight-absorbed form over the paged latent
// cache, with Helix decode context parallelism built in (docs/HELIX.md §3): queries for the tp-local
// heads, local partial attention with (max, sum) stats over the pages this rank owns, an all-to-all over
// the CP group that hands each rank its head chunk r', the exact LSE combine, W_UV and the o_proj shard of
// that chunk, and one all-reduce over N. With cp = 1 the all-to-all and combine drop out; the same code
// serves prefill (causality is a per-query visible-key count) and decode.
#pragma once

#include "model/fused_projection.h"
#include "model/layer_env.h"
#include "model/step_context.h"
#include "model/weight_source.h"

namespace hlm {

class MlaLayer {
 public:
  MlaLayer(const LayerEnv& env, int layer, WeightSource& weights);

  // x: input-normed hidden [T, hidden] -> attention output [T, hidden], complete on every rank.
  Tensor forward(const LayerEnv& env, const Tensor& x, const StepContext& ctx);

  void allocate_cache(const LayerEnv& env, int64_t pages, int64_t tokens_per_block);
  void randomize_cache(const LayerEnv& env, uint64_t seed) {
    env.ops.random_fill(cache_, RandomFill{1.0f, 0.0f, 0, 255, seed});
  }

 private:
  // x [T, hidden] and in_proj_'s output for it -> absorbed queries [T, H/tp, L + R]
  Tensor project_queries(const LayerEnv& env, const Tensor& x, const Tensor& proj);

  int64_t tp_heads_ = 0;     // H / tp: heads whose queries this rank projects
  int64_t chunk_heads_ = 0;  // H / N: heads this rank finishes after the all-to-all
  // Every projection of the layer input in one GEMM: q_proj [H/tp·qk] (q-LoRA: q_a [r]), kv_a [L + R] and
  // K3's output gate g_proj [H/N·v].
  FusedProjection in_proj_;
  Tensor q_a_norm_;   // [r]
  Tensor q_b_;        // [H/tp·qk, r]
  Tensor kv_a_norm_;  // [L]
  Tensor w_uk_;       // [H/tp, nope, L]
  Tensor w_uv_;       // [H/N, v, L]
  Tensor o_proj_;     // [hidden, H/N·v]
  Tensor cache_;      // [pages, P, L + R]: normalized latent c | k_pe of the tokens this rank owns
};

}  // namespace hlm
