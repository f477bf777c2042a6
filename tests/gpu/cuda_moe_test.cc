// The CUDA backend's MoE ops (router, routed experts) against the CPU reference.
//
// Router: inputs are dyadic (x = i/16, w = j/256 with |i|, |j| <= 16), so every product and partial sum
// of the logits is exact in fp32 and both backends get identical logits whatever their summation order.
// What remains is expf on the GPU (<= 2 ulp) against glibc's expf (<= 1 ulp): the sigmoid scores differ
// by a few 1e-7 relative, so the weights are compared at 2e-6 relative, and the chosen ids exactly,
// except for tokens where two biased scores that decide the selection lie within 2e-6 of each other
// (about 1 token in 40 at 896 experts; counted, and bounded so the check cannot go vacuous). Exact ties
// (identical rows and biases) are decided by index on both backends and are compared.
//
// Experts: the GPU rounds act(gate)·up to bf16 before the down projection (the CPU keeps fp32), a
// rounding error of ~1.6e-3 relative per element that carries into the output at the same relative L2
// (measured 1.3e-3 .. 2.6e-3 in a numpy model of both paths over these shapes), so outputs are compared at
// 5e-3 relative L2. Weights and activations are bf16-exact (MXFP4 dequantizes exactly), so nothing else
// differs beyond fp32 summation order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace hlm::test {
namespace {

constexpr double kRouteWeightRtol = 2e-6;
constexpr double kNearTie = 2e-6;
constexpr double kExpertsRelL2 = 5e-3;

// Values i/denominator with integer i uniform in [-max_num, max_num].
Tensor dyadic(const Shape& shape, std::mt19937& rng, float denominator, int max_num) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::uniform_int_distribution<int> dist(-max_num, max_num);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(dist(rng)) / denominator;
  return t;
}

// A host F32 tensor with bf16-exact values on the GPU as BF16 or F32.
Tensor upload_as(Ops& gpu, const Tensor& host, DType dtype) {
  return gpu.upload(dtype == DType::kBF16 ? as_bf16(host) : host);
}

// --- router ------------------------------------------------------------------------------------------------

