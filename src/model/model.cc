#include "model/model.h"

#include <chrono>

#include <fmt/format.h>

#include "base/log.h"
#include "model/step_sections.h"

namespace hlm {

namespace {

std::variant<KdaLayer, MlaLayer> make_attention(const LayerEnv& env, int i, WeightSource& w) {
  if (env.cfg.attn[i] == AttnKind::kKda)
    return std::variant<KdaLayer, MlaLayer>(std::in_place_type<KdaLayer>, env, i, w);
  return std::variant<KdaLayer, MlaLayer>(std::in_place_type<MlaLayer>, env, i, w);
}

std::variant<DenseLayer, MoeLayer> make_ffn(const LayerEnv& env, int i, WeightSource& w) {
  if (env.cfg.ffn[i] == FfnKind::kDense) {
    return std::variant<DenseLayer, MoeLayer>(std::in_place_type<DenseLayer>, env, i, w);
  }
  return std::variant<DenseLayer, MoeLayer>(std::in_place_type<MoeLayer>, env, i, w);
}

}  // namespace

Model::Model(const ModelConfig& cfg, const Mapping& mapping, Ops& ops, Comm& comm, const Checkpoint& ckpt)
    : cfg_(cfg), mapping_(mapping), ops_(ops), comm_(comm) {
  WeightReader w(ckpt, cfg_, mapping_, &ops_);
  load(w);
}

Model::Model(const ModelConfig& cfg, const Mapping& mapping, Ops& ops, Comm& comm, WeightSource& weights)
    : cfg_(cfg), mapping_(mapping), ops_(ops), comm_(comm) {
  load(weights);
}

void Model::load(WeightSource& w) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto last_report = start;
  const size_t bytes_before = w.bytes_read();
  const int64_t total = w.bytes_to_load();
  const LayerEnv e = env();

  embed_ = w.load("embed");
  layers_.reserve(cfg_.num_layers);
  for (int i = 0; i < cfg_.num_layers; ++i) {
    layers_.push_back(Layer{w.load(fmt::format("layers.{}.input_norm", i)),
                            w.load(fmt::format("layers.{}.post_attn_norm", i)), make_attention(e, i, w),
                            make_ffn(e, i, w), read_attn_res(w, fmt::format("layers.{}.attn_res", i)),
                            read_attn_res(w, fmt::format("layers.{}.mlp_res", i))});
    if (Clock::now() - last_report > std::chrono::seconds(2)) {
      last_report = Clock::now();
      const double secs = std::chrono::duration<double>(last_report - start).count();
      const double done = static_cast<double>(w.bytes_loaded());
      const double rate = done / secs;
      spdlog::info("loading weights: layer {}/{}, {:.2f} of {:.2f} GB, {:.2f} GB/s, ETA {:.0f} s", i + 1,
                   cfg_.num_layers, done / 1e9, static_cast<double>(total) / 1e9, rate / 1e9,
                   rate > 0 ? (static_cast<double>(total) - done) / rate : 0.0);
    }
  }
  output_res_ = read_attn_res(w, "output_res");
  final_norm_ = w.load("final_norm");
  lm_head_ = w.load("lm_head");
  weight_bytes_read_ = w.bytes_read() - bytes_before;
  weight_bytes_loaded_ = w.bytes_loaded();
  spdlog::info("loaded {} layers ({:.1f} MB of weights on this rank) in {:.2f} s", cfg_.num_layers,
               static_cast<double>(weight_bytes_loaded_) / 1e6,
               std::chrono::duration<double>(Clock::now() - start).count());
}

void Model::allocate_caches(int32_t slots, int64_t pages, int64_t tokens_per_block) {
  const LayerEnv e = env();
  for (Layer& l : layers_) {
    if (auto* kda = std::get_if<KdaLayer>(&l.attn)) kda->allocate_state(e, slots);
    if (auto* mla = std::get_if<MlaLayer>(&l.attn)) mla->allocate_cache(e, pages, tokens_per_block);
  }
}

void Model::reset_slot(int32_t slot) {
  const LayerEnv e = env();
  for (Layer& l : layers_) {
    if (auto* kda = std::get_if<KdaLayer>(&l.attn)) kda->reset_slot(e, slot);
  }
}

void Model::randomize_caches(uint64_t seed) {
  const LayerEnv e = env();
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    if (auto* kda = std::get_if<KdaLayer>(&l.attn)) kda->randomize_state(e, seed + i);
    if (auto* mla = std::get_if<MlaLayer>(&l.attn)) mla->randomize_cache(e, seed + i);
  }
}

int64_t Model::kda_state_bytes_per_slot() const {
  int64_t bytes = 0;
  for (const Layer& l : layers_) {
    if (const auto* kda = std::get_if<KdaLayer>(&l.attn)) bytes += kda->state_bytes_per_slot();
  }
  return bytes;
}

Model::AttnResWeights Model::read_attn_res(WeightSource& w, const std::string& key) {
  if (cfg_.attn_res_block_size == 0) return {};
  // The projection is stored [1, hidden]; the op takes it as a vector.
  return AttnResWeights{w.load(key + "_norm"), w.load(key + "_proj").reshape({cfg_.hidden_size})};
}

void Model::open_attention_section(const Layer& l) {
  ops_.section(step_section_name(std::holds_alternative<KdaLayer>(l.attn) ? StepSection::kKdaAttention
                                                                          : StepSection::kMlaAttention));
}

