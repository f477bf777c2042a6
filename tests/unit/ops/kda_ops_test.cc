// KDA ops of the CPU backend: short conv with its cache, the forget gate, the chunked prefill and the
// recurrent decode against a step-by-step recurrence in double (docs/MODEL.md §5.5), and the gated norm.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>

#include "ops/cpu/cpu_ops.h"
#include "ops_test_util.h"

namespace hlm {
namespace {

using test::all_close;
using test::random_tensor;

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- short conv -------------------------------------------------------------------------------------

// Reference: prepend the cached W-1 inputs, convolve, silu; the new cache is the stream's last W-1.
void short_conv_reference(const Tensor& x, const Tensor& w, const std::vector<SeqSpan>& seqs,
                          std::vector<double>& state, std::vector<double>& out) {
  const int64_t channels = x.dim(1), width = w.dim(1), hist = width - 1;
  out.assign(x.numel(), 0.0);
  for (const SeqSpan& s : seqs) {
    for (int64_t c = 0; c < channels; ++c) {
      std::vector<double> stream;
      for (int64_t i = 0; i < hist; ++i) stream.push_back(state[(s.slot * channels + c) * hist + i]);
      for (int64_t t = 0; t < s.token_count; ++t)
        stream.push_back(x.data<float>()[(s.token_begin + t) * channels + c]);
      for (int64_t t = 0; t < s.token_count; ++t) {
        double acc = 0;
        for (int64_t j = 0; j < width; ++j) acc += w.data<float>()[c * width + j] * stream[t + j];
        out[(s.token_begin + t) * channels + c] = acc * sigmoid_d(acc);
      }
      for (int64_t i = 0; i < hist; ++i)
        state[(s.slot * channels + c) * hist + i] = stream[stream.size() - hist + i];
    }
  }
}

TEST(KdaOps, ShortConvMatchesReference) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(7);
  const int64_t channels = 24, width = 4, slots = 6;
  const std::vector<SeqSpan> seqs = {{0, 5, 3}, {5, 1, 0}, {6, 2, 5}, {8, 0, 1}, {8, 9, 4}};
  Tensor x = random_tensor({17, channels}, rng, -2.0f, 2.0f), w = random_tensor({channels, width}, rng);
  Tensor state = random_tensor({slots, channels, width - 1}, rng);
  std::vector<double> ref_state = test::to_double(state), ref_out;
  short_conv_reference(x, w, seqs, ref_state, ref_out);
  Tensor untouched = state[2].clone();
  Tensor y = ops->short_conv(x, w, seqs, state);
  EXPECT_TRUE(all_close(y, ref_out, 1e-6));
  EXPECT_TRUE(all_close(state, ref_state, 0.0));
  EXPECT_TRUE(all_close(state[2], untouched, 0.0));
}

TEST(KdaOps, ShortConvPlanesAreTheOutputsColumnBlocks) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(9);
  const int64_t channels = 24, width = 4, slots = 6, rows = 17, planes = 3, per_plane = channels / planes;
  const std::vector<SeqSpan> seqs = {{0, 5, 3}, {5, 1, 0}, {6, 2, 5}, {8, 0, 1}, {8, 9, 4}};
  Tensor x = random_tensor({rows, channels}, rng, -2.0f, 2.0f), w = random_tensor({channels, width}, rng);
  Tensor state = random_tensor({slots, channels, width - 1}, rng);
  std::vector<double> ref_state = test::to_double(state), ref_out;
  short_conv_reference(x, w, seqs, ref_state, ref_out);
  Tensor y = ops->short_conv_planes(x, w, seqs, state, planes);  // [3, T, 8]
  ASSERT_EQ(y.shape(), (Shape{planes, rows, per_plane}));
  std::vector<double> expected;  // ref_out [T, C] as planes
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t j = 0; j < per_plane; ++j) expected.push_back(ref_out[t * channels + p * per_plane + j]);
    }
  }
  EXPECT_TRUE(all_close(y, expected, 1e-6));
  EXPECT_TRUE(all_close(state, ref_state, 0.0));
  EXPECT_THROW(ops->short_conv_planes(x, w, seqs, state, 5), Error);  // 24 channels in 5 planes
}