// The smallest nonzero gap between two biased scores whose order decides token selection (consecutive
// chosen experts, the last chosen and the best one left, the last kept group and the best one dropped),
// in double from exact logits. A zero gap is an exact tie, decided by index on both backends alike.
double selection_margin(const float* logits, const float* bias, int64_t experts, const RouterParams& p,
                        bool* exact_tie) {
  std::vector<double> choice(experts);
  for (int64_t e = 0; e < experts; ++e) choice[e] = 1.0 / (1.0 + std::exp(-double(logits[e]))) + bias[e];
  std::vector<double> gaps, allowed;
  const int64_t per_group = experts / p.num_expert_group;
  if (p.num_expert_group > 1) {
    std::vector<double> group_score(p.num_expert_group);
    for (int64_t g = 0; g < p.num_expert_group; ++g) {
      std::vector<double> m(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
      std::sort(m.rbegin(), m.rend());
      group_score[g] = m[0] + m[1];
    }
    std::vector<int64_t> order(p.num_expert_group);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
    if (p.topk_group < p.num_expert_group) {
      gaps.push_back(group_score[order[p.topk_group - 1]] - group_score[order[p.topk_group]]);
    }
    for (int64_t r = 0; r < p.topk_group; ++r) {
      allowed.insert(allowed.end(), choice.begin() + order[r] * per_group,
                     choice.begin() + (order[r] + 1) * per_group);
    }
  } else {
    allowed = choice;
  }
  std::sort(allowed.rbegin(), allowed.rend());
  for (int64_t r = 0; r < p.top_k && r + 1 < static_cast<int64_t>(allowed.size()); ++r) {
    gaps.push_back(allowed[r] - allowed[r + 1]);
  }
  double margin = INFINITY;
  for (double gap : gaps) {
    if (gap == 0.0) {
      *exact_tie = true;
    } else {
      margin = std::min(margin, gap);
    }
  }
  return margin;
}

struct RouteResult {
  int64_t compared = 0;
  int64_t near_ties = 0;
  int64_t exact_ties = 0;
};

// Runs the router on both backends (x, w, bias hold bf16-exact values; the GPU gets them in the dtypes
// given) and compares ids and weights token by token.
RouteResult expect_route_matches(Ops& gpu, Ops& cpu, const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const RouterParams& p, DType x_dtype, DType w_dtype, DType bias_dtype,
                                 const std::string& what) {
  const int64_t rows = x.dim(0), experts = w.dim(0), k = p.top_k;
  Tensor want_idx, want_w;
  cpu.moe_route(x, w, bias, p, want_idx, want_w);
  Tensor gidx, gw;
  gpu.moe_route(upload_as(gpu, x, x_dtype), upload_as(gpu, w, w_dtype), upload_as(gpu, bias, bias_dtype), p,
                gidx, gw);
  EXPECT_EQ(gidx.dtype(), DType::kI32);
  EXPECT_EQ(gw.dtype(), DType::kF32);
  EXPECT_EQ(gidx.shape(), (Shape{rows, k}));
  const Tensor got_idx = gpu.to_host(gidx), got_w = gpu.to_host(gw);
  const Tensor logits = cpu.linear(x, w, true);  // [T, E], exact for dyadic inputs

  RouteResult r;
  int64_t mismatches = 0;
  for (int64_t t = 0; t < rows; ++t) {
    bool exact_tie = false;
    const double margin =
        selection_margin(logits.data<float>() + t * experts, bias.data<float>(), experts, p, &exact_tie);
    r.exact_ties += exact_tie;
    if (margin < kNearTie) {
      ++r.near_ties;
      continue;
    }
    ++r.compared;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t gi = got_idx.data<int32_t>()[t * k + j], wi = want_idx.data<int32_t>()[t * k + j];
      const float gv = got_w.data<float>()[t * k + j], wv = want_w.data<float>()[t * k + j];
      if (gi != wi || !(std::abs(gv - wv) <= kRouteWeightRtol * std::abs(wv))) {
        if (mismatches++ == 0) {
          ADD_FAILURE() << what << ": token " << t << " slot " << j << ": GPU expert " << gi << " weight "
                        << gv << ", CPU expert " << wi << " weight " << wv << " (selection margin " << margin
                        << ")";
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
  EXPECT_LE(r.near_ties, std::max<int64_t>(1, rows / 8)) << what << ": too many near ties to be a test";
  return r;
}

struct RouteShape {
  int64_t tokens, hidden, experts;
  RouterParams p;
};

// The logits of 1 token come from the CUDA-core kernel, of 8 from it for the 48B's F32 router weight and
// from the skinny GEMM for K3's BF16 one, of 64 from cuBLASLt; K3's 896 experts select on eight warps.
TEST(CudaMoe, RouteKimiLinearAndK3Shapes) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(41);
  const RouterParams kimi{8, 1, 1, true, 2.446f};
  const RouterParams k3{16, 1, 1, true, 1.0f};
  const RouterParams k3_grouped{16, 8, 4, true, 1.0f};
  for (const RouteShape& s :
       {RouteShape{1, 2304, 256, kimi}, RouteShape{64, 2304, 256, kimi}, RouteShape{8, 2304, 256, kimi},
        RouteShape{1, 7168, 896, k3}, RouteShape{8, 7168, 896, k3}, RouteShape{64, 7168, 896, k3},
        RouteShape{64, 7168, 896, k3_grouped}}) {
    Tensor x = dyadic({s.tokens, s.hidden}, rng, 16.0f, 16);
    Tensor w = dyadic({s.experts, s.hidden}, rng, 256.0f, 16);
    Tensor bias = random_f32({s.experts}, rng, -0.1f, 0.1f);
    const std::string what = "T " + std::to_string(s.tokens) + " E " + std::to_string(s.experts) +
                             " groups " + std::to_string(s.p.num_expert_group);
    // Kimi Linear stores the router weight in F32, K3 in BF16.
    const DType w_dtype = s.experts == 256 ? DType::kF32 : DType::kBF16;
    const RouteResult r =
        expect_route_matches(*gpu, *cpu, x, w, bias, s.p, DType::kBF16, w_dtype, DType::kF32, what);
    EXPECT_GE(r.compared, 1) << what;
  }
}

TEST(CudaMoe, RouteTinyShapesAllDtypes) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(42);
  for (bool renormalize : {true, false}) {
    const RouterParams grouped{4, 4, 2, renormalize, 1.5f};  // the tiny grouped fixtures
    const RouterParams pairs{2, 2, 1, renormalize, 2.446f};
    for (const RouteShape& s : {RouteShape{7, 64, 16, grouped}, RouteShape{9, 64, 8, pairs}}) {
      Tensor x = dyadic({s.tokens, s.hidden}, rng, 16.0f, 16);
      Tensor w = dyadic({s.experts, s.hidden}, rng, 256.0f, 16);
      Tensor bias = round_bf16(random_f32({s.experts}, rng, -0.1f, 0.1f));
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        const std::string what = "E " + std::to_string(s.experts) + " renormalize " +
                                 std::to_string(renormalize) + (dtype == DType::kF32 ? " F32" : " BF16");
        expect_route_matches(*gpu, *cpu, x, w, bias, s.p, dtype, dtype, dtype, what);
      }
    }
  }
}

// x = 0 and no bias: every expert's score is sigmoid(0), so the selection is the lowest indices in order.
void expect_all_tied_route(Ops& gpu, Ops& cpu, int64_t rows, const Tensor& w, const RouterParams& p) {
  const Tensor zeros = Tensor::zeros({rows, w.dim(1)}, DType::kF32);
  const Tensor no_bias = Tensor::zeros({w.dim(0)}, DType::kF32);
  const RouteResult r = expect_route_matches(gpu, cpu, zeros, w, no_bias, p, DType::kBF16, DType::kBF16,
                                             DType::kF32, "all tied");
  EXPECT_EQ(r.compared, rows);
}

TEST(CudaMoe, RouteTiesGoToLowerIndices) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(43);
  const int64_t rows = 12, hidden = 64, experts = 16, per_group = 4;
  const RouterParams p{4, 4, 2, true, 1.0f};
  auto copy_group = [&](Tensor& w, Tensor& bias, int64_t from, int64_t to) {
    std::copy_n(w.data<float>() + from * per_group * hidden, per_group * hidden,
                w.data<float>() + to * per_group * hidden);
    std::copy_n(bias.data<float>() + from * per_group, per_group, bias.data<float>() + to * per_group);
  };
  auto set_group_bias = [&](Tensor& bias, int64_t g, float offset) {
    for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) bias.data<float>()[e] += offset;
  };
  Tensor x = dyadic({rows, hidden}, rng, 16.0f, 16);

  // Groups 0 and 1 identical and clearly best: both kept, each expert tied with its twin, lower first.
  Tensor w = dyadic({experts, hidden}, rng, 256.0f, 16);
  Tensor bias = round_bf16(random_f32({experts}, rng, -0.05f, 0.05f));
  set_group_bias(bias, 0, 0.5f);
  copy_group(w, bias, 0, 1);
  RouteResult r =
      expect_route_matches(*gpu, *cpu, x, w, bias, p, DType::kBF16, DType::kBF16, DType::kF32, "twins");
  EXPECT_EQ(r.exact_ties, rows);
  EXPECT_EQ(r.compared, rows);

  // Groups 2 and 3 identical and tied for the second kept group: group 2 stays, and with top-6 two of
  // its experts follow group 0's four.
  w = dyadic({experts, hidden}, rng, 256.0f, 16);
  bias = round_bf16(random_f32({experts}, rng, -0.05f, 0.05f));
  set_group_bias(bias, 0, 0.5f);
  set_group_bias(bias, 1, -0.5f);
  copy_group(w, bias, 2, 3);
  const RouterParams p6{6, 4, 2, true, 1.0f};
  r = expect_route_matches(*gpu, *cpu, x, w, bias, p6, DType::kBF16, DType::kBF16, DType::kF32,
                           "tied groups");
  EXPECT_EQ(r.exact_ties, rows);
  EXPECT_EQ(r.compared, rows);

  // Every score equal: groups 0, 1 and experts 0..3.
  expect_all_tied_route(*gpu, *cpu, rows, w, p);
}