void Model::open_ffn_section(const Layer& l) {
  ops_.section(step_section_name(std::holds_alternative<MoeLayer>(l.ffn) ? StepSection::kMoeFfn
                                                                         : StepSection::kDenseFfn));
}

Tensor Model::attend(Layer& l, const Tensor& x, const StepContext& ctx) {
  const LayerEnv e = env();
  return std::visit([&](auto& attn) { return attn.forward(e, x, ctx); }, l.attn);
}

Tensor Model::feed(Layer& l, const Tensor& x) {
  const LayerEnv e = env();
  return std::visit([&](auto& ffn) { return ffn.forward(e, x); }, l.ffn);
}

Tensor Model::attention(Layer& l, const Tensor& h, const StepContext& ctx) {
  return attend(l, ops_.rms_norm(h, l.input_norm, static_cast<float>(cfg_.rms_norm_eps)), ctx);
}

Tensor Model::feed_forward(Layer& l, const Tensor& h) {
  return feed(l, ops_.rms_norm(h, l.post_attn_norm, static_cast<float>(cfg_.rms_norm_eps)));
}

Tensor Model::residual_stack(Tensor h, const StepContext& ctx, bool final_norm) {
  // Each residual add is fused with the norm that reads its result (add_rms_norm): the same values as
  // h += a; x = rms_norm(h) with one kernel fewer per add on a device backend.
  const auto eps = static_cast<float>(cfg_.rms_norm_eps);
  HLM_CHECK(!layers_.empty() || !final_norm,
            "residual_stack: the final norm rides on a layer's residual add");
  if (layers_.empty()) return h;
  // A section holds its sublayer and the residual add + norm that follows it.
  open_attention_section(layers_.front());
  Tensor x = ops_.rms_norm(h, layers_.front().input_norm, eps);  // [T, hidden]
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    if (i > 0) open_attention_section(l);
    x = ops_.add_rms_norm(h, attend(l, x, ctx), l.post_attn_norm, eps);
    open_ffn_section(l);
    Tensor f = feed(l, x);  // [T, hidden]
    if (i + 1 < layers_.size()) {
      x = ops_.add_rms_norm(h, f, layers_[i + 1].input_norm, eps);
    } else if (final_norm) {
      return ops_.add_rms_norm(h, f, final_norm_, eps);  // [T, hidden]
    } else {
      ops_.add_inplace(h, f);  // the final norm reads only the logit rows
    }
  }
  return h;
}

Tensor Model::attn_res_stack(Tensor running, const StepContext& ctx) {
  const auto eps = static_cast<float>(cfg_.rms_norm_eps);
  std::vector<Tensor> snapshots;  // residual snapshots, one per block of layers
  auto mix = [&](const AttnResWeights& w, const Tensor& current) {
    std::vector<Tensor> candidates = snapshots;
    candidates.push_back(current);
    return ops_.attn_res(candidates, w.proj, w.norm, eps);  // [T, hidden]
  };
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    open_attention_section(l);  // with the AttnRes mixes before it
    const Tensor input = snapshots.empty() ? running : mix(l.attn_res, running);
    Tensor a = attention(l, input, ctx);
    if (i % static_cast<size_t>(cfg_.attn_res_block_size) == 0) {
      // A new block: the running sum becomes a snapshot and the block's sum restarts from this layer.
      snapshots.push_back(running);
      running = a;
    } else {
      ops_.add_inplace(running, a);
    }
    open_ffn_section(l);
    ops_.add_inplace(running, feed_forward(l, mix(l.mlp_res, running)));
  }
  ops_.section(step_section_name(StepSection::kHead));
  return mix(output_res_, running);
}

Tensor Model::forward(const StepContext& ctx) {
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  ops_.section(step_section_name(StepSection::kEmbedding));
  Tensor h = ops_.embedding(embed_, ctx.token_ids);  // [T, hidden]
  const bool plain = cfg_.attn_res_block_size == 0;
  // When every row is a logit row (decode), the plain stack's last residual add carries the final norm: two
  // launches fewer per step on a device backend (the add and the gather), the same values.
  const bool norm_in_stack = plain && ctx.every_row_logits && !layers_.empty();
  if (norm_in_stack) {
    HLM_CHECK(ctx.logit_rows.dim(0) == ctx.num_tokens,
              "step context: every_row_logits with {} logit rows of {}", ctx.logit_rows.dim(0),
              ctx.num_tokens);
  }
  h = plain ? residual_stack(h, ctx, norm_in_stack) : attn_res_stack(h, ctx);
  // The head section opens in the stack (AttnRes mixes the final output there); a plain stack ends on an FFN.
  if (plain) ops_.section(step_section_name(StepSection::kHead));
  Tensor last = norm_in_stack
                    ? h
                    : ops_.rms_norm(ops_.gather_rows(h, ctx.logit_rows), final_norm_, eps);  // [R, hidden]
  Tensor logits = ops_.linear(last, lm_head_, /*f32_out=*/true);                             // [R, vocab / N]
  const int64_t rows = last.dim(0);
  if (mapping_.world() > 1) {
    // [N, R, V/N] -> [R, N, V/N] = [R, V]: shard n holds vocabulary rows [n·V/N, (n+1)·V/N).
    logits = ops_.transpose01(comm_.all_gather(logits, CommGroup::kWorld)).reshape({rows, cfg_.vocab_size});
  }
  ops_.section(nullptr);
  return logits;
}

}  // namespace hlm
