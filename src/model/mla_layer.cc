#include "model/mla_layer.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace hlm {

namespace {
// kv_a_layernorm and q_a_layernorm use the RMSNorm class default, not rms_norm_eps (MODEL.md §4).
constexpr float kLatentNormEps = 1e-6f;
// The parts of MlaLayer::in_proj_ (kQ: q_proj, or q_a with q-LoRA).
enum InputPart : size_t { kQ, kKvA, kGate };
}  // namespace

MlaLayer::MlaLayer(const LayerEnv& env, int layer, WeightSource& w) {
  const ModelConfig& c = env.cfg;
  const std::string k = fmt::format("layers.{}.mla.", layer);
  tp_heads_ = env.mapping.mla_tp_heads(c.mla_heads).size();
  chunk_heads_ = env.mapping.mla_chunk_heads(c.mla_heads).size();
  const int64_t qk = c.qk_head_dim(), lat = c.kv_lora_rank;

  std::vector<FusedProjection::Part> parts = {{k + (c.q_lora_rank == 0 ? "q_proj" : "q_a")}, {k + "kv_a"}};
  if (c.mla_output_gate) parts.push_back({k + "g_proj"});
  in_proj_ = FusedProjection(env.ops, w, parts, c.hidden_size);
  if (c.q_lora_rank != 0) {
    q_a_norm_ = w.load(k + "q_a_norm");
    q_b_ = w.load(k + "q_b").reshape({tp_heads_ * qk, c.q_lora_rank});
  }
  HLM_CHECK(in_proj_.rows(kQ) == (c.q_lora_rank == 0 ? tp_heads_ * qk : c.q_lora_rank) &&
                in_proj_.rows(kKvA) == c.mla_cache_dim(),
            "MLA layer {}: query and kv_a shards of {} and {} rows do not match the config", layer,
            in_proj_.rows(kQ), in_proj_.rows(kKvA));
  kv_a_norm_ = w.load(k + "kv_a_norm");
  w_uk_ = w.load(k + "w_uk");  // [H/tp, nope, L]
  w_uv_ = w.load(k + "w_uv");  // [H/N, v, L], applied transposed
  o_proj_ = w.load(k + "o_proj");
  check_shape(w_uk_, {tp_heads_, c.qk_nope_head_dim, lat}, "MLA W_UK shard");
  check_shape(w_uv_, {chunk_heads_, c.v_head_dim, lat}, "MLA W_UV shard");
  check_shape(o_proj_, {c.hidden_size, chunk_heads_ * c.v_head_dim}, "MLA o_proj shard");
}

void MlaLayer::allocate_cache(const LayerEnv& env, int64_t pages, int64_t tokens_per_block) {
  cache_ =
      env.ops.zeros({pages, tokens_per_block, env.cfg.mla_cache_dim()}, env.ops.weight_dtype(DType::kBF16));
}

Tensor MlaLayer::project_queries(const LayerEnv& env, const Tensor& x, const Tensor& proj) {
  const ModelConfig& c = env.cfg;
  Ops& ops = env.ops;
  const int64_t t = x.dim(0), qk = c.qk_head_dim();
  Tensor q = in_proj_.part(ops, x, proj, kQ);  // [T, H/tp·qk] (q-LoRA: [T, r])
  if (c.q_lora_rank != 0) q = ops.linear(ops.rms_norm(q, q_a_norm_, kLatentNormEps), q_b_);
  return q.reshape({t, tp_heads_, qk});  // [T, H/tp, nope + R]
}