// Past 256 experts without groups the selection runs over the warps of a CTA, each ranking a strided
// share before one warp merges their winners (router_select_wide_kernel): experts tied across warps (5, 100
// and 700: warps 0, 3 and 5; their bias puts them first) and all 896 tied must still come out lowest index
// first.
TEST(CudaMoe, RouteTiesAcrossTheWarpsOfAWideRouter) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(45);
  const int64_t rows = 6, hidden = 128, experts = 896;
  const RouterParams p{16, 1, 1, true, 1.0f};
  Tensor x = dyadic({rows, hidden}, rng, 16.0f, 16);
  Tensor w = dyadic({experts, hidden}, rng, 256.0f, 16);
  Tensor bias = round_bf16(random_f32({experts}, rng, -0.05f, 0.05f));
  for (int64_t e : {100, 700})
    std::copy_n(w.data<float>() + 5 * hidden, hidden, w.data<float>() + e * hidden);
  for (int64_t e : {5, 100, 700}) bias.data<float>()[e] = 2.0f;
  RouteResult r = expect_route_matches(*gpu, *cpu, x, w, bias, p, DType::kBF16, DType::kBF16, DType::kF32,
                                       "triplets across warps");
  EXPECT_EQ(r.exact_ties, rows);
  EXPECT_EQ(r.compared, rows);
  expect_all_tied_route(*gpu, *cpu, rows, w, p);
}

TEST(CudaMoe, RouteRejectsMoreExpertsThanOneWarpRanks) {
  HLM_GPU_OR_SKIP(gpu);
  std::mt19937 rng(44);
  Tensor x = gpu->upload(random_f32({2, 64}, rng)), w = gpu->upload(random_f32({1056, 64}, rng));
  Tensor bias = gpu->upload(random_f32({1056}, rng));
  Tensor idx, weights;
  EXPECT_THROW(gpu->moe_route(x, w, bias, RouterParams{8, 1, 1, true, 1.0f}, idx, weights), Error);
  // Lane r of the selecting warp keeps round r: at most 32 experts per token.
  Tensor w64 = gpu->upload(random_f32({64, 64}, rng)), bias64 = gpu->upload(random_f32({64}, rng));
  EXPECT_THROW(gpu->moe_route(x, w64, bias64, RouterParams{33, 1, 1, true, 1.0f}, idx, weights), Error);
}

// --- experts -----------------------------------------------------------------------------------------------

// The same experts for both backends: host F32 (CPU) and device (GPU) copies of dense weights, or the same
// MXFP4 codes and scales.
struct Experts {
  ExpertWeights cpu, gpu;
};

// Dense experts with bf16-exact values scaled so gate·x and down·h stay O(1); the GPU copy in `dtype`.
Experts dense_experts(Ops& gpu, int64_t local, int64_t inter, int64_t hidden, DType dtype,
                      std::mt19937& rng) {
  const float a = std::sqrt(3.0f / hidden), b = std::sqrt(3.0f / inter);
  Experts ex;
  ex.cpu.gate = round_bf16(random_f32({local, inter, hidden}, rng, -a, a));
  ex.cpu.up = round_bf16(random_f32({local, inter, hidden}, rng, -a, a));
  ex.cpu.down = round_bf16(random_f32({local, hidden, inter}, rng, -b, b));
  ex.gpu.gate = upload_as(gpu, ex.cpu.gate, dtype);
  ex.gpu.up = upload_as(gpu, ex.cpu.up, dtype);
  ex.gpu.down = upload_as(gpu, ex.cpu.down, dtype);
  return ex;
}

