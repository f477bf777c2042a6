// kernel_bench: helixlm's CUDA KDA, MLA and routed-expert ops at the shapes of the speed issue
// (docs/benchmarks.md, "Kernels against peers"), and the small ops of a decode step, timed the way
// tools/bench_kernels.py times the peers in the same job: a decode op is captured kCalls times back to back
// in one CUDA graph and the graph replayed (time per call, so launch gaps count as they do inside a decode
// step); a prefill op runs eagerly. Inputs are random values generated on the GPU. Prints one JSON object per
// case: the op, the shape, the median time and the bytes the op must move over the copy bandwidth measured in
// the same process. --small-ops, --mla, --mla-prefill, --moe, --moe-prefill, --kda-decode, --kda-prefill and
// --skinny run one group of cases alone.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "ops/backend.h"
#include "ops/ops.h"

namespace hlm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kCalls = 20;   // op calls per captured graph
constexpr int kRepeats = 7;  // timed replays (or eager runs); the median is reported

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_of(Ops& ops, const std::function<void()>& run) {
  ops.synchronize();
  const auto t = Clock::now();
  run();
  ops.synchronize();
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Seconds per call of `op`, kCalls calls captured in one graph and replayed.
double graph_seconds_per_call(Ops& ops, const std::function<void()>& op) {
  ops.begin_step();
  op();  // lazy set-up outside the capture
  ops.end_step();
  ops.begin_step();
  std::unique_ptr<StepGraph> graph = ops.capture([&] {
    for (int i = 0; i < kCalls; ++i) op();
  });
  ops.end_step();
  HLM_CHECK(graph != nullptr, "kernel_bench: the backend made no CUDA graph");
  graph->replay();
  std::vector<double> t;
  for (int r = 0; r < kRepeats; ++r) t.push_back(seconds_of(ops, [&] { graph->replay(); }) / kCalls);
  return median(t);
}

double eager_seconds(Ops& ops, const std::function<void()>& op) {
  auto once = [&] {
    ops.begin_step();
    op();
    ops.end_step();
  };
  once();
  std::vector<double> t;
  for (int r = 0; r < 3; ++r) t.push_back(seconds_of(ops, once));
  return median(t);
}

double copy_bandwidth(Ops& ops, int64_t bytes) {
  Tensor a = ops.zeros({bytes}, DType::kU8), b = ops.zeros({bytes}, DType::kU8);
  std::vector<double> rates;
  for (int r = 0; r < 5; ++r)
    rates.push_back(2.0 * static_cast<double>(a.nbytes()) / seconds_of(ops, [&] { ops.copy(a, b); }));
  return median(rates);
}

Tensor random_tensor(Ops& ops, const Shape& shape, DType dtype, float scale, float offset, uint64_t seed) {
  Tensor t = ops.empty(shape, dtype);
  ops.random_fill(t, RandomFill{scale, offset, 0, 255, seed});
  return t;
}

Tensor device_i32(Ops& ops, const Shape& shape, const std::vector<int32_t>& values) {
  return ops.upload(Tensor::from_vector_i32(shape, values));
}

SeqBatch seq_batch(Ops& ops, int64_t seqs, int64_t tokens_each) {
  std::vector<SeqSpan> spans;
  std::vector<int32_t> table;
  for (int64_t s = 0; s < seqs; ++s) {
    spans.push_back(SeqSpan{s * tokens_each, tokens_each, static_cast<int32_t>(s)});
    table.insert(table.end(), {static_cast<int32_t>(s * tokens_each), static_cast<int32_t>(tokens_each),
                               static_cast<int32_t>(s)});
  }
  SeqBatch b(spans);
  b.table = device_i32(ops, {seqs, 3}, table);
  return b;
}

void print(nlohmann::json j, double seconds, double bytes, double bandwidth) {
  j["us"] = seconds * 1e6;
  j["bytes"] = bytes;
  j["gb_s"] = bytes / seconds / 1e9;
  j["fraction_of_copy_bandwidth"] = bytes / seconds / bandwidth;
  std::cout << j.dump() << std::endl;
}

constexpr int64_t kHeads = 32, kDim = 128;

// KDA decode, one token per sequence, on the same q, k, v and fp32 state [B, H, K, V] (its bytes read and
// written are what each form must move): the recurrence alone (kda_decode, decays and beta precomputed);
// the fused kda_decode_gated (gate, beta, recurrence and gated norm in one kernel); and the same work as
// Ops::kda_decode_gated defines it, four separate ops. The calls alternate between two states: the kernel
// reads its state before waiting for the kernel before it (PDL), which a step allows because that kernel
// (the short conv) never writes the state; a call right after one on the same state would race with it.
void kda_decode_cases(Ops& ops, int64_t batch, double bw) {
  Tensor q = random_tensor(ops, {batch, kHeads, kDim}, DType::kBF16, 1.0f, 0.0f, 1);
  Tensor k = random_tensor(ops, {batch, kHeads, kDim}, DType::kBF16, 1.0f, 0.0f, 2);
  Tensor v = random_tensor(ops, {batch, kHeads, kDim}, DType::kBF16, 1.0f, 0.0f, 3);
  Tensor states[2] = {random_tensor(ops, {batch, kHeads, kDim, kDim}, DType::kF32, 0.05f, 0.0f, 6),
                      random_tensor(ops, {batch, kHeads, kDim, kDim}, DType::kF32, 0.05f, 0.0f, 16)};
  size_t call = 0;
  auto state = [&]() -> Tensor& { return states[call++ % 2]; };
  const SeqBatch seqs = seq_batch(ops, batch, 1);
  const double bytes = 2.0 * static_cast<double>(states[0].nbytes());
  const nlohmann::json shape{{"batch", batch}, {"heads", kHeads}, {"dim", kDim}};
  auto report = [&](const char* name, const std::function<void()>& op) {
    nlohmann::json j = shape;
    j["op"] = name;
    print(j, graph_seconds_per_call(ops, op), bytes, bw);
  };

  Tensor g = random_tensor(ops, {batch, kHeads, kDim}, DType::kF32, 0.05f, -0.1f, 4);  // log decays < 0
  Tensor beta = random_tensor(ops, {batch, kHeads}, DType::kF32, 0.4f, 0.5f, 5);
  report("kda_decode", [&] { ops.kda_decode(q, k, v, g, beta, seqs, state()); });

  Tensor graw = random_tensor(ops, {batch, kHeads * kDim}, DType::kBF16, 2.0f, 0.0f, 4);
  Tensor beta_logits = random_tensor(ops, {batch, kHeads}, DType::kBF16, 2.0f, 0.0f, 5);
  Tensor out_gate = random_tensor(ops, {batch, kHeads, kDim}, DType::kBF16, 2.0f, 0.0f, 7);
  KdaHeadParams hp;
  hp.a_log = random_tensor(ops, {kHeads}, DType::kF32, 0.5f, -0.5f, 8);
  hp.dt_bias = random_tensor(ops, {kHeads * kDim}, DType::kF32, 1.0f, 0.0f, 9);
  hp.o_norm = random_tensor(ops, {kDim}, DType::kBF16, 0.5f, 1.0f, 10);
  report("kda_decode_gated",
         [&] { ops.kda_decode_gated(q, k, v, graw, beta_logits, out_gate, hp, seqs, state()); });
  report("kda_decode_separate_ops",
         [&] { ops.Ops::kda_decode_gated(q, k, v, graw, beta_logits, out_gate, hp, seqs, state()); });

  // The whole layer step from the stacked input projection (Kimi-Linear's column order: q|k|v, f_a, g_a,
  // beta): kda_decode_layer's one kernel against Ops::kda_decode_layer's ops (the conv, f_b and g_b on the
  // side stream, then kda_decode_gated). Its bytes add the gate weights f_b and g_b [H·K, K].
  constexpr int64_t kRank = kDim, kConvWidth = 4, kDl = kHeads * kDim;
  const KdaProjColumns cols{0, 3 * kDl, 3 * kDl + kRank, 3 * kDl + 2 * kRank};
  Tensor proj = random_tensor(ops, {batch, cols.beta + kHeads}, DType::kBF16, 1.0f, 0.0f, 11);
  Tensor conv_w = random_tensor(ops, {3 * kDl, kConvWidth}, DType::kBF16, 0.5f, 0.0f, 12);
  Tensor f_b = random_tensor(ops, {kDl, kRank}, DType::kBF16, 0.1f, 0.0f, 13);
  Tensor g_b = random_tensor(ops, {kDl, kRank}, DType::kBF16, 0.1f, 0.0f, 14);
  Tensor conv_states[2] = {
      random_tensor(ops, {batch, 3 * kDl, kConvWidth - 1}, DType::kBF16, 1.0f, 0.0f, 17),
      random_tensor(ops, {batch, 3 * kDl, kConvWidth - 1}, DType::kBF16, 1.0f, 0.0f, 18)};
  const double layer_bytes = bytes + static_cast<double>(f_b.nbytes() + g_b.nbytes());
  auto report_layer = [&](const char* name, bool fused) {
    nlohmann::json j = shape;
    j["op"] = name;
    const double t = graph_seconds_per_call(ops, [&] {
      const size_t i = call++ % 2;
      fused ? ops.kda_decode_layer(proj, cols, conv_w, f_b, g_b, hp, seqs, conv_states[i], states[i])
            : ops.Ops::kda_decode_layer(proj, cols, conv_w, f_b, g_b, hp, seqs, conv_states[i], states[i]);
    });
    print(j, t, layer_bytes, bw);
  };
  report_layer("kda_decode_layer", true);
  report_layer("kda_decode_layer_separate_ops", false);
}

// The small ops of a batch-1 decode step of Kimi-Linear-48B (hidden 2304, 256 experts, top 8) one at a
// time: what each launch costs inside a graph, next to the bytes it must move.
void decode_small_op_cases(Ops& ops, double bw) {
  constexpr int64_t kHidden = 2304, kExperts = 256;
  Tensor x = random_tensor(ops, {1, kHidden}, DType::kBF16, 1.0f, 0.0f, 31);
  Tensor h = random_tensor(ops, {1, kHidden}, DType::kF32, 1.0f, 0.0f, 32);
  Tensor norm_w = random_tensor(ops, {kHidden}, DType::kBF16, 0.5f, 1.0f, 33);
  auto report = [&](const char* name, const nlohmann::json& shape, double bytes,
                    const std::function<void()>& op) {
    nlohmann::json j = shape;
    j["op"] = name;
    print(j, graph_seconds_per_call(ops, op), bytes, bw);
  };
  report("rms_norm", {{"rows", 1}, {"dim", kHidden}}, kHidden * 6.0, [&] { ops.rms_norm(h, norm_w, 1e-5f); });
  report("add_rms_norm", {{"rows", 1}, {"dim", kHidden}}, kHidden * 12.0,
         [&] { ops.add_rms_norm(h, x, norm_w, 1e-5f); });
  Tensor router_w = random_tensor(ops, {kExperts, kHidden}, DType::kBF16, 0.05f, 0.0f, 34);
  Tensor router_bias = random_tensor(ops, {kExperts}, DType::kF32, 0.1f, 0.0f, 35);
  RouterParams rp;
  rp.top_k = 8;
  Tensor idx = ops.empty({1, rp.top_k}, DType::kI32), weights = ops.empty({1, rp.top_k}, DType::kF32);
  report("moe_route", {{"rows", 1}, {"experts", kExperts}, {"dim", kHidden}},
         static_cast<double>(router_w.nbytes()),
         [&] { ops.moe_route(x, router_w, router_bias, rp, idx, weights); });
  // KDA b_proj and f_a alone (now inside its fused input projection), the KDA input projection with them
  // (12,576 rows: cuBLASLt), the shared-expert gate|up, o_proj.
  for (int64_t rows : {32, 128, 12576, 2048, 2304}) {
    const int64_t cols = rows == 2304 ? 4096 : kHidden;
    Tensor w = random_tensor(ops, {rows, cols}, DType::kBF16, 0.05f, 0.0f, 36);
    Tensor in = random_tensor(ops, {1, cols}, DType::kBF16, 1.0f, 0.0f, 37);
    report("linear", {{"rows", 1}, {"out", rows}, {"in", cols}}, static_cast<double>(w.nbytes()),
           [&] { ops.linear(in, w); });
  }
  // MLA's per-head products at 32 heads: W_UK absorption (x [1, 32, 128] BF16 · w [32, 128, 512]) and W_UV
  // (the F32 attention output [1, 32, 512] · w [32, 128, 512]ᵀ).
  Tensor w_uk = random_tensor(ops, {32, 128, 512}, DType::kBF16, 0.05f, 0.0f, 40);
  Tensor q_nope = random_tensor(ops, {1, 32, 128}, DType::kBF16, 1.0f, 0.0f, 41);
  report("head_matmul", {{"rows", 1}, {"heads", 32}, {"in", 128}, {"out", 512}},
         static_cast<double>(w_uk.nbytes()), [&] { ops.head_matmul(q_nope, w_uk); });
  Tensor context = random_tensor(ops, {1, 32, 512}, DType::kF32, 1.0f, 0.0f, 42);
  report("head_matmul_transposed", {{"rows", 1}, {"heads", 32}, {"in", 512}, {"out", 128}},
         static_cast<double>(w_uk.nbytes()), [&] { ops.head_matmul(context, w_uk, true); });
  Tensor gate_up = random_tensor(ops, {1, 2048}, DType::kBF16, 2.0f, 0.0f, 38);
  report("glu_packed", {{"rows", 1}, {"dim", 1024}}, 2048 * 2.0 + 1024 * 2.0,
         [&] { ops.glu_packed(gate_up, ActivationParams{}); });
  Tensor gate_up_w = random_tensor(ops, {2048, kHidden}, DType::kBF16, 0.05f, 0.0f, 39);
  report("linear_glu", {{"rows", 1}, {"out", 1024}, {"in", kHidden}}, static_cast<double>(gate_up_w.nbytes()),
         [&] { ops.linear_glu(x, gate_up_w, ActivationParams{}); });
}

// The decode-size GEMMs of a 48B step, each call on its own copy of the weights (kCalls copies, more bytes
// than L2 holds), so every call streams its matrix from DRAM as it does inside a step: o_proj, the shared
// expert's down and gate|up (GLU), the dense FFN's down, MLA's stacked q|kv_a, and W_UV per head.
void skinny_gemm_cases(Ops& ops, double bw) {
  struct Shape {
    const char* name;
    int64_t out, in;
    bool glu;
  };
  const Shape shapes[] = {{"o_proj", 2304, 4096, false},
                          {"shared_down", 2304, 1024, false},
                          {"dense_down", 2304, 9216, false},
                          {"mla_q_kv_a", 6720, 2304, false},
                          {"shared_gate_up", 2048, 2304, true}};
  for (int64_t tokens : {1, 8}) {
    for (const Shape& s : shapes) {
      std::vector<Tensor> w;
      for (int c = 0; c < kCalls; ++c)
        w.push_back(random_tensor(ops, {s.out, s.in}, DType::kBF16, 0.05f, 0.0f, 50 + c));
      Tensor in = random_tensor(ops, {tokens, s.in}, DType::kBF16, 1.0f, 0.0f, 49);
      size_t call = 0;
      nlohmann::json j{{"op", s.name}, {"rows", tokens}, {"out", s.out}, {"in", s.in}};
      print(j,
            graph_seconds_per_call(ops,
                                   [&] {
                                     const Tensor& wc = w[call++ % w.size()];
                                     s.glu ? ops.linear_glu(in, wc, ActivationParams{}) : ops.linear(in, wc);
                                   }),
            static_cast<double>(w[0].nbytes()), bw);
    }
    std::vector<Tensor> w_uv;
    for (int c = 0; c < kCalls; ++c)
      w_uv.push_back(random_tensor(ops, {32, 128, 512}, DType::kBF16, 0.05f, 0.0f, 80 + c));
    Tensor context = random_tensor(ops, {tokens, 32, 512}, DType::kF32, 1.0f, 0.0f, 42);
    size_t call = 0;
    print({{"op", "mla_w_uv"}, {"rows", tokens}, {"heads", 32}, {"in", 512}, {"out", 128}},
          graph_seconds_per_call(ops, [&] { ops.head_matmul(context, w_uv[call++ % w_uv.size()], true); }),
          static_cast<double>(w_uv[0].nbytes()), bw);
  }
}

// KDA chunked prefill of `batch` sequences of `tokens` each, from a zero state. Log decays of about −0.1 per
// token and channel, or with `steep` about −10 (softplus gates on large inputs), where Γ falls by far more
// than kda_prefill.cu's factored decays allow inside a sub-block and every channel takes the pairwise path.
void kda_prefill_case(Ops& ops, int64_t batch, int64_t tokens, double bw, bool steep = false) {
  const int64_t rows = batch * tokens;
  Tensor q = random_tensor(ops, {rows, kHeads, kDim}, DType::kBF16, 1.0f, 0.0f, 11);
  Tensor k = random_tensor(ops, {rows, kHeads, kDim}, DType::kBF16, 1.0f, 0.0f, 12);
  Tensor v = random_tensor(ops, {rows, kHeads, kDim}, DType::kBF16, 1.0f, 0.0f, 13);
  Tensor g =
      random_tensor(ops, {rows, kHeads, kDim}, DType::kF32, steep ? 5.0f : 0.05f, steep ? -10.0f : -0.1f, 14);
  Tensor beta = random_tensor(ops, {rows, kHeads}, DType::kF32, 0.4f, 0.5f, 15);
  Tensor state = ops.zeros({batch, kHeads, kDim, kDim}, DType::kF32);
  const SeqBatch seqs = seq_batch(ops, batch, tokens);
  const double t = eager_seconds(ops, [&] { ops.kda_prefill(q, k, v, g, beta, seqs, state); });
  const double bytes = static_cast<double>(q.nbytes() * 4 + g.nbytes() + beta.nbytes());  // q k v o, g, beta
  nlohmann::json j{
      {"op", "kda_prefill"}, {"batch", batch}, {"tokens", tokens}, {"heads", kHeads}, {"dim", kDim}};
  if (steep) j["gates"] = "steep";
  j["tokens_per_s"] = static_cast<double>(rows) / t;
  print(j, t, bytes, bw);
}

// MLA absorbed decode over paged latent KV: `keys` keys per sequence, one query per sequence, latent 512
// + rope 64 per key (Kimi-Linear-48B), pages of 64 tokens.
void mla_decode_case(Ops& ops, int64_t batch, int64_t heads, int64_t keys, double bw) {
  constexpr int64_t kLatent = 512, kCacheDim = 576, kPage = 64;
  const int64_t pages_each = (keys + kPage - 1) / kPage, pages = batch * pages_each;
  Tensor q = random_tensor(ops, {batch, heads, kCacheDim}, DType::kBF16, 1.0f, 0.0f, 21);
  Tensor cache = random_tensor(ops, {pages, kPage, kCacheDim}, DType::kBF16, 1.0f, 0.0f, 22);
  std::vector<int32_t> page_ids(pages), table, kv_len(batch, static_cast<int32_t>(keys));
  std::vector<MlaSeq> seqs;
  for (int64_t p = 0; p < pages; ++p) page_ids[p] = static_cast<int32_t>(p);
  for (int64_t s = 0; s < batch; ++s) {
    seqs.push_back(MlaSeq{s, 1, s * pages_each, pages_each});
    table.insert(table.end(), {static_cast<int32_t>(s), 1, static_cast<int32_t>(s * pages_each),
                               static_cast<int32_t>(pages_each)});
  }
  MlaBatch mla(seqs);
  mla.table = device_i32(ops, {batch, 4}, table);
  const Tensor page_table = device_i32(ops, {pages}, page_ids);
  const Tensor lens = device_i32(ops, {batch}, kv_len);
  Tensor out = ops.empty({batch, heads, kLatent}, DType::kF32);
  Tensor stats = ops.empty({batch, heads, 2}, DType::kF32);
  const double t = graph_seconds_per_call(
      ops, [&] { ops.mla_attention(q, cache, page_table, mla, lens, 0.0625f, kLatent, out, stats); });
  const double bytes = static_cast<double>(batch * keys * kCacheDim * 2);
  print({{"op", "mla_decode"}, {"batch", batch}, {"heads", heads}, {"keys", keys}, {"cache_dim", kCacheDim}},
        t, bytes, bw);
}

// MLA prefill of one sequence: `tokens` queries after `prefix` cached keys (causal), Kimi-Linear-48B's 32
// heads, in both forms the layer can run: absorbed (mla_attention over the latent cache, q = [W_UKᵀ q_nope |
// q_pe]), and expanded as MlaLayer::expanded_attention runs it (per chunk of kMlaExpandedKeyChunk keys:
// gather, latent columns, the W_UK and W_UV GEMMs, the attention kernel), plus that attention kernel alone
// on keys expanded beforehand. tflop_s counts each form's own attention FLOPs over the visible pairs
// (2·(576 + 512) per pair and head absorbed, 2·(192 + 128) expanded); the expanded pipeline's also counts
// its expansion GEMMs (2·512·256 per key and head).
void mla_prefill_case(Ops& ops, int64_t tokens, int64_t prefix, double bw) {
  constexpr int64_t kHeadsM = 32, kLatent = 512, kRope = 64, kNope = 128, kV = 128, kCacheDim = 576,
                    kPage = 64;
  constexpr int64_t kChunk = 8192;  // MlaLayer's kMlaExpandedKeyChunk
  const int64_t keys = prefix + tokens, pages = (keys + kPage - 1) / kPage;
  Tensor cache = random_tensor(ops, {pages, kPage, kCacheDim}, DType::kBF16, 1.0f, 0.0f, 61);
  std::vector<int32_t> page_ids(pages), kv_len(tokens);
  for (int64_t p = 0; p < pages; ++p) page_ids[p] = static_cast<int32_t>(p);
  for (int64_t t = 0; t < tokens; ++t) kv_len[t] = static_cast<int32_t>(prefix + t + 1);
  const MlaSeq seq{0, tokens, 0, pages};
  MlaBatch mla({seq});
  mla.table = device_i32(ops, {1, 4}, {0, static_cast<int32_t>(tokens), 0, static_cast<int32_t>(pages)});
  const Tensor page_table = device_i32(ops, {pages}, page_ids);
  const Tensor lens = device_i32(ops, {tokens}, kv_len);
  const Tensor w_uk = random_tensor(ops, {kHeadsM * kNope, kLatent}, DType::kBF16, 0.05f, 0.0f, 62);
  const Tensor w_uv = random_tensor(ops, {kHeadsM * kV, kLatent}, DType::kBF16, 0.05f, 0.0f, 63);
  const Tensor q = random_tensor(ops, {tokens, kHeadsM, kNope + kRope}, DType::kBF16, 1.0f, 0.0f, 64);
  const Tensor q_abs = random_tensor(ops, {tokens, kHeadsM, kCacheDim}, DType::kBF16, 1.0f, 0.0f, 65);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kNope + kRope));
  const double pairs = static_cast<double>(tokens) * static_cast<double>(prefix) +
                       0.5 * static_cast<double>(tokens) * static_cast<double>(tokens + 1);
  const double expand_flops = 2.0 * kLatent * (kNope + kV) * kHeadsM * static_cast<double>(keys);
  const nlohmann::json shape{{"tokens", tokens}, {"prefix", prefix}, {"heads", kHeadsM}};
  auto report = [&](const char* name, double flops, const std::function<void()>& op) {
    nlohmann::json j = shape;
    j["op"] = name;
    const double t = eager_seconds(ops, op);
    j["tflop_s"] = flops / t / 1e12;
    print(j, t, static_cast<double>(keys) * kCacheDim * 2, bw);
  };

  Tensor out = ops.empty({tokens, kHeadsM, kLatent}, DType::kF32),
         stats = ops.empty({tokens, kHeadsM, 2}, DType::kF32);
  report("mla_prefill_absorbed", pairs * kHeadsM * 2.0 * (kCacheDim + kLatent),
         [&] { ops.mla_attention(q_abs, cache, page_table, mla, lens, scale, kLatent, out, stats); });
  Tensor out_e = ops.empty({tokens, kHeadsM, kV}, DType::kF32),
         stats_e = ops.empty({tokens, kHeadsM, 2}, DType::kF32);
  report("mla_prefill_expanded", pairs * kHeadsM * 2.0 * (kNope + kRope + kV) + expand_flops, [&] {
    for (int64_t k0 = 0; k0 < pages * kPage; k0 += kChunk) {
      const int64_t n = std::min(kChunk, pages * kPage - k0);
      const Tensor rows = ops.mla_gather_keys(cache, page_table, seq, k0, n);
      const Tensor latent = ops.slice_last(rows, 0, kLatent);
      const Tensor k_nope = ops.linear(latent, w_uk).reshape({n, kHeadsM, kNope});
      const Tensor v = ops.linear(latent, w_uv).reshape({n, kHeadsM, kV});
      ops.mla_expanded_attention(q, k_nope, v, rows, kLatent, lens, k0, scale, k0 > 0, out_e, stats_e);
    }
  });
  if (keys <= kChunk) {
    const Tensor rows = ops.mla_gather_keys(cache, page_table, seq, 0, pages * kPage);
    const Tensor latent = ops.slice_last(rows, 0, kLatent);
    const Tensor k_nope = ops.linear(latent, w_uk).reshape({pages * kPage, kHeadsM, kNope});
    const Tensor v = ops.linear(latent, w_uv).reshape({pages * kPage, kHeadsM, kV});
    report("mla_prefill_expanded_attention_only", pairs * kHeadsM * 2.0 * (kNope + kRope + kV), [&] {
      ops.mla_expanded_attention(q, k_nope, v, rows, kLatent, lens, 0, scale, false, out_e, stats_e);
    });
  }
}