TEST(KdaOps, ShortConvSplitAcrossCallsEqualsOneCall) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(8);
  const int64_t channels = 10, width = 4, total = 9;
  Tensor x = random_tensor({total, channels}, rng), w = random_tensor({channels, width}, rng);
  Tensor init = random_tensor({2, channels, width - 1}, rng);
  Tensor one_state = init.clone();
  Tensor one = ops->short_conv(x, w, {{0, total, 1}}, one_state);
  // Splits with pieces shorter than W-1 exercise the cache shift.
  for (const std::vector<int64_t>& pieces : std::vector<std::vector<int64_t>>{
           {1, 1, 1, 6}, {2, 7}, {3, 6}, {1, 2, 1, 5}, {5, 1, 1, 1, 1}, {8, 1}}) {
    Tensor state = init.clone();
    Tensor out = Tensor::zeros({total, channels}, DType::kF32);
    int64_t begin = 0;
    for (int64_t n : pieces) {
      Tensor part = ops->short_conv(x.slice(begin, begin + n), w, {{0, n, 1}}, state);
      std::copy_n(part.data<float>(), part.numel(), out.data<float>() + begin * channels);
      begin += n;
    }
    EXPECT_TRUE(all_close(out, one, 0.0));
    EXPECT_TRUE(all_close(state, one_state, 0.0));
  }
}

TEST(KdaOps, ShortConvRejectsBadShapes) {
  auto ops = make_cpu_ops();
  Tensor x = Tensor::zeros({4, 8}, DType::kF32), w = Tensor::zeros({8, 4}, DType::kF32);
  Tensor state = Tensor::zeros({2, 8, 3}, DType::kF32);
  Tensor bad_state = Tensor::zeros({2, 8, 4}, DType::kF32);
  EXPECT_THROW(ops->short_conv(x, w, {{0, 4, 0}}, bad_state), Error);
  EXPECT_THROW(ops->short_conv(x, Tensor::zeros({7, 4}, DType::kF32), {{0, 4, 0}}, state), Error);
  EXPECT_THROW(ops->short_conv(x, w, {{0, 5, 0}}, state), Error);             // past the batch
  EXPECT_THROW(ops->short_conv(x, w, {{0, 4, 2}}, state), Error);             // no such slot
  EXPECT_THROW(ops->short_conv(x, w, {{0, 2, 0}, {2, 2, 0}}, state), Error);  // slot used twice
  EXPECT_THROW(ops->short_conv(x, w, {{0, 3, 0}, {2, 2, 1}}, state), Error);  // overlapping rows
}

// ---- gate -------------------------------------------------------------------------------------------

TEST(KdaOps, GateSoftplusAndBounded) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(9);
  const int64_t heads = 3, kd = 8, rows = 6;
  Tensor graw = random_tensor({rows, heads * kd}, rng, -30.0f, 30.0f);  // both softplus branches
  Tensor a_log = random_tensor({heads}, rng, -1.0f, 2.0f), dt = random_tensor({heads * kd}, rng);
  for (float lower : {0.0f, -5.0f}) {
    Tensor g = ops->kda_gate(graw, a_log, dt, lower);
    std::vector<double> ref;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < heads * kd; ++c) {
        const double z = double(graw.data<float>()[r * heads * kd + c]) + dt.data<float>()[c];
        const double a = std::exp(double(a_log.data<float>()[c / kd]));
        ref.push_back(lower == 0.0f ? -a * (z > 20 ? z : std::log1p(std::exp(z))) : lower * sigmoid_d(a * z));
      }
    }
    EXPECT_TRUE(all_close(g, ref, 1e-6)) << "lower_bound " << lower;
    for (int64_t i = 0; i < g.numel(); ++i) EXPECT_LE(g.data<float>()[i], 0.0f);
  }
  EXPECT_THROW(ops->kda_gate(graw, random_tensor({5}, rng), dt, 0.0f), Error);  // 24 % 5 != 0
  EXPECT_THROW(ops->kda_gate(graw, a_log, random_tensor({heads}, rng), 0.0f), Error);
  EXPECT_THROW(ops->kda_gate(graw, a_log.reshape({1, heads}), dt, 0.0f), Error);
  EXPECT_THROW(ops->kda_gate(graw, a_log, dt, 1.0f), Error);
}

