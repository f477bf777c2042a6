#include "model/ffn_layer.h"

#include <fmt/format.h>

#include "model/host_transforms.h"
#include "weights/mxfp4.h"

namespace hlm {

ActivationParams activation_params(const ModelConfig& cfg) {
  ActivationParams a;
  a.kind = cfg.hidden_act;
  a.situ_beta = static_cast<float>(cfg.situ_beta);
  a.situ_linear_beta = static_cast<float>(cfg.situ_linear_beta);
  return a;
}

namespace {

// One routed expert matrix of this rank as F32: read directly, or dequantized from MXFP4 (K3).
Tensor read_expert_matrix(WeightReader& w, const ModelConfig& c, const std::string& key) {
  if (!c.mxfp4_experts) return w.read(key);
  return dequantize_mxfp4(w.read_raw(key + ".packed"), w.read_raw(key + ".scale"),
                          w.spec(key + ".packed").name);
}

}  // namespace

Tensor GluMlp::partial(Ops& ops, const Tensor& x, const ActivationParams& act) const {
  Tensor h = ops.glu(ops.linear(x, gate), ops.linear(x, up), act);  // [T, I_local]
  return ops.linear(h, down);                                       // [T, hidden]
}

DenseLayer::DenseLayer(const LayerEnv& env, int layer, WeightReader& w) {
  const std::string k = fmt::format("layers.{}.mlp.", layer);
  mlp_.gate = env.ops.upload(w.read(k + "gate_proj"));
  mlp_.up = env.ops.upload(w.read(k + "up_proj"));
  mlp_.down = env.ops.upload(w.read(k + "down_proj"));
}

Tensor DenseLayer::forward(const LayerEnv& env, const Tensor& x) {
  Tensor out = mlp_.partial(env.ops, x, activation_params(env.cfg));
  env.comm.all_reduce_sum(out, CommGroup::kWorld);
  return out;
}

MoeLayer::MoeLayer(const LayerEnv& env, int layer, WeightReader& w) {
  const ModelConfig& c = env.cfg;
  Ops& ops = env.ops;
  const std::string k = fmt::format("layers.{}.moe.", layer);
  router_.top_k = c.experts_per_token;
  router_.num_expert_group = c.num_expert_group;
  router_.topk_group = c.topk_group;
  router_.renormalize = c.moe_renormalize;
  router_.scaling = static_cast<float>(c.routed_scaling_factor);
  gate_ = ops.upload(w.read(k + "gate"));
  bias_ = ops.upload(w.read(k + "bias"));

  Range experts = env.mapping.experts(c.num_experts);
  expert_begin_ = experts.begin;
  std::vector<Tensor> gates, ups, downs;
  for (int64_t e = experts.begin; e < experts.end; ++e) {
    const std::string ek = fmt::format("{}experts.{}.", k, e);
    gates.push_back(read_expert_matrix(w, c, ek + "w1"));
    ups.push_back(read_expert_matrix(w, c, ek + "w3"));
    downs.push_back(read_expert_matrix(w, c, ek + "w2"));
  }
  w_gate_ = ops.upload(stack(gates));
  w_up_ = ops.upload(stack(ups));
  w_down_ = ops.upload(stack(downs));

  if (c.moe_latent_size > 0) {
    latent_down_ = ops.upload(w.read(k + "latent_down"));
    if (c.moe_latent_norm) latent_norm_ = ops.upload(w.read(k + "latent_norm"));
    latent_up_ = ops.upload(w.read(k + "latent_up"));
  }
  has_shared_ = c.num_shared_experts > 0;
  if (has_shared_) {
    shared_.gate = ops.upload(w.read(k + "shared_gate"));
    shared_.up = ops.upload(w.read(k + "shared_up"));
    shared_.down = ops.upload(w.read(k + "shared_down"));
  }
}

Tensor MoeLayer::forward(const LayerEnv& env, const Tensor& x) {
  Ops& ops = env.ops;
  const ActivationParams act = activation_params(env.cfg);
  Tensor idx, weights;  // [T, k] I32, [T, k] F32
  ops.moe_route(x, gate_, bias_, router_, idx, weights);
  if (!latent_down_.defined()) {
    Tensor out =
        ops.moe_experts(x, idx, weights, w_gate_, w_up_, w_down_, expert_begin_, act);  // [T, hidden]
    if (has_shared_) ops.add_inplace(out, shared_.partial(ops, x, act));
    env.comm.all_reduce_sum(out, CommGroup::kWorld);
    return out;
  }
  // Latent MoE (K3): the routed sum lives in the latent space and must be complete before its norm, so
  // the routed latent partials and the shared hidden partials are reduced together in one all-reduce.
  const int64_t width = latent_down_.dim(0);
  Tensor z = ops.linear(x, latent_down_);  // [T, latent]
  Tensor routed =
      ops.moe_experts(z, idx, weights, w_gate_, w_up_, w_down_, expert_begin_, act);  // [T, latent]
  Tensor both =
      has_shared_ ? ops.concat_last(routed, shared_.partial(ops, x, act)) : routed;  // [T, latent + hidden]
  env.comm.all_reduce_sum(both, CommGroup::kWorld);
  routed = ops.slice_last(both, 0, width);
  if (latent_norm_.defined())
    routed = ops.rms_norm(routed, latent_norm_, static_cast<float>(env.cfg.rms_norm_eps));
  Tensor out = ops.linear(routed, latent_up_);  // [T, hidden]
  if (has_shared_) ops.add_inplace(out, ops.slice_last(both, width, both.dim(1)));
  return out;
}

}  // namespace hlm