// Random MXFP4 codes, and scales with exponents uniform in [lo, hi] (127 - 7 gives weights ~2e-2), for one
// matrix of `local` experts [rows, cols].
void mxfp4_matrix(Ops& gpu, int64_t local, int64_t rows, int64_t cols, int lo, int hi, std::mt19937& rng,
                  Tensor& codes, Tensor& scales, Tensor& gpu_codes, Tensor& gpu_scales) {
  codes = Tensor::empty({local, rows, cols / 2}, DType::kU8);
  scales = Tensor::empty({local, rows, cols / 32}, DType::kU8);
  std::uniform_int_distribution<int> byte(0, 255), exponent(lo, hi);
  for (int64_t i = 0; i < codes.numel(); ++i) codes.data<uint8_t>()[i] = static_cast<uint8_t>(byte(rng));
  for (int64_t i = 0; i < scales.numel(); ++i)
    scales.data<uint8_t>()[i] = static_cast<uint8_t>(exponent(rng));
  gpu_codes = gpu.upload(codes);
  gpu_scales = gpu.upload(scales);
}

Experts mxfp4_experts(Ops& gpu, int64_t local, int64_t inter, int64_t hidden, int gate_lo, int gate_hi,
                      int down_lo, int down_hi, std::mt19937& rng) {
  Experts ex;
  mxfp4_matrix(gpu, local, inter, hidden, gate_lo, gate_hi, rng, ex.cpu.gate, ex.cpu.gate_scale, ex.gpu.gate,
               ex.gpu.gate_scale);
  mxfp4_matrix(gpu, local, inter, hidden, gate_lo, gate_hi, rng, ex.cpu.up, ex.cpu.up_scale, ex.gpu.up,
               ex.gpu.up_scale);
  mxfp4_matrix(gpu, local, hidden, inter, down_lo, down_hi, rng, ex.cpu.down, ex.cpu.down_scale, ex.gpu.down,
               ex.gpu.down_scale);
  return ex;
}

// idx [T, k]: k distinct experts of [0, total) per token; each slot takes an expert of the local range
// [begin, begin + local) with probability local_share (while the token has local experts left).
Tensor random_routing(int64_t rows, int64_t k, int64_t total, int64_t begin, int64_t local,
                      double local_share, std::mt19937& rng) {
  Tensor idx = Tensor::empty({rows, k}, DType::kI32);
  std::uniform_int_distribution<int64_t> any(0, total - 1), in_range(begin, begin + local - 1);
  std::bernoulli_distribution take_local(local_share);
  for (int64_t t = 0; t < rows; ++t) {
    int32_t* row = idx.data<int32_t>() + t * k;
    int64_t local_taken = 0;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      const bool want_local = local_taken < local && take_local(rng);
      do {
        e = static_cast<int32_t>(want_local ? in_range(rng) : any(rng));
      } while (std::find(row, row + j, e) != row + j);
      local_taken += e >= begin && e < begin + local;
      row[j] = e;
    }
  }
  return idx;
}

struct ExpertRun {
  Tensor want, got;
};

// Runs the routed experts on both backends (x bf16-exact; the GPU gets it as x_dtype) and compares them;
// rows of tokens with no local expert must be exactly zero on the GPU.
ExpertRun expect_experts_match(Ops& gpu, Ops& cpu, const Tensor& x, const Tensor& idx, const Tensor& weights,
                               const Experts& ex, int64_t begin, const ActivationParams& act, DType x_dtype,
                               const std::string& what) {
  ExpertRun run;
  run.want = cpu.moe_experts(x, idx, weights, ex.cpu, begin, act);
  Tensor out =
      gpu.moe_experts(upload_as(gpu, x, x_dtype), gpu.upload(idx), gpu.upload(weights), ex.gpu, begin, act);
  EXPECT_EQ(out.dtype(), DType::kF32) << what;
  EXPECT_EQ(out.shape(), run.want.shape()) << what;
  run.got = gpu.to_host_f32(out);
  EXPECT_LE(rel_l2(run.got, run.want), kExpertsRelL2) << what;
  const int64_t rows = x.dim(0), hidden = x.dim(1), k = idx.dim(1), local = ex.cpu.gate.dim(0);
  int64_t routed_here = 0;
  for (int64_t t = 0; t < rows; ++t) {
    bool any_local = false;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = idx.data<int32_t>()[t * k + j];
      any_local = any_local || (e >= begin && e < begin + local);
    }
    routed_here += any_local;
    if (any_local) continue;
    for (int64_t d = 0; d < hidden; ++d) {
      if (run.got.data<float>()[t * hidden + d] != 0.0f) {
        ADD_FAILURE() << what << ": token " << t << " has no local expert but output "
                      << run.got.data<float>()[t * hidden + d] << " at " << d;
        break;
      }
    }
  }
  EXPECT_GT(routed_here, 0) << what << ": no token reaches a local expert";
  return run;
}

ActivationParams activation(Activation kind) {
  ActivationParams act;
  act.kind = kind;
  return act;
}

