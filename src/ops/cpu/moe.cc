// Mixture of experts (docs/MODEL.md §7.1-7.2): the sigmoid router with grouped top-k, exactly as
// transformers' KimiLinearTopkRouter, and the routed experts of this rank. The router logits and the
// expert projections are OpenBLAS GEMMs; the experts run one after another (each GEMM uses OpenBLAS
// threads), so every token's sum over its experts is accumulated in expert order.
#include <algorithm>

#include "ops/cpu/cpu_kernels.h"
#include "weights/mxfp4.h"

namespace hlm::cpu {
namespace {

// Indices [0, n) ordered by descending score; ties go to the lower index (torch leaves tie order
// unspecified; this makes ours deterministic). Returns the first `k`.
std::vector<int64_t> top_k_indices(const float* score, int64_t n, int64_t k,
                                   const std::vector<char>* allowed) {
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (allowed == nullptr || (*allowed)[i]) order.push_back(i);
  }
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [score](int64_t a, int64_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

}  // namespace

void moe_route(const Tensor& x, const Tensor& w, const Tensor& bias, const RouterParams& p, Tensor& idx,
               Tensor& weights) {
  const char* op = "moe_route";
  expect_tensor(x, op, "x", DType::kF32, 2, "[T, D]");
  expect_tensor(w, op, "w", DType::kF32, 2, "[E, D]");
  expect_tensor(bias, op, "bias", DType::kF32, 1, "[E]");
  expect_dim(w, 1, x.dim(1), op, "w [E, D]", "the hidden size of x [T, D]");
  const int64_t rows = x.dim(0), hidden = x.dim(1), experts = w.dim(0);
  expect_dim(bias, 0, experts, op, "bias [E]", "the expert count of w [E, D]");
  check_router_params(p, experts, op);
  const int64_t groups = p.num_expert_group, per_group = experts / groups;
  prepare_output(idx, {rows, p.top_k}, DType::kI32, op, "idx");
  prepare_output(weights, {rows, p.top_k}, DType::kF32, op, "weights");

  std::vector<float> logits(static_cast<size_t>(rows * experts));  // [T, E]
  gemm(rows, experts, hidden, x.data<float>(), hidden, w.data<float>(), hidden, /*trans_b=*/true,
       logits.data(), experts, /*accumulate=*/false);
  const float* bp = bias.data<float>();
  int32_t* ip = idx.data<int32_t>();
  float* wp = weights.data<float>();
#pragma omp parallel
  {
    std::vector<float> score(static_cast<size_t>(experts)), choice(static_cast<size_t>(experts));
    std::vector<float> group_score(static_cast<size_t>(groups));
    std::vector<char> allowed(static_cast<size_t>(experts));
#pragma omp for
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t e = 0; e < experts; ++e) {
        score[e] = logistic(logits[t * experts + e]);
        choice[e] = score[e] + bp[e];  // the bias steers selection only
      }
      // A group's score is the sum of its two best `choice` values; only the topk_group best groups stay.
      for (int64_t gi = 0; gi < groups; ++gi) {
        const std::vector<int64_t> best =
            top_k_indices(choice.data() + gi * per_group, per_group, 2, nullptr);
        group_score[gi] = choice[gi * per_group + best[0]] + choice[gi * per_group + best[1]];
      }
      std::fill(allowed.begin(), allowed.end(), 0);
      for (int64_t gi : top_k_indices(group_score.data(), groups, p.topk_group, nullptr)) {
        std::fill(allowed.begin() + gi * per_group, allowed.begin() + (gi + 1) * per_group, 1);
      }
      const std::vector<int64_t> chosen = top_k_indices(choice.data(), experts, p.top_k, &allowed);
      float sum = 0.0f;
      for (int64_t j = 0; j < p.top_k; ++j) sum += score[chosen[j]];
      const float denom = p.renormalize ? sum + 1e-20f : 1.0f;
      for (int64_t j = 0; j < p.top_k; ++j) {
        ip[t * p.top_k + j] = static_cast<int32_t>(chosen[j]);
        wp[t * p.top_k + j] = score[chosen[j]] / denom * p.scaling;  // raw sigmoid score, not `choice`
      }
    }
  }
}

namespace {

// Expert e's matrix `which` as F32 [rows, cols]: a view of the dense weight, or its MXFP4 codes and scales
// dequantized for this call (the CPU keeps K3's experts packed, as a device backend does).
Tensor expert_matrix(const Tensor& w, const Tensor& scale, int64_t e, const char* which) {
  if (!scale.defined()) return w[e];
  return dequantize_mxfp4(w[e], scale[e], fmt::format("moe_experts {}[{}]", which, e));
}

void check_mxfp4_pair(const Tensor& codes, const Tensor& scale, int64_t rows, int64_t cols,
                      const char* name) {
  const char* op = "moe_experts";
  expect_tensor(codes, op, name, DType::kU8, 3, "[E_l, rows, cols/2] (MXFP4 codes)");
  expect_tensor(scale, op, name, DType::kU8, 3, "[E_l, rows, cols/32] (MXFP4 scales)");
  HLM_CHECK(cols % 32 == 0 && codes.dim(1) == rows && codes.dim(2) * 2 == cols && scale.dim(1) == rows &&
                scale.dim(2) * 32 == cols && scale.dim(0) == codes.dim(0),
            "moe_experts: MXFP4 {} codes {} and scales {} do not hold a [{}, {}] matrix per expert", name,
            codes.describe(), scale.describe(), rows, cols);
}

}  // namespace