// ---- core -------------------------------------------------------------------------------------------

struct KdaInputs {
  Tensor q, k, v, g, beta;
};

// g uniform in [g_lo, g_hi] (log decays per token and key channel).
KdaInputs make_inputs(int64_t rows, int64_t heads, int64_t kd, int64_t vd, float g_lo, float g_hi,
                      std::mt19937& rng) {
  return {random_tensor({rows, heads, kd}, rng), random_tensor({rows, heads, kd}, rng),
          random_tensor({rows, heads, vd}, rng), random_tensor({rows, heads, kd}, rng, g_lo, g_hi),
          random_tensor({rows, heads}, rng, 0.0f, 1.0f)};
}

// The recurrence of docs/MODEL.md §5.5 in double, token by token.
void kda_reference(const KdaInputs& in, const std::vector<SeqSpan>& seqs, std::vector<double>& state,
                   std::vector<double>& out) {
  const int64_t heads = in.q.dim(1), kd = in.q.dim(2), vd = in.v.dim(2);
  out.assign(in.q.dim(0) * heads * vd, 0.0);
  auto l2 = [kd](const float* x, double scale) {
    double ss = 0;
    for (int64_t d = 0; d < kd; ++d) ss += double(x[d]) * x[d];
    std::vector<double> r(kd);
    for (int64_t d = 0; d < kd; ++d) r[d] = x[d] / std::sqrt(ss + 1e-6) * scale;
    return r;
  };
  for (const SeqSpan& s : seqs) {
    for (int64_t h = 0; h < heads; ++h) {
      double* st = state.data() + (s.slot * heads + h) * kd * vd;
      for (int64_t t = s.token_begin; t < s.token_begin + s.token_count; ++t) {
        const int64_t base = t * heads + h;
        const std::vector<double> q = l2(in.q.data<float>() + base * kd, 1.0 / std::sqrt(double(kd)));
        const std::vector<double> k = l2(in.k.data<float>() + base * kd, 1.0);
        const float* g = in.g.data<float>() + base * kd;
        const float* v = in.v.data<float>() + base * vd;
        const double b = in.beta.data<float>()[base];
        for (int64_t d = 0; d < kd; ++d) {
          for (int64_t j = 0; j < vd; ++j) st[d * vd + j] *= std::exp(double(g[d]));
        }
        std::vector<double> u(vd);
        for (int64_t j = 0; j < vd; ++j) {
          double kv = 0;
          for (int64_t d = 0; d < kd; ++d) kv += st[d * vd + j] * k[d];
          u[j] = b * (v[j] - kv);
        }
        for (int64_t d = 0; d < kd; ++d) {
          for (int64_t j = 0; j < vd; ++j) st[d * vd + j] += k[d] * u[j];
        }
        for (int64_t j = 0; j < vd; ++j) {
          double o = 0;
          for (int64_t d = 0; d < kd; ++d) o += st[d * vd + j] * q[d];
          out[base * vd + j] = o;
        }
      }
    }
  }
}

// kda_decode applied one token at a time.
Tensor decode_token_by_token(Ops& ops, const KdaInputs& in, int64_t rows, int32_t slot, Tensor& state) {
  Tensor out = Tensor::zeros({rows, in.q.dim(1), in.v.dim(2)}, DType::kF32);
  for (int64_t t = 0; t < rows; ++t) {
    Tensor o = ops.kda_decode(in.q.slice(t, t + 1), in.k.slice(t, t + 1), in.v.slice(t, t + 1),
                              in.g.slice(t, t + 1), in.beta.slice(t, t + 1), {{0, 1, slot}}, state);
    std::copy_n(o.data<float>(), o.numel(), out.data<float>() + t * o.numel());
  }
  return out;
}