bool mla_expanded_applies(const ModelConfig& c, int cp) {
  return cp == 1 && mla_expanded_heads_supported(c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
}

std::vector<bool> MlaLayer::expanded_seqs(const LayerEnv& env, const StepContext& ctx) const {
  const ModelConfig& c = env.cfg;
  const std::vector<MlaSeq>& seqs = ctx.mla.seqs;
  std::vector<bool> expanded(seqs.size(), false);
  if (ctx.decode_only || ctx.mla_prefill == MlaPrefillForm::kAbsorbed) return expanded;
  const bool applies = mla_expanded_applies(c, env.mapping.cp);
  if (ctx.mla_prefill == MlaPrefillForm::kExpanded) {
    HLM_CHECK(applies,
              "the expanded MLA prefill needs cp = 1 (got {}) and heads (nope, R, V) of (128, 64, 128) or "
              "(16, 8, 16) (got ({}, {}, {}))",
              env.mapping.cp, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
    for (size_t i = 0; i < seqs.size(); ++i) expanded[i] = seqs[i].token_count > 0;
    return expanded;
  }
  if (!applies) return expanded;
  // Estimated seconds of each form for a sequence, at rates measured on an H200 (docs/benchmarks.md, "MLA
  // attention on wgmma"): the absorbed kernel at 280 TFLOP/s of its FLOPs; the expansion GEMMs, plus the
  // bytes each expanded key moves (gather, the latent copy, K and V written and read once); the expanded
  // kernel at 430 TFLOP/s. Causality halves both attention terms alike, so the estimate counts every
  // (query, key) pair. The forms break even near 165 queries of a sequence in the step: decode tokens and
  // short chunks stay absorbed.
  constexpr double kAbsorbedFlops = 280e12, kGemmFlops = 400e12, kExpandedFlops = 430e12, kBytesPerS = 3e12;
  const double h = static_cast<double>(tp_heads_), lat = static_cast<double>(c.kv_lora_rank);
  const double width = static_cast<double>(c.mla_cache_dim()), qk = static_cast<double>(c.qk_head_dim());
  const double nope = static_cast<double>(c.qk_nope_head_dim), vd = static_cast<double>(c.v_head_dim);
  const double key_bytes = 2.0 * (2.0 * width + lat + 2.0 * h * (nope + vd));
  const double page_size = static_cast<double>(cache_.dim(1));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const double keys = static_cast<double>(seqs[i].num_pages) * page_size;
    const double pairs = static_cast<double>(seqs[i].token_count) * keys * h;
    const double absorbed = pairs * 2.0 * (width + lat) / kAbsorbedFlops;
    const double expansion = keys * (h * 2.0 * lat * (nope + vd) / kGemmFlops + key_bytes / kBytesPerS);
    expanded[i] = seqs[i].token_count > 0 && expansion + pairs * 2.0 * (qk + vd) / kExpandedFlops < absorbed;
  }
  return expanded;
}

Tensor MlaLayer::absorbed_attention(const LayerEnv& env, const Tensor& q, const MlaBatch& seqs,
                                    const StepContext& ctx, float scale) {
  const ModelConfig& c = env.cfg;
  Ops& ops = env.ops;
  const int64_t t = q.dim(0), lat = c.kv_lora_rank, cp = env.mapping.cp;
  Tensor part = ops.empty({t, tp_heads_, lat}, DType::kF32);  // [T, H/tp, L]
  Tensor stats = ops.empty({t, tp_heads_, 2}, DType::kF32);   // [T, H/tp, 2]
  ops.mla_attention(q, cache_, ctx.page_table, seqs, ctx.kv_len, scale, lat, part, stats);

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
  return ops.head_matmul(context, w_uv_, /*w_transposed=*/true)
      .reshape({t, chunk_heads_ * c.v_head_dim});  // [T, H/N·v]
}

Tensor MlaLayer::expanded_attention(const LayerEnv& env, const Tensor& q, const StepContext& ctx,
                                    const std::vector<bool>& expanded, float scale) {
  const ModelConfig& c = env.cfg;
  Ops& ops = env.ops;
  const int64_t t = q.dim(0), lat = c.kv_lora_rank, nope = c.qk_nope_head_dim, vd = c.v_head_dim;
  const int64_t page_size = cache_.dim(1);
  const Tensor w_uk = w_uk_.reshape({tp_heads_ * nope, lat});  // [H·nope, L]
  const Tensor w_uv = w_uv_.reshape({tp_heads_ * vd, lat});    // [H·v, L] (cp = 1: H/N = H/tp)
  Tensor out = ops.zeros({t, tp_heads_, vd}, DType::kF32);     // [T, H, v]; other rows stay 0
  Tensor stats = ops.empty({t, tp_heads_, 2}, DType::kF32);    // [T, H, 2]
  for (size_t i = 0; i < ctx.mla.seqs.size(); ++i) {
    const MlaSeq& s = ctx.mla.seqs[i];
    if (!expanded[i]) continue;
    const int64_t end = s.token_begin + s.token_count, keys_total = s.num_pages * page_size;
    const Tensor q_s = q.slice(s.token_begin, end);
    const Tensor kv_len_s = ctx.kv_len.slice(s.token_begin, end);
    Tensor out_s = out.slice(s.token_begin, end), stats_s = stats.slice(s.token_begin, end);
    for (int64_t k0 = 0; k0 < keys_total; k0 += kMlaExpandedKeyChunk) {
      const int64_t n = std::min(kMlaExpandedKeyChunk, keys_total - k0);
      const Tensor keys = ops.mla_gather_keys(cache_, ctx.page_table, s, k0, n);     // [n, L + R]
      const Tensor latent = ops.slice_last(keys, 0, lat);                            // [n, L]
      const Tensor k_nope = ops.linear(latent, w_uk).reshape({n, tp_heads_, nope});  // [n, H, nope]
      const Tensor v = ops.linear(latent, w_uv).reshape({n, tp_heads_, vd});         // [n, H, v]
      ops.mla_expanded_attention(q_s, k_nope, v, keys, lat, kv_len_s, k0, scale, k0 > 0, out_s, stats_s);
    }
  }
  return out.reshape({t, tp_heads_ * vd});  // [T, H·v]
}

Tensor MlaLayer::forward(const LayerEnv& env, const Tensor& x, const StepContext& ctx) {
  const ModelConfig& c = env.cfg;
  Ops& ops = env.ops;
  const int64_t lat = c.kv_lora_rank;

  const Tensor proj = in_proj_.forward(ops, x);  // up to 16 rows: [T, H/tp·qk (or r) + L + R (+ H/N·v)]
  const Tensor ckv = in_proj_.part(ops, x, proj, kKvA);  // [T, L + R]
  // Each sequence runs the form its cost picks; a step may hold both (a prompt chunk beside decodes).
  const std::vector<bool> expanded = expanded_seqs(env, ctx);
  bool any_expanded = false, any_absorbed = false;
  for (size_t i = 0; i < expanded.size(); ++i) {
    any_expanded = any_expanded || expanded[i];
    any_absorbed = any_absorbed || (!expanded[i] && ctx.mla.seqs[i].token_count > 0);
  }
  Tensor q = project_queries(env, x, proj);  // [T, H/tp, nope + R]
  // The new latent cache rows go out on the step's own stream, with the absorbed queries where the step
  // needs them (one launch on a device backend, neither waiting for the other). Written on a side stream and
  // joined before the attention, they kept the attention from launching early (traced: it started only
  // once the query absorption had ended), and so from loading its older key tiles while the absorption
  // runs. Measured on an H200 (48B, batch 1): from q|kv_a's end to the attention's 14.6 µs against 15.4
  // (bench --kernel-trace at 4K, medians over the 7 layers, one trace each); alternating with the
  // side-stream form in one call, the step 2.412-2.415 ms against 2.411-2.424 at 4K (within its noise),
  // 2.720-2.731 against 2.732-2.765 at 128K, 4.318 against 4.353 at 1M; K3's first 4 layers at 128K, batch
  // 8, 5.483 against 5.532.
  Tensor q_abs;  // [T, H/tp, L + R]
  if (any_absorbed || !any_expanded) {
    q_abs = ops.mla_write_and_absorb(ckv, lat, kv_a_norm_, kLatentNormEps, ctx.write_slots, cache_, q, w_uk_);
  } else {
    ops.mla_cache_write(ckv, lat, kv_a_norm_, kLatentNormEps, ctx.write_slots, cache_);
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(c.qk_head_dim()));
  Tensor heads;  // [T, H/N·v]
  if (!any_expanded) {
    heads = absorbed_attention(env, q_abs, ctx.mla, ctx, scale);
  } else {
    heads = expanded_attention(env, q, ctx, expanded, scale);
    if (any_absorbed) {
      // The absorbed sequences alone (the others' rows come out 0); the two results share no row.
      std::vector<MlaSeq> rest;
      for (size_t i = 0; i < expanded.size(); ++i) {
        if (!expanded[i]) rest.push_back(ctx.mla.seqs[i]);
      }
      MlaBatch batch(rest);
      batch.table = ops.upload(mla_batch_table(rest));
      ops.add_inplace(heads, absorbed_attention(env, q_abs, batch, ctx, scale));
    }
  }
  if (c.mla_output_gate) ops.sigmoid_gate_inplace(heads, in_proj_.part(ops, x, proj, kGate));
  Tensor out = ops.linear(heads, o_proj_);  // [T, hidden] partial
  env.comm.all_reduce_sum(out, CommGroup::kWorld);
  return out;
}

}  // namespace hlm