// The routed experts alone (moe_experts: the fused decode kernel and its combine up to 32 (token, slot)
// pairs of BF16 experts, else work list, gate|up, down, combine) at a batch of `tokens` (a
// decode batch, or a prefill chunk with --moe-prefill, where tflop_s counts 6·T·k·D·I FLOPs),
// each token routed to top_k distinct experts drawn at random. Every call of the captured graph takes
// another routing (kCalls of them), so a call's experts are not left in L2 by the call before, as in a
// decode step, where each layer has its own experts. Bytes: the distinct experts of the call's routing,
// each read once (codes and scales for MXFP4), averaged over the calls.
void moe_experts_case(Ops& ops, const char* model, int64_t local, int64_t hidden, int64_t inter,
                      int64_t top_k, bool mxfp4, int64_t tokens, double bw) {
  ExpertWeights ew;
  if (mxfp4) {
    const RandomFill codes{0.0f, 0.0f, 0, 255, 41}, scales{0.0f, 0.0f, 118, 126, 42};
    auto fill = [&](const Shape& shape, const RandomFill& f) {
      Tensor t = ops.empty(shape, DType::kU8);
      ops.random_fill(t, f);
      return t;
    };
    ew.gate = fill({local, inter, hidden / 2}, codes);
    ew.up = fill({local, inter, hidden / 2}, codes);
    ew.down = fill({local, hidden, inter / 2}, codes);
    ew.gate_scale = fill({local, inter, hidden / 32}, scales);
    ew.up_scale = fill({local, inter, hidden / 32}, scales);
    ew.down_scale = fill({local, hidden, inter / 32}, scales);
  } else {
    ew.gate = random_tensor(ops, {local, inter, hidden}, DType::kBF16, 0.05f, 0.0f, 41);
    ew.up = random_tensor(ops, {local, inter, hidden}, DType::kBF16, 0.05f, 0.0f, 42);
    ew.down = random_tensor(ops, {local, hidden, inter}, DType::kBF16, 0.05f, 0.0f, 43);
  }
  // One expert's bytes, as held: its share of every matrix (codes and scales for MXFP4).
  double expert_bytes = 0.0;
  for (const Tensor* t : {&ew.gate, &ew.up, &ew.down, &ew.gate_scale, &ew.up_scale, &ew.down_scale}) {
    if (t->defined()) expert_bytes += static_cast<double>(t->nbytes()) / static_cast<double>(local);
  }
  Tensor x = random_tensor(ops, {tokens, hidden}, DType::kBF16, 1.0f, 0.0f, 44);
  Tensor weights = random_tensor(ops, {tokens, top_k}, DType::kF32, 0.1f, 0.1f, 45);
  std::mt19937 rng(46);
  std::vector<Tensor> routings;
  double touched = 0.0;
  for (int c = 0; c < kCalls; ++c) {
    std::vector<int32_t> ids;
    std::vector<bool> used(static_cast<size_t>(local), false);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(local));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < top_k; ++j) {
        ids.push_back(all[j]);
        used[all[j]] = true;
      }
    }
    touched += static_cast<double>(std::count(used.begin(), used.end(), true)) / kCalls;
    routings.push_back(device_i32(ops, {tokens, top_k}, ids));
  }
  size_t call = 0;
  const double t = graph_seconds_per_call(ops, [&] {
    ops.moe_experts(x, routings[call++ % routings.size()], weights, ew, 0, ActivationParams{});
  });
  print({{"op", "moe_experts"},
         {"model", model},
         {"tokens", tokens},
         {"local_experts", local},
         {"hidden", hidden},
         {"intermediate", inter},
         {"top_k", top_k},
         {"weights", mxfp4 ? "mxfp4" : "bf16"},
         {"experts_touched", touched},
         {"tflop_s", 6.0 * static_cast<double>(tokens * top_k * hidden * inter) / t / 1e12}},
        t, touched * expert_bytes, bw);
}

