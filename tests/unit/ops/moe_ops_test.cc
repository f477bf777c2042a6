// MoE ops of the CPU backend: the grouped sigmoid router (docs/MODEL.md §7.1) against a reference written
// from the transformers KimiLinearTopkRouter, and the routed experts against loops in double, including
// the experts split over two ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/cpu/cpu_ops.h"
#include "ops_test_util.h"
#include "weights/mxfp4.h"

namespace hlm {
namespace {

using test::all_close;
using test::random_tensor;

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Indices of `v` by descending value, ties to the lower index.
std::vector<int> ranked(const std::vector<double>& v) {
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] > v[b]; });
  return order;
}

struct Routed {
  std::vector<int> idx;
  std::vector<double> weight;
};

Routed route_reference(const float* x, const Tensor& w, const Tensor& bias, const RouterParams& p,
                       bool grouped) {
  const int64_t experts = w.dim(0), hidden = w.dim(1), per_group = experts / p.num_expert_group;
  std::vector<double> score(experts), choice(experts);
  for (int64_t e = 0; e < experts; ++e) {
    double logit = 0;
    for (int64_t d = 0; d < hidden; ++d) logit += double(x[d]) * w.data<float>()[e * hidden + d];
    score[e] = sigmoid_d(logit);
    choice[e] = score[e] + bias.data<float>()[e];
  }
  if (grouped) {
    std::vector<double> group_score(p.num_expert_group);
    for (int64_t g = 0; g < p.num_expert_group; ++g) {
      std::vector<double> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
      std::sort(members.rbegin(), members.rend());
      group_score[g] = members[0] + members[1];
    }
    const std::vector<int> groups = ranked(group_score);
    for (int64_t g = 0; g < p.num_expert_group; ++g) {
      const bool kept =
          std::find(groups.begin(), groups.begin() + p.topk_group, g) != groups.begin() + p.topk_group;
      if (!kept) std::fill(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group, -INFINITY);
    }
  }
  const std::vector<int> order = ranked(choice);
  Routed r;
  double sum = 0;
  for (int64_t j = 0; j < p.top_k; ++j) {
    r.idx.push_back(order[j]);
    r.weight.push_back(score[order[j]]);
    sum += score[order[j]];
  }
  for (double& v : r.weight) v = (p.renormalize ? v / (sum + 1e-20) : v) * p.scaling;
  return r;
}

TEST(MoeOps, RouteMatchesGroupedTopkReference) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(31);
  const int64_t rows = 40, hidden = 48, experts = 16;
  Tensor x = random_tensor({rows, hidden}, rng), w = random_tensor({experts, hidden}, rng, -0.3f, 0.3f);
  Tensor bias = random_tensor({experts}, rng, -0.2f, 0.2f);
  for (bool renormalize : {true, false}) {
    RouterParams p;
    p.top_k = 4;
    p.num_expert_group = 4;
    p.topk_group = 2;
    p.renormalize = renormalize;
    p.scaling = 2.446f;
    Tensor idx, weights;
    ops->moe_route(x, w, bias, p, idx, weights);
    ASSERT_EQ(idx.shape(), (Shape{rows, 4}));
    ASSERT_EQ(weights.shape(), (Shape{rows, 4}));
    int grouping_mattered = 0;
    for (int64_t t = 0; t < rows; ++t) {
      const Routed ref = route_reference(x.data<float>() + t * hidden, w, bias, p, true);
      const Routed flat = route_reference(x.data<float>() + t * hidden, w, bias, p, false);
      grouping_mattered += ref.idx != flat.idx;
      for (int j = 0; j < 4; ++j) {
        EXPECT_EQ(idx.data<int32_t>()[t * 4 + j], ref.idx[j]) << "row " << t;
        EXPECT_NEAR(weights.data<float>()[t * 4 + j], ref.weight[j], 1e-6 * std::abs(ref.weight[j]))
            << "row " << t;
      }
    }
    EXPECT_GT(grouping_mattered, 0);  // the group restriction changed some selections
  }
}

TEST(MoeOps, RouteTiesPreferLowerIndices) {
  auto ops = make_cpu_ops();
  const int64_t experts = 8;
  Tensor x = Tensor::zeros({2, 4}, DType::kF32);  // every score is sigmoid(0) = 0.5
  Tensor w = Tensor::filled({experts, 4}, 1.0f), bias = Tensor::zeros({experts}, DType::kF32);
  RouterParams p;
  p.top_k = 3;
  p.num_expert_group = 4;
  p.topk_group = 2;
  p.scaling = 3.0f;
  Tensor idx, weights;
  ops->moe_route(x, w, bias, p, idx, weights);
  for (int64_t t = 0; t < 2; ++t) {
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(idx.data<int32_t>()[t * 3 + j], j);
      EXPECT_FLOAT_EQ(weights.data<float>()[t * 3 + j], 1.0f);  // 0.5 / 1.5 · 3
    }
  }
}