TEST(CudaMoe, ExpertsKimiLinearAndK3Shapes) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(51);
  // A few experts of the model on this rank (expert parallelism). Kimi Linear: 6 of 256 BF16 experts,
  // hidden 2304, intermediate 1024, top-8, SiLU; half the slots land here, so at T = 512 an expert gets
  // ~340 pairs (three 128-pair tiles). K3: 4 of 896 MXFP4 experts in the latent width 3584, intermediate
  // 3072, top-16, SiTU; at T = 64 an expert gets ~64 tokens, more than one 32-token pass, at T = 300 ~300
  // (three 128-pair tiles of the tiled GEMMs, the last under 64 pairs).
  struct Shape {
    int64_t hidden, inter, local, begin, total, k;
    double local_share;
    bool mxfp4;
    Activation act;
  };
  for (const Shape& s : {Shape{2304, 1024, 6, 100, 256, 8, 0.5, false, Activation::kSilu},
                         Shape{3584, 3072, 4, 892, 896, 16, 0.25, true, Activation::kSitu}}) {
    const Experts ex = s.mxfp4 ? mxfp4_experts(*gpu, s.local, s.inter, s.hidden, 118, 122, 118, 122, rng)
                               : dense_experts(*gpu, s.local, s.inter, s.hidden, DType::kBF16, rng);
    // T = 1: BF16 the decode kernel (moe_decode_experts.cu, 64-row slices), MXFP4 (16 pairs) the one-warp
    // work list; larger T: the 1024-thread one. BF16 at T = 20: the 32-token streaming kernel; at T = 512
    // (4,096 pairs, at least 256 tokens and 8 pairs per local expert): the tiled GEMMs; MXFP4 at T = 300.
    const std::vector<int64_t> batches =
        s.mxfp4 ? std::vector<int64_t>{1, 16, 64, 300} : std::vector<int64_t>{1, 16, 20, 512};
    for (int64_t rows : batches) {
      Tensor x = round_bf16(random_f32({rows, s.hidden}, rng));
      Tensor idx = random_routing(rows, s.k, s.total, s.begin, s.local, s.local_share, rng);
      Tensor weights = random_f32({rows, s.k}, rng, 0.1f, 1.5f);
      expect_experts_match(*gpu, *cpu, x, idx, weights, ex, s.begin, activation(s.act), DType::kBF16,
                           "E " + std::to_string(s.total) + " T " + std::to_string(rows));
    }
  }
}

// moe_experts_add (the shared experts' output added in the combine kernel) is exactly moe_experts followed
// by add_inplace on the GPU (the same fp32 additions in the same order), and matches the CPU op; a token
// with no local expert gets exactly the addend.
TEST(CudaMoe, ExpertsAddIsExpertsThenAdd) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(57);
  const int64_t hidden = 256, inter = 64, local = 6, begin = 10, total = 32, k = 4, rows = 9;
  const Experts ex = dense_experts(*gpu, local, inter, hidden, DType::kBF16, rng);
  const ActivationParams act = activation(Activation::kSilu);
  Tensor x = round_bf16(random_f32({rows, hidden}, rng));
  Tensor idx = random_routing(rows, k, total, begin, local, 0.3, rng);
  for (int32_t j = 0; j < k; ++j) idx.data<int32_t>()[j] = j;  // token 0: no local expert
  Tensor weights = random_f32({rows, k}, rng, 0.1f, 1.5f);
  const Tensor addend = round_bf16(random_f32({rows, hidden}, rng, -2.0f, 2.0f));
  const Tensor xg = gpu->upload(as_bf16(x)), idx_g = gpu->upload(idx), w_g = gpu->upload(weights);
  for (DType addend_dtype : {DType::kBF16, DType::kF32}) {
    const std::string what = "addend " + std::string(dtype_name(addend_dtype));
    const Tensor addend_g = gpu->upload(addend_dtype == DType::kBF16 ? as_bf16(addend) : addend);
    const Tensor got = gpu->to_host_f32(gpu->moe_experts_add(xg, idx_g, w_g, ex.gpu, begin, act, addend_g));
    Tensor separate = gpu->moe_experts(xg, idx_g, w_g, ex.gpu, begin, act);
    gpu->add_inplace(separate, addend_g);
    const Tensor want_gpu = gpu->to_host_f32(separate);
    EXPECT_EQ(std::memcmp(got.raw(), want_gpu.raw(), got.nbytes()), 0) << what << ": not moe_experts + add";
    EXPECT_LE(rel_l2(got, cpu->moe_experts_add(x, idx, weights, ex.cpu, begin, act, addend)), kExpertsRelL2)
        << what;
    for (int64_t d = 0; d < hidden; ++d) ASSERT_EQ(got.data<float>()[d], addend.data<float>()[d]) << what;
  }
  // No token with a local expert: no active expert at all (every GEMM CTA exits at once), and the output is
  // exactly the addend.
  for (int64_t t = 0; t < rows * k; ++t) idx.data<int32_t>()[t] = static_cast<int32_t>(t % begin);
  const Tensor addend_g = gpu->upload(addend);
  const Tensor got =
      gpu->to_host_f32(gpu->moe_experts_add(xg, gpu->upload(idx), w_g, ex.gpu, begin, act, addend_g));
  EXPECT_EQ(std::memcmp(got.raw(), addend.raw(), got.nbytes()), 0) << "no local expert: not the addend";
}