class KdaLength : public ::testing::TestWithParam<int64_t> {};

TEST_P(KdaLength, PrefillMatchesRecurrenceAndDecode) {
  auto ops = make_cpu_ops();
  const int64_t rows = GetParam(), heads = 2, kd = 32, vd = 24;
  std::mt19937 rng(100 + static_cast<unsigned>(rows));
  const KdaInputs in = make_inputs(rows, heads, kd, vd, -0.4f, 0.0f, rng);
  Tensor init = random_tensor({3, heads, kd, vd}, rng);  // non-zero initial state
  std::vector<double> ref_state = test::to_double(init), ref_out;
  kda_reference(in, {{0, rows, 1}}, ref_state, ref_out);

  Tensor state = init.clone();
  Tensor out = ops->kda_prefill(in.q, in.k, in.v, in.g, in.beta, {{0, rows, 1}}, state);
  EXPECT_TRUE(all_close(out, ref_out, 1e-5));
  EXPECT_TRUE(all_close(state, ref_state, 1e-5));
  EXPECT_TRUE(all_close(state[0], init[0], 0.0));  // other slots untouched
  EXPECT_TRUE(all_close(state[2], init[2], 0.0));

  Tensor dec_state = init.clone();
  Tensor dec = decode_token_by_token(*ops, in, rows, 1, dec_state);
  EXPECT_TRUE(all_close(dec, ref_out, 1e-5));
  EXPECT_TRUE(all_close(dec_state, ref_state, 1e-5));
  EXPECT_TRUE(all_close(out, dec, 1e-5));
  EXPECT_TRUE(all_close(state, dec_state, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Lengths, KdaLength, ::testing::Values(1, 5, 63, 64, 65, 130, 200));

TEST(KdaOps, PrefillFullHeadSize) {
  auto ops = make_cpu_ops();
  const int64_t rows = 150, heads = 2, kd = 128, vd = 128;
  std::mt19937 rng(11);
  const KdaInputs in = make_inputs(rows, heads, kd, vd, -0.2f, 0.0f, rng);
  Tensor state = random_tensor({1, heads, kd, vd}, rng, -0.1f, 0.1f);
  std::vector<double> ref_state = test::to_double(state), ref_out;
  kda_reference(in, {{0, rows, 0}}, ref_state, ref_out);
  Tensor out = ops->kda_prefill(in.q, in.k, in.v, in.g, in.beta, {{0, rows, 0}}, state);
  EXPECT_TRUE(all_close(out, ref_out, 1e-5));
  EXPECT_TRUE(all_close(state, ref_state, 1e-5));
}

TEST(KdaOps, PrefillStronglyNegativeGates) {
  auto ops = make_cpu_ops();
  const int64_t rows = 130, heads = 2, kd = 32, vd = 16;
  std::mt19937 rng(12);
  KdaInputs in = make_inputs(rows, heads, kd, vd, -30.0f, -5.0f, rng);
  Tensor init = random_tensor({1, heads, kd, vd}, rng);
  for (int variant = 0; variant < 2; ++variant) {
    if (variant == 1) {  // through kda_gate: A_log large, so g ≈ -exp(3.5)·softplus(·) ≈ -10 .. -130
      Tensor graw = random_tensor({rows, heads * kd}, rng, -1.0f, 3.0f);
      in.g = ops->kda_gate(graw, Tensor::from_vector({heads}, {3.0f, 3.5f}), random_tensor({heads * kd}, rng),
                           0.0f)
                 .reshape({rows, heads, kd});
    }
    std::vector<double> ref_state = test::to_double(init), ref_out;
    kda_reference(in, {{0, rows, 0}}, ref_state, ref_out);
    Tensor state = init.clone();
    Tensor out = ops->kda_prefill(in.q, in.k, in.v, in.g, in.beta, {{0, rows, 0}}, state);
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out.data<float>()[i])) << i;
    EXPECT_TRUE(all_close(out, ref_out, 1e-5)) << "variant " << variant;
    EXPECT_TRUE(all_close(state, ref_state, 1e-5)) << "variant " << variant;
    Tensor dec_state = init.clone();
    EXPECT_TRUE(all_close(decode_token_by_token(*ops, in, rows, 0, dec_state), ref_out, 1e-5));
  }
}

