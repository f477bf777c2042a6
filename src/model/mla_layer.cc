#include "model/mla_layer.h"

#include <cmath>

#include <fmt/format.h>

namespace hlm {

namespace {
// kv_a_layernorm and q_a_layernorm use the RMSNorm class default, not rms_norm_eps (MODEL.md §4).
constexpr float kLatentNormEps = 1e-6f;
}  // namespace

MlaLayer::MlaLayer(const LayerEnv& env, int layer, WeightSource& w) {
  const ModelConfig& c = env.cfg;
  const std::string k = fmt::format("layers.{}.mla.", layer);
  tp_heads_ = env.mapping.mla_tp_heads(c.mla_heads).size();
  chunk_heads_ = env.mapping.mla_chunk_heads(c.mla_heads).size();
  const int64_t qk = c.qk_head_dim(), lat = c.kv_lora_rank;

  if (c.q_lora_rank == 0) {
    q_proj_ = w.load(k + "q_proj").reshape({tp_heads_ * qk, c.hidden_size});
  } else {
    q_a_ = w.load(k + "q_a");
    q_a_norm_ = w.load(k + "q_a_norm");
    q_b_ = w.load(k + "q_b").reshape({tp_heads_ * qk, c.q_lora_rank});
  }
  kv_a_ = w.load(k + "kv_a");
  kv_a_norm_ = w.load(k + "kv_a_norm");
  w_uk_ = w.load(k + "w_uk");  // [H/tp, nope, L]
  w_uv_ = w.load(k + "w_uv");  // [H/N, v, L], applied transposed
  if (c.mla_output_gate) g_proj_ = w.load(k + "g_proj");
  o_proj_ = w.load(k + "o_proj");
  check_shape(w_uk_, {tp_heads_, c.qk_nope_head_dim, lat}, "MLA W_UK shard");
  check_shape(w_uv_, {chunk_heads_, c.v_head_dim, lat}, "MLA W_UV shard");
  check_shape(o_proj_, {c.hidden_size, chunk_heads_ * c.v_head_dim}, "MLA o_proj shard");
}

void MlaLayer::allocate_cache(const LayerEnv& env, int64_t pages, int64_t tokens_per_block) {
  cache_ =
      env.ops.zeros({pages, tokens_per_block, env.cfg.mla_cache_dim()}, env.ops.weight_dtype(DType::kBF16));
}

Tensor MlaLayer::project_queries(const LayerEnv& env, const Tensor& x) {
  const ModelConfig& c = env.cfg;
  Ops& ops = env.ops;
  const int64_t t = x.dim(0), nope = c.qk_nope_head_dim, qk = c.qk_head_dim();
  Tensor q = c.q_lora_rank == 0
                 ? ops.linear(x, q_proj_)
                 : ops.linear(ops.rms_norm(ops.linear(x, q_a_), q_a_norm_, kLatentNormEps), q_b_);
  q = q.reshape({t, tp_heads_, qk});                                  // [T, H/tp, nope + R]
  Tensor q_abs = ops.head_matmul(ops.slice_last(q, 0, nope), w_uk_);  // [T, H/tp, L]
  return ops.concat_last(q_abs, ops.slice_last(q, nope, qk));         // [T, H/tp, L + R]
}

Tensor MlaLayer::forward(const LayerEnv& env, const Tensor& x, const StepContext& ctx) {
  const ModelConfig& c = env.cfg;
  Ops& ops = env.ops;
  const int64_t t = x.dim(0), lat = c.kv_lora_rank, dim = c.mla_cache_dim(), cp = env.mapping.cp;

  Tensor q = project_queries(env, x);  // [T, H/tp, L + R]

  Tensor ckv = ops.linear(x, kv_a_);                                                      // [T, L + R]
  Tensor latent = ops.rms_norm(ops.slice_last(ckv, 0, lat), kv_a_norm_, kLatentNormEps);  // [T, L]
  Tensor entry = ops.concat_last(latent, ops.slice_last(ckv, lat, dim));                  // [T, L + R]
  ops.cache_write(entry, ctx.write_slots, cache_);

  const float scale = 1.0f / std::sqrt(static_cast<float>(c.qk_head_dim()));
  Tensor part = ops.empty({t, tp_heads_, lat}, DType::kF32);  // [T, H/tp, L]
  Tensor stats = ops.empty({t, tp_heads_, 2}, DType::kF32);   // [T, H/tp, 2]
  ops.mla_attention(q, cache_, ctx.page_table, ctx.mla, ctx.kv_len, scale, lat, part, stats);

  Tensor context = part;  // [T, H/N, L]
  if (cp > 1) {
    // Chunk j of the tp-local heads goes to CP peer j; what comes back is this rank's chunk r' from
    // every peer, merged exactly.
    const Tensor parts =
        ops.transpose01(part.reshape({t, cp, chunk_heads_ * lat})).reshape({cp, t, chunk_heads_, lat});
    const Tensor part_stats =
        ops.transpose01(stats.reshape({t, cp, chunk_heads_ * 2})).reshape({cp, t, chunk_heads_, 2});
    context = env.comm.all_to_all_lse_combine(
        parts, part_stats, CommGroup::kCp,
        [&ops](const Tensor& p, const Tensor& s) { return ops.lse_combine(p, s); });  // [T, Hc, L]
  }
  Tensor heads = ops.head_matmul(context, w_uv_, /*w_transposed=*/true)
                     .reshape({t, chunk_heads_ * c.v_head_dim});  // [T, H/N·v]
  if (g_proj_.defined()) ops.sigmoid_gate_inplace(heads, ops.linear(x, g_proj_));
  Tensor out = ops.linear(heads, o_proj_);  // [T, hidden] partial
  env.comm.all_reduce_sum(out, CommGroup::kWorld);
  return out;
}

}  // namespace hlm