// Which cases a run takes: all of them, or one group (kSmallOps in 1 GB of device memory, so that a
// profiler replaying their kernels has little memory to save and restore).
enum class Cases { kAll, kSmallOps, kMla, kMlaPrefill, kMoe, kMoePrefill, kKdaDecode, kKdaPrefill, kSkinny };

int run(Cases cases) {
  std::string why;
  if (cuda_device_count(&why) == 0) {
    std::cerr << "kernel_bench: no GPU: " << why << "\n";
    return 1;
  }
  const bool all = cases == Cases::kAll, small_ops_only = cases == Cases::kSmallOps;
  std::unique_ptr<Ops> ops = make_ops(Device::kCuda, BackendOptions{});
  ops->reserve_workspace(small_ops_only ? int64_t{256} << 20 : int64_t{32} << 30);
  const double bw = copy_bandwidth(*ops, small_ops_only ? int64_t{256} << 20 : int64_t{2} << 30);
  std::cout << nlohmann::json{{"op", "copy"}, {"gb_s", bw / 1e9}}.dump() << std::endl;
  if (all || small_ops_only) decode_small_op_cases(*ops, bw);
  if (all || cases == Cases::kMoe) {
    // Kimi-Linear-48B: 256 BF16 experts of [1024, 2304], top 8. K3: MXFP4 experts of [3072, 3584], top 16,
    // 224 of them (a quarter of the 896: one rank's share under expert parallelism over 4).
    for (int64_t tokens : {1, 2, 4, 8, 32, 64})
      moe_experts_case(*ops, "kimi-linear-48b", 256, 2304, 1024, 8, false, tokens, bw);
    for (int64_t tokens : {1, 8}) moe_experts_case(*ops, "kimi-k3", 224, 3584, 3072, 16, true, tokens, bw);
  }
  if (all || cases == Cases::kMoePrefill) {
    for (int64_t tokens : {256, 512, 1024, 2048, 8192})
      moe_experts_case(*ops, "kimi-linear-48b", 256, 2304, 1024, 8, false, tokens, bw);
    for (int64_t tokens : {512, 2048, 8192})
      moe_experts_case(*ops, "kimi-k3", 224, 3584, 3072, 16, true, tokens, bw);
  }
  if (all || cases == Cases::kSkinny) skinny_gemm_cases(*ops, bw);
  if (all || cases == Cases::kMlaPrefill) {
    for (int64_t prefix : {0, 24576}) mla_prefill_case(*ops, 8192, prefix, bw);
    mla_prefill_case(*ops, 512, 32256, bw);  // a server-sized chunk against a long prefix
  }
  if (all || cases == Cases::kKdaDecode) {
    for (int64_t b : {1, 2, 4, 8, 16, 64}) kda_decode_cases(*ops, b, bw);
  }
  if (all || cases == Cases::kKdaPrefill) {
    for (int64_t b : {1, 4}) {
      for (int64_t t : {8192, 65536}) kda_prefill_case(*ops, b, t, bw);
    }
    kda_prefill_case(*ops, 1, 8192, bw, true);
  }
  if (!all && cases != Cases::kMla) return 0;
  for (int64_t heads : {32, 96}) {  // Kimi-Linear-48B, K3
    for (int64_t b : {1, 8}) mla_decode_case(*ops, b, heads, 65536, bw);
  }
  return 0;
}

}  // namespace
}  // namespace hlm