TEST(CudaMoe, ExpertsTinyShapesEveryFormat) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(53);
  // The fixtures' hidden 64 and intermediate 32; T = 5, 9, 17 take one, two and four 8-token tiles (T = 5,
  // 20 pairs, with BF16 experts and x: the decode kernel, one 32-row slice).
  const int64_t hidden = 64, inter = 32, local = 16;
  const Experts bf16 = dense_experts(*gpu, local, inter, hidden, DType::kBF16, rng);
  const Experts f32 = dense_experts(*gpu, local, inter, hidden, DType::kF32, rng);
  const Experts mx = mxfp4_experts(*gpu, local, inter, hidden, 119, 123, 119, 123, rng);
  for (int64_t rows : {5, 9, 17}) {
    Tensor x = round_bf16(random_f32({rows, hidden}, rng, -2.0f, 2.0f));
    Tensor idx = random_routing(rows, 4, local, 0, local, 0.0, rng);
    Tensor weights = random_f32({rows, 4}, rng, 0.1f, 1.5f);
    for (Activation kind : {Activation::kSilu, Activation::kSitu}) {
      for (DType x_dtype : {DType::kBF16, DType::kF32}) {
        const std::string what = "T " + std::to_string(rows) +
                                 (kind == Activation::kSilu ? " silu" : " situ") +
                                 (x_dtype == DType::kBF16 ? " x BF16" : " x F32");
        expect_experts_match(*gpu, *cpu, x, idx, weights, bf16, 0, activation(kind), x_dtype,
                             what + " BF16 experts");
        expect_experts_match(*gpu, *cpu, x, idx, weights, f32, 0, activation(kind), x_dtype,
                             what + " F32 experts");
        expect_experts_match(*gpu, *cpu, x, idx, weights, mx, 0, activation(kind), x_dtype,
                             what + " MXFP4 experts");
      }
    }
  }
}

TEST(CudaMoe, ExpertsEdgeRoutings) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(54);
  const int64_t hidden = 64, inter = 32, local = 8;
  const ActivationParams silu = activation(Activation::kSilu);
  for (bool mxfp4 : {false, true}) {
    const Experts ex = mxfp4 ? mxfp4_experts(*gpu, local, inter, hidden, 119, 123, 119, 123, rng)
                             : dense_experts(*gpu, local, inter, hidden, DType::kBF16, rng);
    const std::string fmt = mxfp4 ? " (MXFP4)" : " (BF16)";

    // Every token on expert 3 (40 tokens: a full 32-token pass and a partial one), the other slot spread.
    {
      const int64_t rows = 40;
      Tensor idx = Tensor::empty({rows, 2}, DType::kI32);
      for (int64_t t = 0; t < rows; ++t) {
        idx.data<int32_t>()[t * 2] = 3;
        idx.data<int32_t>()[t * 2 + 1] = static_cast<int32_t>(t % 7 < 3 ? t % 7 : t % 7 + 1);
      }
      Tensor x = round_bf16(random_f32({rows, hidden}, rng));
      expect_experts_match(*gpu, *cpu, x, idx, random_f32({rows, 2}, rng, 0.1f, 1.5f), ex, 0, silu,
                           DType::kBF16, "one hot expert" + fmt);
    }
    // 12 tokens all on expert 3 in slot 0 (24 pairs: BF16 takes the decode kernel, whose expert then has
    // an 8-token pass and a 4-token one).
    {
      const int64_t rows = 12;
      Tensor idx = Tensor::empty({rows, 2}, DType::kI32);
      for (int64_t t = 0; t < rows; ++t) {
        idx.data<int32_t>()[t * 2] = 3;
        idx.data<int32_t>()[t * 2 + 1] = static_cast<int32_t>(t % 3 == 0 ? 7 : t % 3);
      }
      Tensor x = round_bf16(random_f32({rows, hidden}, rng));
      expect_experts_match(*gpu, *cpu, x, idx, random_f32({rows, 2}, rng, 0.1f, 1.5f), ex, 0, silu,
                           DType::kBF16, "one expert, two decode passes" + fmt);
    }
    // k = E: every token on every expert.
    {
      const int64_t rows = 3;
      Tensor idx = Tensor::empty({rows, local}, DType::kI32);
      for (int64_t t = 0; t < rows; ++t) {
        for (int64_t j = 0; j < local; ++j)
          idx.data<int32_t>()[t * local + j] = static_cast<int32_t>((j + t) % local);
      }
      Tensor x = round_bf16(random_f32({rows, hidden}, rng));
      expect_experts_match(*gpu, *cpu, x, idx, random_f32({rows, local}, rng, 0.1f, 1.5f), ex, 0, silu,
                           DType::kBF16, "k = E" + fmt);
    }
    // A token listing one expert twice (and another token listing it three times).
    {
      Tensor idx = Tensor::from_vector_i32({3, 3}, {2, 2, 5, 7, 1, 0, 4, 4, 4});
      Tensor x = round_bf16(random_f32({3, hidden}, rng));
      expect_experts_match(*gpu, *cpu, x, idx, random_f32({3, 3}, rng, 0.1f, 1.5f), ex, 0, silu, DType::kBF16,
                           "repeated expert" + fmt);
    }
    // Experts 8..15 of 24 on this rank: some tokens have none here (zero rows), some all, one partly.
    {
      Tensor idx = Tensor::from_vector_i32({5, 2}, {0, 1, 8, 15, 20, 23, 9, 9, 16, 12});
      Tensor x = round_bf16(random_f32({5, hidden}, rng));
      const ExpertRun run = expect_experts_match(*gpu, *cpu, x, idx, random_f32({5, 2}, rng, 0.1f, 1.5f), ex,
                                                 8, silu, DType::kBF16, "expert_begin 8" + fmt);
      for (int64_t d = 0; d < hidden; ++d) {
        EXPECT_EQ(run.got.data<float>()[d], 0.0f);
        EXPECT_EQ(run.got.data<float>()[2 * hidden + d], 0.0f);
      }
    }
    // 72 tokens (144 pairs, about 18 per expert): the 1024-thread work list and the 32-token kernel.
    {
      const int64_t rows = 72;
      Tensor idx = Tensor::empty({rows, 2}, DType::kI32);
      for (int64_t t = 0; t < rows; ++t) {
        idx.data<int32_t>()[t * 2] = static_cast<int32_t>(t % local);
        idx.data<int32_t>()[t * 2 + 1] = static_cast<int32_t>((t + 1 + t / local) % local);
      }
      Tensor x = round_bf16(random_f32({rows, hidden}, rng));
      expect_experts_match(*gpu, *cpu, x, idx, random_f32({rows, 2}, rng, 0.1f, 1.5f), ex, 0, silu,
                           DType::kBF16, "72 tokens" + fmt);
    }
    // One token: most experts get nothing.
    {
      Tensor idx = Tensor::from_vector_i32({1, 2}, {6, 1});
      Tensor x = round_bf16(random_f32({1, hidden}, rng));
      expect_experts_match(*gpu, *cpu, x, idx, random_f32({1, 2}, rng, 0.1f, 1.5f), ex, 0, silu, DType::kBF16,
                           "single token" + fmt);
    }
  }
}