TEST(MoeOps, RouteRejectsBadParams) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(32);
  Tensor x = random_tensor({3, 8}, rng), w = random_tensor({12, 8}, rng), bias = random_tensor({12}, rng);
  auto run = [&](int64_t top_k, int64_t groups, int64_t topk_group) {
    RouterParams p;
    p.top_k = top_k;
    p.num_expert_group = groups;
    p.topk_group = topk_group;
    Tensor idx, weights;
    ops->moe_route(x, w, bias, p, idx, weights);
  };
  EXPECT_NO_THROW(run(2, 3, 1));
  EXPECT_THROW(run(2, 5, 1), Error);   // 12 experts do not split into 5 groups
  EXPECT_THROW(run(2, 12, 1), Error);  // groups of 1
  EXPECT_THROW(run(5, 3, 1), Error);   // more experts than the kept group holds
  EXPECT_THROW(run(2, 3, 4), Error);
  Tensor idx, weights;
  EXPECT_THROW(
      ops->moe_route(x, w, random_tensor({11}, rng), RouterParams{2, 1, 1, true, 1.0f}, idx, weights), Error);
  EXPECT_THROW(
      ops->moe_route(x, random_tensor({12, 9}, rng), bias, RouterParams{2, 1, 1, true, 1.0f}, idx, weights),
      Error);
}

// Reference routed sum over the experts [begin, begin + E_l) held in gate/up/down, in double.
std::vector<double> experts_reference(const Tensor& x, const Tensor& idx, const Tensor& weights,
                                      const Tensor& gate, const Tensor& up, const Tensor& down, int64_t begin,
                                      const ActivationParams& act) {
  const int64_t rows = x.dim(0), hidden = x.dim(1), top_k = idx.dim(1), local = gate.dim(0),
                inter = gate.dim(1);
  std::vector<double> y(rows * hidden, 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = idx.data<int32_t>()[t * top_k + j] - begin;
      if (e < 0 || e >= local) continue;
      std::vector<double> h(inter);
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < hidden; ++d) {
          g += double(gate.data<float>()[(e * inter + i) * hidden + d]) * x.data<float>()[t * hidden + d];
          u += double(up.data<float>()[(e * inter + i) * hidden + d]) * x.data<float>()[t * hidden + d];
        }
        h[i] = act.kind == Activation::kSilu ? g * sigmoid_d(g) * u
                                             : act.situ_beta * std::tanh(g / act.situ_beta) * sigmoid_d(g) *
                                                   act.situ_linear_beta * std::tanh(u / act.situ_linear_beta);
      }
      for (int64_t d = 0; d < hidden; ++d) {
        double o = 0;
        for (int64_t i = 0; i < inter; ++i)
          o += double(down.data<float>()[(e * hidden + d) * inter + i]) * h[i];
        y[t * hidden + d] += weights.data<float>()[t * top_k + j] * o;
      }
    }
  }
  return y;
}

TEST(MoeOps, ExpertsMatchReferenceAndSplitOverRanks) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(33);
  const int64_t rows = 11, hidden = 40, inter = 24, experts = 6, top_k = 2;
  Tensor x = random_tensor({rows, hidden}, rng, -2.0f, 2.0f);
  Tensor gate = random_tensor({experts, inter, hidden}, rng),
         up = random_tensor({experts, inter, hidden}, rng);
  Tensor down = random_tensor({experts, hidden, inter}, rng);
  Tensor idx = Tensor::empty({rows, top_k}, DType::kI32);
  Tensor weights = random_tensor({rows, top_k}, rng, 0.1f, 1.5f);
  for (int64_t t = 0; t < rows; ++t) {  // two distinct experts per token; token 0 only on the first half
    const int32_t a = static_cast<int32_t>(rng() % experts);
    idx.data<int32_t>()[t * 2] = t == 0 ? 0 : a;
    idx.data<int32_t>()[t * 2 + 1] =
        t == 0 ? 2 : static_cast<int32_t>((a + 1 + rng() % (experts - 1)) % experts);
  }
  ActivationParams situ;
  situ.kind = Activation::kSitu;
  for (const ActivationParams& act : {ActivationParams{}, situ}) {
    Tensor full = ops->moe_experts(x, idx, weights, ExpertWeights{gate, up, down}, 0, act);
    EXPECT_TRUE(all_close(full, experts_reference(x, idx, weights, gate, up, down, 0, act), 1e-5));

    const int64_t half = experts / 2;
    Tensor first = ops->moe_experts(
        x, idx, weights, ExpertWeights{gate.slice(0, half), up.slice(0, half), down.slice(0, half)}, 0, act);
    Tensor second = ops->moe_experts(
        x, idx, weights,
        ExpertWeights{gate.slice(half, experts), up.slice(half, experts), down.slice(half, experts)}, half,
        act);
    EXPECT_TRUE(all_close(second,
                          experts_reference(x, idx, weights, gate.slice(half, experts),
                                            up.slice(half, experts), down.slice(half, experts), half, act),
                          1e-5));
    for (int64_t d = 0; d < hidden; ++d) EXPECT_EQ(second.data<float>()[d], 0.0f);  // token 0 is elsewhere
    ops->add_inplace(first, second);
    EXPECT_TRUE(all_close(first, full, 1e-5));
  }
}

