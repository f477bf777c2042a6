// Multi-head Latent Attention layer (docs/MODEL.md §6) in the weight-absorbed form over the paged latent
// cache, with Helix decode context parallelism built in (docs/HELIX.md §3): queries for the tp-local
// heads, local partial attention with (max, sum) stats over the pages this rank owns, an all-to-all over
// the CP group that hands each rank its head chunk r', the exact LSE combine, W_UV and the o_proj shard of
// that chunk, and one all-reduce over N. With cp = 1 the all-to-all and combine drop out; the same code
// serves prefill (causality is a per-query visible-key count) and decode.
// Prefill chunks of many queries may instead run the expanded (MHA) form of §6.1 (docs/KERNELS.md §6):
// the sequence's keys gathered in chunks of kMlaExpandedKeyChunk, expanded per head through W_UK and W_UV,
// and attended with 640 instead of 2,176 FLOP per (query, key, head). With cp > 1 a rank holds W_UV for
// its head chunk only, so CP layouts keep the absorbed form.
#pragma once

#include <vector>

#include "model/fused_projection.h"
#include "model/layer_env.h"
#include "model/step_context.h"
#include "model/weight_source.h"

namespace hlm {

// Whether the expanded form can run: cp = 1 (under CP a rank holds W_UV for its head chunk only) and head
// shapes the GPU kernel is built for (ops.h mla_expanded_heads_supported).
bool mla_expanded_applies(const ModelConfig& c, int cp);

// Keys per gathered and expanded chunk of the expanded form (step scratch: memory_plan.cc counts it).
constexpr int64_t kMlaExpandedKeyChunk = 8192;

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
  // x [T, hidden] and in_proj_'s output for it -> queries [T, H/tp, nope + R]
  Tensor project_queries(const LayerEnv& env, const Tensor& x, const Tensor& proj);
  // Per sequence of ctx.mla, whether it runs the expanded form (ctx.mla_prefill, or the cost model for
  // kAuto).
  std::vector<bool> expanded_seqs(const LayerEnv& env, const StepContext& ctx) const;
  // Queries (absorbed [T, H/tp, L + R], expanded [T, H/tp, nope + R]) -> the heads' attention outputs
  // [T, H/N·v] (absorbed: with the CP merge and W_UV) of the sequences `seqs` (absorbed) or of those marked
  // in `expanded`; the other rows come out 0.
  Tensor absorbed_attention(const LayerEnv& env, const Tensor& q, const MlaBatch& seqs,
                            const StepContext& ctx, float scale);
  Tensor expanded_attention(const LayerEnv& env, const Tensor& q, const StepContext& ctx,
                            const std::vector<bool>& expanded, float scale);

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
