// Model: the Kimi Linear decoder (docs/MODEL.md §8.1) for one rank of a Mapping: embedding, the layer
// stack (KDA or MLA attention, dense or MoE FFN, pre-norm residuals, or K3's block attention residuals,
// §8.2) and the final norm + lm_head (vocab-parallel over N, gathered so every rank holds identical
// logits).
#pragma once

#include <memory>
#include <variant>
#include <vector>

#include "model/ffn_layer.h"
#include "model/kda_layer.h"
#include "model/mla_layer.h"

namespace hlm {

class Model {
 public:
  // Reads this rank's weights from `ckpt` (validated against the config first).
  Model(const ModelConfig& cfg, const Mapping& mapping, Ops& ops, Comm& comm, const Checkpoint& ckpt);
  // Loads this rank's weights from any source (a checkpoint, or random weights for benchmarks).
  Model(const ModelConfig& cfg, const Mapping& mapping, Ops& ops, Comm& comm, WeightSource& weights);

  // KDA state for `slots` sequences and `pages` MLA pages of `tokens_per_block` tokens on this rank.
  void allocate_caches(int32_t slots, int64_t pages, int64_t tokens_per_block);
  // Zeroes the KDA state of a slot before a new sequence uses it.
  void reset_slot(int32_t slot);
  // Fills every MLA page and KDA state slot with pseudo-random values: benchmarks of long contexts start
  // sequences at their length without running them (SyntheticSeq), and must not time all-zero caches.
  void randomize_caches(uint64_t seed);

  // One step over the ragged batch of `ctx`; returns the logits of ctx.logit_rows as a backend F32
  // tensor [rows, vocab], identical on every rank.
  Tensor forward(const StepContext& ctx);
  Ops& ops() { return ops_; }

  const ModelConfig& config() const { return cfg_; }
  const Mapping& mapping() const { return mapping_; }
  size_t weight_bytes_read() const { return weight_bytes_read_; }
  // Bytes this rank's weights take on the backend.
  int64_t weight_bytes_loaded() const { return weight_bytes_loaded_; }
  // Bytes of KDA state (conv window + recurrent) one sequence slot takes on this rank.
  int64_t kda_state_bytes_per_slot() const;

 private:
  // The mixing weights of one AttnRes point (K3).
  struct AttnResWeights {
    Tensor norm;  // [hidden]
    Tensor proj;  // [hidden]
  };
  struct Layer {
    Tensor input_norm;      // [hidden]
    Tensor post_attn_norm;  // [hidden]
    std::variant<KdaLayer, MlaLayer> attn;
    std::variant<DenseLayer, MoeLayer> ffn;
    AttnResWeights attn_res;  // before the attention (K3)
    AttnResWeights mlp_res;   // before the FFN (K3)
  };

  void load(WeightSource& w);
  // A layer's attention and FFN on their normalized input x (attend, feed), or on the hidden state h
  // with the layer's pre-norm applied first (attention, feed_forward).
  Tensor attend(Layer& l, const Tensor& x, const StepContext& ctx);
  Tensor feed(Layer& l, const Tensor& x);
  Tensor attention(Layer& l, const Tensor& h, const StepContext& ctx);
  Tensor feed_forward(Layer& l, const Tensor& h);
  // The layer stack over the embeddings: plain pre-norm residuals, or block attention residuals. Both
  // return the hidden state that enters the final norm [T, hidden]; the plain one with final_norm returns
  // that norm itself, which its last residual add then carries.
  Tensor residual_stack(Tensor h, const StepContext& ctx, bool final_norm);
  Tensor attn_res_stack(Tensor h, const StepContext& ctx);
  AttnResWeights read_attn_res(WeightSource& w, const std::string& key);
  // Opens the timing section of a layer's attention or FFN (Ops::section; a no-op unless enabled).
  void open_attention_section(const Layer& l);
  void open_ffn_section(const Layer& l);

  LayerEnv env() { return LayerEnv{cfg_, mapping_, ops_, comm_}; }

  ModelConfig cfg_;
  Mapping mapping_;
  Ops& ops_;
  Comm& comm_;
  Tensor embed_;  // [vocab, hidden]
  std::vector<Layer> layers_;
  AttnResWeights output_res_;  // K3
  Tensor final_norm_;          // [hidden]
  Tensor lm_head_;             // [vocab / N, hidden]
  size_t weight_bytes_read_ = 0;
  int64_t weight_bytes_loaded_ = 0;
};

}  // namespace hlm