TEST(MoeOps, ExpertsRejectBadShapes) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(34);
  Tensor x = random_tensor({3, 8}, rng), gate = random_tensor({2, 4, 8}, rng),
         up = random_tensor({2, 4, 8}, rng);
  Tensor down = random_tensor({2, 8, 4}, rng), weights = random_tensor({3, 2}, rng);
  Tensor idx = Tensor::from_vector_i32({3, 2}, {0, 1, 1, 0, 0, 1});
  EXPECT_NO_THROW(ops->moe_experts(x, idx, weights, ExpertWeights{gate, up, down}, 0, {}));
  EXPECT_THROW(
      ops->moe_experts(x, idx, weights, ExpertWeights{gate, up, random_tensor({2, 4, 8}, rng)}, 0, {}),
      Error);
  EXPECT_THROW(
      ops->moe_experts(x, idx, weights, ExpertWeights{gate, random_tensor({2, 5, 8}, rng), down}, 0, {}),
      Error);
  EXPECT_THROW(ops->moe_experts(x, idx, random_tensor({3, 3}, rng), ExpertWeights{gate, up, down}, 0, {}),
               Error);
  EXPECT_THROW(
      ops->moe_experts(random_tensor({3, 9}, rng), idx, weights, ExpertWeights{gate, up, down}, 0, {}),
      Error);
  EXPECT_THROW(ops->moe_experts(x, Tensor::from_vector_i32({3, 2}, {0, -1, 1, 0, 0, 1}), weights,
                                ExpertWeights{gate, up, down}, 0, {}),
               Error);
}

TEST(MoeOps, PackedMxfp4ExpertsEqualTheirDequantizedDenseForm) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(35);
  const int64_t experts = 3, hidden = 64, inter = 32, rows = 5;
  auto packed = [&](int64_t r, int64_t c) {
    Tensor codes = Tensor::empty({experts, r, c / 2}, DType::kU8);
    Tensor scales = Tensor::empty({experts, r, c / 32}, DType::kU8);
    for (int64_t i = 0; i < codes.numel(); ++i) codes.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
    for (int64_t i = 0; i < scales.numel(); ++i)
      scales.data<uint8_t>()[i] = static_cast<uint8_t>(120 + rng() % 4);
    return std::pair{codes, scales};
  };
  auto dense = [&](const std::pair<Tensor, Tensor>& p) {
    std::vector<Tensor> parts;
    for (int64_t e = 0; e < experts; ++e) parts.push_back(dequantize_mxfp4(p.first[e], p.second[e], "test"));
    Tensor out = Tensor::empty({experts, parts[0].dim(0), parts[0].dim(1)}, DType::kF32);
    for (int64_t e = 0; e < experts; ++e)
      std::copy_n(parts[e].data<float>(), parts[e].numel(), out.data<float>() + e * parts[e].numel());
    return out;
  };
  const auto g = packed(inter, hidden), u = packed(inter, hidden), d = packed(hidden, inter);
  ExpertWeights mx{g.first, u.first, d.first, g.second, u.second, d.second};
  Tensor x = random_tensor({rows, hidden}, rng), weights = random_tensor({rows, 2}, rng, 0.1f, 1.0f);
  Tensor idx = Tensor::from_vector_i32({rows, 2}, {0, 1, 2, 0, 1, 1, 2, 1, 0, 2});
  Tensor got = ops->moe_experts(x, idx, weights, mx, 0, {});
  Tensor want = ops->moe_experts(x, idx, weights, ExpertWeights{dense(g), dense(u), dense(d)}, 0, {});
  EXPECT_TRUE(all_close(got, want, 0.0));
}

}  // namespace
}  // namespace hlm