// Prefill-sized batches (at least 256 tokens and 8 pairs per local expert, BF16 or MXFP4 weights, BF16 x)
// take the tiled GEMMs (moe_tiled_gemm.cu): an expert with several 128-pair tiles and a partial last one,
// experts with a few pairs, a token listing one expert twice, tokens with no expert on this rank, SiLU and
// SiTU, MXFP4 scales above 2 (the decode's second factor); and the same batch with F32 x, which takes the
// streaming kernels.
TEST(CudaMoe, ExpertsPrefillBatchesTiled) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(59);
  const int64_t hidden = 256, inter = 128, local = 6, begin = 2, k = 3, rows = 400;
  // Slot 0: expert 2 (local 0) for 300 tokens (3 tiles, the last partial), else a non-local expert; slot
  // 1: local experts 1..3 in turn up to token 350, token 7 repeating slot 0's expert, then non-local;
  // slot 2: local 5 for every 20th token, else non-local (so tokens 350..399 but 360 and 380 have none).
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t first = t < 300 ? 2 : static_cast<int32_t>(t % 2);
    ids.push_back(first);
    ids.push_back(t == 7 ? first : static_cast<int32_t>(t < 350 ? begin + 1 + t % 3 : 20 + t % 3));
    ids.push_back(t % 20 == 0 ? static_cast<int32_t>(begin + 5) : static_cast<int32_t>(10 + t % 5));
  }
  const Tensor idx = Tensor::from_vector_i32({rows, k}, ids);
  const Tensor x = round_bf16(random_f32({rows, hidden}, rng));
  const Tensor weights = random_f32({rows, k}, rng, 0.1f, 1.5f);
  ActivationParams situ = activation(Activation::kSitu);
  situ.situ_beta = 2.0f;
  situ.situ_linear_beta = 3.0f;
  for (bool mxfp4 : {false, true}) {
    const Experts ex = mxfp4 ? mxfp4_experts(*gpu, local, inter, hidden, 122, 129, 120, 129, rng)
                             : dense_experts(*gpu, local, inter, hidden, DType::kBF16, rng);
    for (const ActivationParams& act : {activation(Activation::kSilu), situ}) {
      const std::string what =
          std::string(mxfp4 ? "MXFP4, " : "BF16, ") + (act.kind == Activation::kSitu ? "SiTU" : "SiLU");
      expect_experts_match(*gpu, *cpu, x, idx, weights, ex, begin, act, DType::kBF16, what + ", tiled");
      expect_experts_match(*gpu, *cpu, x, idx, weights, ex, begin, act, DType::kF32, what + ", F32 x");
    }
  }
}

// From 8,192 pairs the work list is built by several CTAs of 4,096 pairs each (moe_experts.cu): 10,400 pairs
// in three CTAs, the last partial, with one local expert in slot 0 of every token (its segment gathered from
// all three), the other slots mostly local, the rest on other ranks; tiled (BF16 x) and streaming (F32 x).
TEST(CudaMoe, ExpertsLargeBatchWorkListOverCtas) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(61);
  const int64_t hidden = 128, inter = 64, local = 40, begin = 8, k = 4, rows = 2600;
  Tensor idx = random_routing(rows, k, 96, begin, local, 0.7, rng);
  for (int64_t t = 0; t < rows; ++t) idx.data<int32_t>()[t * k] = static_cast<int32_t>(begin);
  const Tensor x = round_bf16(random_f32({rows, hidden}, rng)),
               weights = random_f32({rows, k}, rng, 0.1f, 1.5f);
  const Experts ex = dense_experts(*gpu, local, inter, hidden, DType::kBF16, rng);
  for (DType x_dtype : {DType::kBF16, DType::kF32}) {
    expect_experts_match(*gpu, *cpu, x, idx, weights, ex, begin, activation(Activation::kSilu), x_dtype,
                         x_dtype == DType::kBF16 ? "tiled" : "F32 x");
  }
}

