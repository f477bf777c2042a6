#include "model/ffn_layer.h"

#include <fmt/format.h>

namespace hlm {

ActivationParams activation_params(const ModelConfig& cfg) {
  ActivationParams a;
  a.kind = cfg.hidden_act;
  a.situ_beta = static_cast<float>(cfg.situ_beta);
  a.situ_linear_beta = static_cast<float>(cfg.situ_linear_beta);
  return a;
}

namespace {

// One matrix (w1, w2 or w3) of this rank's experts stacked into [E_l, rows, cols]: the stored dtype, or
// (K3) the MXFP4 codes and their group scales, kept packed.
void load_experts(WeightSource& w, Ops& ops, const std::string& prefix, Range experts, const char* which,
                  Tensor& stacked, Tensor& scales) {
  auto key = [&](int64_t e) { return fmt::format("{}experts.{}.{}", prefix, e, which); };
  const bool mxfp4 = w.has(key(experts.begin) + ".packed");
  const std::string codes_key = mxfp4 ? key(experts.begin) + ".packed" : key(experts.begin);
  Shape shape = w.shard_shape(codes_key);
  shape.insert(shape.begin(), experts.size());
  stacked = ops.empty(shape, mxfp4 ? DType::kU8 : ops.weight_dtype(w.stored_dtype(codes_key)));
  if (mxfp4) {
    Shape scale_shape = w.shard_shape(key(experts.begin) + ".scale");
    scale_shape.insert(scale_shape.begin(), experts.size());
    scales = ops.empty(scale_shape, DType::kU8);
  }
  for (int64_t e = experts.begin; e < experts.end; ++e) {
    if (mxfp4) {
      w.load_into(key(e) + ".packed", stacked[e - experts.begin]);
      w.load_into(key(e) + ".scale", scales[e - experts.begin]);
    } else {
      w.load_into(key(e), stacked[e - experts.begin]);
    }
  }
}

}  // namespace

void GluMlp::load(Ops& ops, WeightSource& w, const std::string& prefix, const char* gate_name,
                  const char* up_name, const char* down_name) {
  const std::string gate_key = prefix + gate_name, up_key = prefix + up_name;
  const Shape shape = w.shard_shape(gate_key);  // [I_local, hidden]
  HLM_CHECK(shape.size() == 2 && w.shard_shape(up_key) == shape,
            "tensors '{}' and '{}': the gate and up projections must have one 2-D shape, got {} and {}",
            w.spec(gate_key).name, w.spec(up_key).name, shape_str(shape), shape_str(w.shard_shape(up_key)));
  gate_up = ops.empty({2 * shape[0], shape[1]}, ops.weight_dtype(w.stored_dtype(gate_key)));
  w.load_into(gate_key, gate_up.slice(0, shape[0]));
  w.load_into(up_key, gate_up.slice(shape[0], 2 * shape[0]));
  down = w.load(prefix + down_name);
}

Tensor GluMlp::partial(Ops& ops, const Tensor& x, const ActivationParams& act) const {
  Tensor h = ops.linear_glu(x, gate_up, act);  // [T, I_local]
  return ops.linear(h, down);                  // [T, hidden]
}

DenseLayer::DenseLayer(const LayerEnv& env, int layer, WeightSource& w) {
  mlp_.load(env.ops, w, fmt::format("layers.{}.mlp.", layer), "gate_proj", "up_proj", "down_proj");
}

Tensor DenseLayer::forward(const LayerEnv& env, const Tensor& x) {
  Tensor out = mlp_.partial(env.ops, x, activation_params(env.cfg));
  env.comm.all_reduce_sum(out, CommGroup::kWorld);
  return out;
}

MoeLayer::MoeLayer(const LayerEnv& env, int layer, WeightSource& w) {
  const ModelConfig& c = env.cfg;
  Ops& ops = env.ops;
  const std::string k = fmt::format("layers.{}.moe.", layer);
  router_.top_k = c.experts_per_token;
  router_.num_expert_group = c.num_expert_group;
  router_.topk_group = c.topk_group;
  router_.renormalize = c.moe_renormalize;
  router_.scaling = static_cast<float>(c.routed_scaling_factor);
  gate_ = w.load(k + "gate");
  bias_ = w.load(k + "bias");

  const Range experts = env.mapping.experts(c.num_experts);
  expert_begin_ = experts.begin;
  load_experts(w, ops, k, experts, "w1", experts_.gate, experts_.gate_scale);
  load_experts(w, ops, k, experts, "w3", experts_.up, experts_.up_scale);
  load_experts(w, ops, k, experts, "w2", experts_.down, experts_.down_scale);

  if (c.moe_latent_size > 0) {
    latent_down_ = w.load(k + "latent_down");
    if (c.moe_latent_norm) latent_norm_ = w.load(k + "latent_norm");
    latent_up_ = w.load(k + "latent_up");
  }
  has_shared_ = c.num_shared_experts > 0;
  if (has_shared_) {
    shared_.load(ops, w, k, "shared_gate", "shared_up", "shared_down");
  }
}

Tensor MoeLayer::forward(const LayerEnv& env, const Tensor& x) {
  Ops& ops = env.ops;
  const ActivationParams act = activation_params(env.cfg);
  // The shared experts' GEMMs (bandwidth-bound) run beside the router's chain of small kernels. (Measured
  // on an H200 and dropped: joining only after the routed experts, their sum added by add_inplace, so that
  // the routed GEMMs need not wait for the shared ones: the 48B MoE layer took 60.8 against 59.9 µs at
  // batch 1, the 4K batch-1 step 2.844-2.879 against 2.814-2.823 ms. And joining inside moe_experts_add
  // just before its combine kernel, no launch added: the MoE layer 59.5-59.6 against 59.3-59.6 µs at batch
  // 1, the step 2.735-2.754 against 2.725-2.761 ms, batch 8 7.80-7.92 against 7.80-7.84.) What they cost
  // beside the routed experts' decode kernel, measured by leaving them out (48B, 4K, H200): the batch-1
  // step 2.58-2.59 against 2.48-2.49 ms without them, about the time of their 14 MB at the copy bandwidth
  // (3.3 µs a layer), so folding them into that kernel as one more expert would gain little.
  Tensor shared;  // [T, hidden] partial
  if (has_shared_) {
    ops.begin_side();
    shared = shared_.partial(ops, x, act);
    ops.end_side();
  }
  Tensor idx, weights;  // [T, k] I32, [T, k] F32
  ops.moe_route(x, gate_, bias_, router_, idx, weights);
  if (has_shared_) ops.join_side();
  if (!latent_down_.defined()) {
    Tensor out = has_shared_ ? ops.moe_experts_add(x, idx, weights, experts_, expert_begin_, act, shared)
                             : ops.moe_experts(x, idx, weights, experts_, expert_begin_, act);  // [T, hidden]
    env.comm.all_reduce_sum(out, CommGroup::kWorld);
    return out;
  }
  // Latent MoE (K3): the routed sum lives in the latent space and must be complete before its norm, so
  // the routed latent partials and the shared hidden partials are reduced together in one all-reduce.
  const int64_t width = latent_down_.dim(0);
  Tensor z = ops.linear(x, latent_down_);                                          // [T, latent]
  Tensor routed = ops.moe_experts(z, idx, weights, experts_, expert_begin_, act);  // [T, latent]
  Tensor both = has_shared_ ? ops.concat_last(routed, shared) : routed;            // [T, latent + hidden]
  env.comm.all_reduce_sum(both, CommGroup::kWorld);
  routed = ops.slice_last(both, 0, width);
  if (latent_norm_.defined())
    routed = ops.rms_norm(routed, latent_norm_, static_cast<float>(env.cfg.rms_norm_eps));
  Tensor out = ops.linear(routed, latent_up_);  // [T, hidden]
  if (has_shared_) ops.add_inplace(out, ops.slice_last(both, width, both.dim(1)));
  return out;
}

}  // namespace hlm
