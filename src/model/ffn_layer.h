// FFN layers (docs/MODEL.md §7): the dense SwiGLU MLP and the MoE (fp32 sigmoid router, routed experts,
// shared experts). Under Helix (docs/HELIX.md §8) the dense MLP and the shared experts are tensor-parallel
// over N by r', the routed experts expert-parallel over N, the router replicated; the routed and shared
// partial sums are added locally and completed by one all-reduce.
#pragma once

#include "model/layer_env.h"
#include "model/weight_source.h"

namespace hlm {

// act(x·gateᵀ) ⊙ (x·upᵀ) · downᵀ with this rank's rows of the intermediate; a partial sum under TP. gate
// and up live in one tensor, so one GEMM computes both (one weight stream and one launch fewer per step).
struct GluMlp {
  Tensor gate_up;  // [2·I_local, hidden]: the gate rows, then the up rows
  Tensor down;     // [hidden, I_local]

  // Loads the checkpoint's gate, up and down tensors (keys prefix + names) of this rank.
  void load(Ops& ops, WeightSource& w, const std::string& prefix, const char* gate_name, const char* up_name,
            const char* down_name);
  Tensor partial(Ops& ops, const Tensor& x, const ActivationParams& act) const;
};

class DenseLayer {
 public:
  DenseLayer(const LayerEnv& env, int layer, WeightSource& weights);
  Tensor forward(const LayerEnv& env, const Tensor& x);  // [T, hidden] -> [T, hidden]

 private:
  GluMlp mlp_;
};

class MoeLayer {
 public:
  MoeLayer(const LayerEnv& env, int layer, WeightSource& weights);
  Tensor forward(const LayerEnv& env, const Tensor& x);  // [T, hidden] -> [T, hidden]

 private:
  RouterParams router_;
  Tensor gate_;  // [E, hidden], replicated
  Tensor bias_;  // [E]
  int64_t expert_begin_ = 0;
  // [E_local, I_local, width] gate/up and [E_local, width, I_local] down; width = hidden, or the latent
  // width (K3); MXFP4 codes and scales for K3.
  ExpertWeights experts_;
  Tensor latent_down_;  // [latent, hidden] (K3 latent MoE)
  Tensor latent_norm_;  // [latent]
  Tensor latent_up_;    // [hidden, latent]
  bool has_shared_ = false;
  GluMlp shared_;
};

ActivationParams activation_params(const ModelConfig& cfg);

}  // namespace hlm