Tensor moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertWeights& ew,
                   int64_t expert_begin, const ActivationParams& act) {
  const char* op = "moe_experts";
  expect_tensor(x, op, "x", DType::kF32, 2, "[T, D]");
  expect_tensor(idx, op, "idx", DType::kI32, 2, "[T, k]");
  expect_tensor(weights, op, "weights", DType::kF32, 2, "[T, k]");
  expect_dim(idx, 0, x.dim(0), op, "idx [T, k]", "the token count of x [T, D]");
  expect_same_shape(idx, weights, op, "idx", "weights", "[T, k]");
  const int64_t rows = x.dim(0), hidden = x.dim(1), top_k = idx.dim(1);
  int64_t local = 0, inter = 0;
  if (ew.mxfp4()) {
    HLM_CHECK(ew.gate.defined() && ew.up.defined() && ew.down.defined() && ew.up_scale.defined() &&
                  ew.down_scale.defined(),
              "moe_experts: MXFP4 experts need codes and scales for gate, up and down");
    local = ew.gate.dim(0);
    inter = ew.gate.rank() == 3 ? ew.gate.dim(1) : 0;
    check_mxfp4_pair(ew.gate, ew.gate_scale, inter, hidden, "gate");
    check_mxfp4_pair(ew.up, ew.up_scale, inter, hidden, "up");
    check_mxfp4_pair(ew.down, ew.down_scale, hidden, inter, "down");
    expect_dim(ew.up, 0, local, op, "up", "the local expert count of gate");
    expect_dim(ew.down, 0, local, op, "down", "the local expert count of gate");
  } else {
    expect_tensor(ew.gate, op, "gate", DType::kF32, 3, "[E_l, I, D]");
    expect_tensor(ew.up, op, "up", DType::kF32, 3, "[E_l, I, D]");
    expect_tensor(ew.down, op, "down", DType::kF32, 3, "[E_l, D, I]");
    expect_same_shape(ew.gate, ew.up, op, "gate", "up", "[E_l, I, D]");
    expect_dim(ew.gate, 2, hidden, op, "gate [E_l, I, D]", "the hidden size of x [T, D]");
    local = ew.gate.dim(0);
    inter = ew.gate.dim(1);
    expect_dim(ew.down, 0, local, op, "down [E_l, D, I]", "the local expert count of gate [E_l, I, D]");
    expect_dim(ew.down, 1, hidden, op, "down [E_l, D, I]", "the hidden size of x [T, D]");
    expect_dim(ew.down, 2, inter, op, "down [E_l, D, I]", "the intermediate size of gate [E_l, I, D]");
  }
  HLM_CHECK(expert_begin >= 0, "moe_experts: expert_begin must be >= 0, got {}", expert_begin);
  const int32_t* ip = idx.data<int32_t>();
  const float* wp = weights.data<float>();

  // Route list per local expert: (token, weight) in token order.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(local));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = ip[t * top_k + j];
      HLM_CHECK(e >= 0, "moe_experts: idx[{}][{}] = {} is not an expert id", t, j, e);
      if (e >= expert_begin && e < expert_begin + local)
        routed[e - expert_begin].emplace_back(t, wp[t * top_k + j]);
    }
  }

  Tensor y = Tensor::zeros({rows, hidden}, DType::kF32);  // [T, D]
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  std::vector<float> xs, hg, hu, ys;
  for (int64_t e = 0; e < local; ++e) {
    const auto& list = routed[e];
    const int64_t n = static_cast<int64_t>(list.size());
    if (n == 0) continue;
    const Tensor gate = expert_matrix(ew.gate, ew.gate_scale, e, "gate");  // [I, D]
    const Tensor up = expert_matrix(ew.up, ew.up_scale, e, "up");          // [I, D]
    const Tensor down = expert_matrix(ew.down, ew.down_scale, e, "down");  // [D, I]
    xs.resize(static_cast<size_t>(n * hidden));                            // [n, D] gathered tokens
    hg.resize(static_cast<size_t>(n * inter));   // [n, I] gate projection, then act(gate)·up
    hu.resize(static_cast<size_t>(n * inter));   // [n, I] up projection
    ys.resize(static_cast<size_t>(n * hidden));  // [n, D] expert output
#pragma omp parallel for
    for (int64_t r = 0; r < n; ++r) std::copy_n(xp + list[r].first * hidden, hidden, xs.data() + r * hidden);
    gemm(n, inter, hidden, xs.data(), hidden, gate.data<float>(), hidden, /*trans_b=*/true, hg.data(), inter,
         /*accumulate=*/false);
    gemm(n, inter, hidden, xs.data(), hidden, up.data<float>(), hidden, /*trans_b=*/true, hu.data(), inter,
         /*accumulate=*/false);
#pragma omp parallel for
    for (int64_t i = 0; i < n * inter; ++i) hg[i] = glu_value(hg[i], hu[i], act);
    gemm(n, hidden, inter, hg.data(), inter, down.data<float>(), inter, /*trans_b=*/true, ys.data(), hidden,
         /*accumulate=*/false);
    // Serial over the list: a token listed twice for one expert must not race with itself.
    for (int64_t r = 0; r < n; ++r) {
      const float wr = list[r].second;
      float* yr = yp + list[r].first * hidden;
      const float* src = ys.data() + r * hidden;
      for (int64_t d = 0; d < hidden; ++d) yr[d] += wr * src[d];
    }
  }
  return y;
}

}  // namespace hlm::cpu