// Many local experts (1,024 and 1,100, the last one among those routed to) under a decode-sized batch (12
// pairs: the one-warp work list).
TEST(CudaMoe, ExpertsManyLocalExpertsSmallBatch) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(58);
  const int64_t hidden = 64, inter = 32, rows = 3, k = 4;
  for (int64_t local : {1024, 1100}) {
    const Experts ex = dense_experts(*gpu, local, inter, hidden, DType::kBF16, rng);
    Tensor idx =
        Tensor::from_vector_i32({rows, k}, {static_cast<int32_t>(local - 1), 0, 31, 32, 993,
                                            static_cast<int32_t>(local - 1), 7, 500, 1, 1000, 1023, 992});
    Tensor x = round_bf16(random_f32({rows, hidden}, rng));
    expect_experts_match(*gpu, *cpu, x, idx, random_f32({rows, k}, rng, 0.1f, 1.5f), ex, 0,
                         activation(Activation::kSilu), DType::kBF16, "E_l " + std::to_string(local));
  }
}

TEST(CudaMoe, ExpertsPartialChunksAndLargeScales) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(55);
  // Hidden 160 and intermediate 96 end inside a K chunk (dense chunks of 64, MXFP4 chunks of 128). The MXFP4
  // gate and up scales are 2^2..2^4 (exponent bytes above 128 take the two-factor path), down 2^-15..2^-11.
  const int64_t hidden = 160, inter = 96, local = 4, rows = 6;
  const Experts dense = dense_experts(*gpu, local, inter, hidden, DType::kBF16, rng);
  const Experts mx = mxfp4_experts(*gpu, local, inter, hidden, 129, 131, 112, 116, rng);
  Tensor idx = random_routing(rows, 2, local, 0, local, 0.0, rng);
  Tensor weights = random_f32({rows, 2}, rng, 0.1f, 1.5f);
  for (Activation kind : {Activation::kSilu, Activation::kSitu}) {
    const std::string what = kind == Activation::kSilu ? " silu" : " situ";
    expect_experts_match(*gpu, *cpu, round_bf16(random_f32({rows, hidden}, rng)), idx, weights, dense, 0,
                         activation(kind), DType::kBF16, "partial chunks BF16" + what);
    expect_experts_match(*gpu, *cpu, round_bf16(random_f32({rows, hidden}, rng, -0.05f, 0.05f)), idx, weights,
                         mx, 0, activation(kind), DType::kBF16, "partial chunks, large scales MXFP4" + what);
  }
}

TEST(CudaMoe, EmptyBatch) {
  HLM_GPU_OR_SKIP(gpu);
  std::mt19937 rng(57);
  Tensor x = gpu->upload(as_bf16(Tensor::empty({0, 64}, DType::kF32)));
  Tensor idx, weights;
  gpu->moe_route(x, gpu->upload(as_bf16(random_f32({16, 64}, rng))), gpu->upload(random_f32({16}, rng)),
                 RouterParams{4, 4, 2, true, 1.0f}, idx, weights);
  EXPECT_EQ(idx.shape(), (Shape{0, 4}));
  EXPECT_EQ(weights.shape(), (Shape{0, 4}));
  const Experts ex = dense_experts(*gpu, 4, 32, 64, DType::kBF16, rng);
  EXPECT_EQ(gpu->moe_experts(x, idx, weights, ex.gpu, 0, activation(Activation::kSilu)).shape(),
            (Shape{0, 64}));
}

TEST(CudaMoe, ExpertsReplayUnderGraphWithNewRouting) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(56);
  // Captured once, replayed with routings whose active experts and counts differ from the captured one:
  // the kernels must take them from the device.
  const int64_t rows = 12, hidden = 64, inter = 32, local = 8, k = 2;
  const Experts ex = dense_experts(*gpu, local, inter, hidden, DType::kBF16, rng);
  const ActivationParams act = activation(Activation::kSitu);
  Tensor x = round_bf16(random_f32({rows, hidden}, rng));
  Tensor idx_a = random_routing(rows, k, local, 0, local, 0.0, rng);
  Tensor idx_b = Tensor::empty({rows, k}, DType::kI32);  // everything on experts 5 and 6
  for (int64_t i = 0; i < rows * k; ++i) idx_b.data<int32_t>()[i] = static_cast<int32_t>(5 + i % 2);
  Tensor w_a = random_f32({rows, k}, rng, 0.1f, 1.5f), w_b = random_f32({rows, k}, rng, 0.1f, 1.5f);

  Tensor xg = gpu->upload(as_bf16(x)), idx_g = gpu->upload(idx_a), w_g = gpu->upload(w_a);
  gpu->reserve_workspace(int64_t{64} << 20);
  gpu->begin_step();
  Tensor out;
  std::unique_ptr<StepGraph> graph =
      gpu->capture([&] { out = gpu->moe_experts(xg, idx_g, w_g, ex.gpu, 0, act); });
  ASSERT_NE(graph, nullptr);
  for (const auto& [idx, w] : {std::pair{idx_b, w_b}, std::pair{idx_a, w_a}}) {
    gpu->upload_into(idx, idx_g);
    gpu->upload_into(w, w_g);
    graph->replay();
    EXPECT_LE(rel_l2(gpu->to_host_f32(out), cpu->moe_experts(x, idx, w, ex.cpu, 0, act)), kExpertsRelL2);
  }
  gpu->end_step();
}

}  // namespace
}  // namespace hlm::test
