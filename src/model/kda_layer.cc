#include "model/kda_layer.h"

#include <fmt/format.h>

namespace hlm {

namespace {

// K3 pads A_log to a multiple of 128 entries; non-zero padding means the file is not what we think it is.
void check_a_log_padding(const Tensor& tail, const std::string& name) {
  const float* p = tail.data<float>();
  for (int64_t i = 0; i < tail.numel(); ++i) {
    HLM_CHECK(p[i] == 0.0f, "tensor '{}': padding entry {} past the KDA heads is {}, expected 0", name, i,
              p[i]);
  }
}

// The parts of KdaLayer::in_proj_.
enum InputPart : size_t { kQ, kK, kV, kFa, kGateA, kBeta };

}  // namespace

KdaLayer::KdaLayer(const LayerEnv& env, int layer, WeightSource& w) {
  const ModelConfig& c = env.cfg;
  Ops& ops = env.ops;
  const std::string k = fmt::format("layers.{}.kda.", layer);
  heads_ = env.mapping.kda_heads(c.kda_heads).size();
  head_dim_ = c.kda_head_dim;
  const int64_t dl = heads_ * head_dim_;

  in_proj_ = FusedProjection(ops, w,
                             {{k + "q_proj", true},
                              {k + "k_proj", true},
                              {k + "v_proj", true},
                              {k + "f_a"},
                              {k + (c.kda_full_rank_gate ? "g_proj" : "g_a")},
                              {k + "b_proj"}},
                             c.hidden_size);
  // The conv taps of q, k and v fused likewise, as the conv runs over the three as one block.
  conv_ = ops.empty({3 * dl, c.kda_conv_kernel}, ops.weight_dtype(w.stored_dtype(k + "q_conv")));
  const char* parts[] = {"q", "k", "v"};
  for (int64_t p = 0; p < 3; ++p) w.load_into(k + parts[p] + "_conv", conv_.slice(p * dl, (p + 1) * dl));
  head_.a_log = w.load(k + "a_log");
  head_.dt_bias = w.load(k + "dt_bias");
  head_.lower_bound = static_cast<float>(c.kda_gate_lower_bound);
  head_.eps = static_cast<float>(c.rms_norm_eps);
  f_b_ = w.load(k + "f_b");
  if (!c.kda_full_rank_gate) g_b_ = w.load(k + "g_b");
  if (w.has(k + "a_log_tail")) {
    check_a_log_padding(w.read_host_f32(k + "a_log_tail"), w.spec(k + "a_log_tail").name);
  }
  head_.o_norm = w.load(k + "o_norm");
  o_proj_ = w.load(k + "o_proj");
  HLM_CHECK(in_proj_.rows(kQ) == dl && in_proj_.rows(kK) == dl && in_proj_.rows(kV) == dl,
            "KDA layer {}: q, k and v shards of {}, {} and {} rows, expected {} each", layer,
            in_proj_.rows(kQ), in_proj_.rows(kK), in_proj_.rows(kV), dl);
  check_shape(f_b_, {dl, in_proj_.rows(kFa)}, "KDA f_b shard");
  check_shape(head_.a_log, {heads_}, "KDA A_log shard");
  check_shape(o_proj_, {c.hidden_size, dl}, "KDA o_proj shard");
}

void KdaLayer::allocate_state(const LayerEnv& env, int32_t slots) {
  const int64_t dl = heads_ * head_dim_;
  conv_state_ =
      env.ops.zeros({slots, 3 * dl, env.cfg.kda_conv_kernel - 1}, env.ops.weight_dtype(DType::kBF16));
  recurrent_state_ = env.ops.zeros({slots, heads_, head_dim_, head_dim_}, DType::kF32);
}

void KdaLayer::reset_slot(const LayerEnv& env, int32_t slot) {
  Tensor conv = conv_state_[slot];
  Tensor rec = recurrent_state_[slot];
  env.ops.fill_zero(conv);
  env.ops.fill_zero(rec);
}

void KdaLayer::randomize_state(const LayerEnv& env, uint64_t seed) {
  // Magnitudes of a state after many tokens of unit-norm keys: entries well inside (-1, 1).
  env.ops.random_fill(recurrent_state_, RandomFill{0.05f, 0.0f, 0, 255, seed});
  env.ops.random_fill(conv_state_, RandomFill{1.0f, 0.0f, 0, 255, seed ^ 0x5bd1e995u});
}

Tensor KdaLayer::forward(const LayerEnv& env, const Tensor& x, const StepContext& ctx) {
  Ops& ops = env.ops;
  const int64_t t = x.dim(0), hl = heads_, hd = head_dim_, dl = hl * hd;

  const Tensor proj = in_proj_.forward(ops, x);  // up to 16 rows: [T, 3·Dl + K + (K or Dl) + Hl]
  Tensor y;                                      // [T, Hl, V]
  const KdaProjColumns cols{in_proj_.column(kQ), in_proj_.column(kFa), in_proj_.column(kGateA),
                            in_proj_.column(kBeta)};
  if (ctx.decode_only && proj.defined() && cols.fa >= 0 && cols.gate >= 0 && cols.beta >= 0) {
    y = ops.kda_decode_layer(proj, cols, conv_, f_b_, g_b_, head_, ctx.seqs, conv_state_, recurrent_state_);
  } else {
    // The gates' low-rank second halves run beside the short conv.
    ops.begin_side();
    Tensor graw = ops.linear(in_proj_.part(ops, x, proj, kFa), f_b_);  // [T, Dl]
    Tensor beta_logits = in_proj_.part(ops, x, proj, kBeta);           // [T, Hl]
    Tensor gate = in_proj_.part(ops, x, proj, kGateA);                 // [T, K] (g_a) or [T, Dl] (g_proj)
    if (g_b_.defined()) gate = ops.linear(gate, g_b_);
    gate = gate.reshape({t, hl, hd});  // [T, Hl, V]
    ops.end_side();

    // q, k and v as three planes, each contiguous for the core without a copy.
    const Tensor qkv_in = in_proj_.parts(ops, x, proj, kQ, kV);  // [T, 3·Dl]
    const Tensor qkv =
        ops.short_conv_planes(qkv_in, conv_, ctx.seqs, conv_state_, 3);  // [3, T, Dl] after silu
    Tensor q = qkv[0].reshape({t, hl, hd});                              // [T, Hl, K]
    Tensor k = qkv[1].reshape({t, hl, hd});
    Tensor v = qkv[2].reshape({t, hl, hd});
    ops.join_side();

    if (ctx.decode_only) {
      y = ops.kda_decode_gated(q, k, v, graw, beta_logits, gate, head_, ctx.seqs, recurrent_state_);
    } else {
      Tensor g = ops.kda_gate(graw, head_.a_log, head_.dt_bias, head_.lower_bound)
                     .reshape({t, hl, hd});  // [T, Hl, K]
      Tensor o = ops.kda_prefill(q, k, v, g, ops.sigmoid(beta_logits), ctx.seqs, recurrent_state_);
      y = ops.gated_rms_norm(o, gate, head_.o_norm, head_.eps);
    }
  }
  Tensor out = ops.linear(y.reshape({t, dl}), o_proj_);  // [T, hidden], this rank's partial sum
  env.comm.all_reduce_sum(out, CommGroup::kWorld);
  return out;
}

}  // namespace hlm