TEST(KdaOps, PrefillRaggedBatchWithDistinctSlots) {
  auto ops = make_cpu_ops();
  const int64_t heads = 3, kd = 16, vd = 16, slots = 7;
  // Sequences listed out of slot order; slot 6 has no new tokens; slots 2 and 4 are not involved.
  const std::vector<SeqSpan> seqs = {{0, 70, 3}, {70, 1, 0}, {71, 130, 5}, {201, 0, 6}, {201, 5, 1}};
  std::mt19937 rng(13);
  const KdaInputs in = make_inputs(206, heads, kd, vd, -0.5f, 0.0f, rng);
  Tensor init = random_tensor({slots, heads, kd, vd}, rng);
  std::vector<double> ref_state = test::to_double(init), ref_out;
  kda_reference(in, seqs, ref_state, ref_out);
  Tensor state = init.clone();
  Tensor out = ops->kda_prefill(in.q, in.k, in.v, in.g, in.beta, seqs, state);
  EXPECT_TRUE(all_close(out, ref_out, 1e-5));
  EXPECT_TRUE(all_close(state, ref_state, 1e-5));
  EXPECT_TRUE(all_close(state[2], init[2], 0.0));
  EXPECT_TRUE(all_close(state[4], init[4], 0.0));
  EXPECT_TRUE(all_close(state[6], init[6], 0.0));
}

TEST(KdaOps, ResultsDoNotDependOnThreadCount) {
  auto ops = make_cpu_ops();
  const int64_t heads = 3, kd = 32, vd = 16;
  const std::vector<SeqSpan> seqs = {{0, 100, 1}, {100, 7, 0}, {107, 66, 2}};
  std::mt19937 rng(18);
  const KdaInputs in = make_inputs(173, heads, kd, vd, -1.0f, 0.0f, rng);
  Tensor init = random_tensor({3, heads, kd, vd}, rng);
  Tensor conv_w = random_tensor({heads * kd, 4}, rng), conv_init = random_tensor({3, heads * kd, 3}, rng);
  const int saved = omp_get_max_threads();
  std::vector<Tensor> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Tensor state = init.clone(), conv_state = conv_init.clone();
    results.push_back(ops->kda_prefill(in.q, in.k, in.v, in.g, in.beta, seqs, state));
    results.push_back(state);
    results.push_back(ops->short_conv(in.q.reshape({173, heads * kd}), conv_w, seqs, conv_state));
    results.push_back(conv_state);
  }
  omp_set_num_threads(saved);
  for (size_t i = 4; i < results.size(); ++i) EXPECT_TRUE(all_close(results[i], results[i % 4], 0.0)) << i;
}

TEST(KdaOps, PrefillSplitIntoTwoCallsEqualsOneCall) {
  auto ops = make_cpu_ops();
  const int64_t heads = 2, kd = 32, vd = 32, first = 70, second = 61;
  std::mt19937 rng(14);
  const KdaInputs in = make_inputs(first + second, heads, kd, vd, -0.5f, 0.0f, rng);
  Tensor init = random_tensor({2, heads, kd, vd}, rng);
  Tensor one_state = init.clone();
  Tensor one = ops->kda_prefill(in.q, in.k, in.v, in.g, in.beta, {{0, first + second, 1}}, one_state);

  Tensor state = init.clone();
  auto part = [&](int64_t b, int64_t e) {
    return ops->kda_prefill(in.q.slice(b, e), in.k.slice(b, e), in.v.slice(b, e), in.g.slice(b, e),
                            in.beta.slice(b, e), {{0, e - b, 1}}, state);
  };
  Tensor a = part(0, first), b = part(first, first + second);
  EXPECT_TRUE(all_close(a, one.slice(0, first).clone(), 1e-5));
  EXPECT_TRUE(all_close(b, one.slice(first, first + second).clone(), 1e-5));
  EXPECT_TRUE(all_close(state, one_state, 1e-5));
}