int main(int argc, char** argv) {
  const std::string arg = argc == 2 ? argv[1] : "";
  const std::pair<const char*, hlm::Cases> flags[] = {
      {"--small-ops", hlm::Cases::kSmallOps},     {"--mla", hlm::Cases::kMla},
      {"--mla-prefill", hlm::Cases::kMlaPrefill}, {"--moe", hlm::Cases::kMoe},
      {"--moe-prefill", hlm::Cases::kMoePrefill}, {"--kda-decode", hlm::Cases::kKdaDecode},
      {"--kda-prefill", hlm::Cases::kKdaPrefill}, {"--skinny", hlm::Cases::kSkinny}};
  hlm::Cases cases = hlm::Cases::kAll;
  bool known = argc == 1;
  for (const auto& [flag, c] : flags) {
    if (argc == 2 && arg == flag) cases = c, known = true;
  }
  if (!known) {
    std::cerr << "usage: kernel_bench [--small-ops | --mla | --mla-prefill | --moe | --moe-prefill | "
                 "--kda-decode | "
                 "--kda-prefill | --skinny]\n";
    return 2;
  }
  try {
    return hlm::run(cases);
  } catch (const std::exception& e) {
    std::cerr << "kernel_bench: " << e.what() << "\n";
    return 1;
  }
}