TEST(KdaOps, DecodeRaggedBatch) {
  auto ops = make_cpu_ops();
  const int64_t heads = 4, kd = 16, vd = 8;
  const std::vector<SeqSpan> seqs = {{0, 1, 2}, {1, 1, 0}, {2, 1, 3}};
  std::mt19937 rng(15);
  const KdaInputs in = make_inputs(3, heads, kd, vd, -3.0f, 0.0f, rng);
  Tensor init = random_tensor({5, heads, kd, vd}, rng);
  std::vector<double> ref_state = test::to_double(init), ref_out;
  kda_reference(in, seqs, ref_state, ref_out);
  Tensor state = init.clone();
  Tensor out = ops->kda_decode(in.q, in.k, in.v, in.g, in.beta, seqs, state);
  EXPECT_TRUE(all_close(out, ref_out, 1e-5));
  EXPECT_TRUE(all_close(state, ref_state, 1e-5));
  EXPECT_TRUE(all_close(state[1], init[1], 0.0));
  EXPECT_TRUE(all_close(state[4], init[4], 0.0));
}

TEST(KdaOps, CoreRejectsBadShapes) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(16);
  const KdaInputs in = make_inputs(4, 2, 8, 8, -1.0f, 0.0f, rng);
  Tensor state = Tensor::zeros({2, 2, 8, 8}, DType::kF32);
  Tensor g_bad = random_tensor({4, 2, 7}, rng);
  try {
    ops->kda_prefill(in.q, in.k, in.v, g_bad, in.beta, {{0, 4, 0}}, state);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kda_prefill: q [T, H, K] and g must have the same shape"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ops->kda_prefill(in.q, in.k, in.v, in.g, random_tensor({4, 3}, rng), {{0, 4, 0}}, state),
               Error);
  EXPECT_THROW(ops->kda_prefill(in.q, in.k, random_tensor({4, 2, 9}, rng), in.g, in.beta, {{0, 4, 0}}, state),
               Error);  // V does not match the state
  Tensor small_state = Tensor::zeros({2, 2, 4, 8}, DType::kF32);
  EXPECT_THROW(ops->kda_prefill(in.q, in.k, in.v, in.g, in.beta, {{0, 4, 0}}, small_state), Error);
  EXPECT_THROW(ops->kda_decode(in.q, in.k, in.v, in.g, in.beta, {{0, 2, 0}}, state), Error);  // 2 tokens
  EXPECT_THROW(ops->kda_decode(in.q, in.k, in.v, in.g, in.beta, {{0, 1, 0}, {1, 1, 0}}, state), Error);
}

TEST(KdaOps, GatedRmsNorm) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(17);
  const int64_t rows = 3, heads = 4, vd = 32;
  const float eps = 1e-5f;
  Tensor o = random_tensor({rows, heads, vd}, rng, -2.0f, 2.0f),
         gate = random_tensor({rows, heads, vd}, rng, -8.0f, 8.0f);
  Tensor w = random_tensor({vd}, rng);
  Tensor y = ops->gated_rms_norm(o, gate, w, eps);
  std::vector<double> ref;
  for (int64_t r = 0; r < rows * heads; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < vd; ++i) ss += std::pow(double(o.data<float>()[r * vd + i]), 2);
    const double inv = 1.0 / std::sqrt(ss / vd + eps);
    for (int64_t i = 0; i < vd; ++i) {
      ref.push_back(w.data<float>()[i] * o.data<float>()[r * vd + i] * inv *
                    sigmoid_d(gate.data<float>()[r * vd + i]));
    }
  }
  EXPECT_TRUE(all_close(y, ref, 1e-6));
  EXPECT_THROW(ops->gated_rms_norm(o, random_tensor({rows, heads, vd + 1}, rng), w, eps), Error);
  EXPECT_THROW(ops->gated_rms_norm(o, gate, random_tensor({vd + 1}, rng), eps), Error);
}

}  // namespace
}  // namespace hlm
