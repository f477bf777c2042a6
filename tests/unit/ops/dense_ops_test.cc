// Memory and dense ops of the CPU backend against reference loops in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <cmath>

#include "base/half.h"
#include "ops/cpu/cpu_ops.h"
#include "ops_test_util.h"

namespace hlm {
namespace {

using test::all_close;
using test::random_tensor;

class DenseOps : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_cpu_ops();
  std::mt19937 rng{1234};
};

TEST_F(DenseOps, UploadCopiesAndConvertsToF32) {
  Tensor host = random_tensor({3, 5}, rng);
  Tensor dev = ops->upload(host);
  EXPECT_EQ(dev.dtype(), DType::kF32);
  EXPECT_EQ(dev.shape(), host.shape());
  EXPECT_NE(dev.raw(), host.raw());  // weights must not alias checkpoint memory
  const float before = host.data<float>()[0];
  host.data<float>()[0] = 42.0f;
  EXPECT_EQ(dev.data<float>()[0], before);

  Tensor bf = Tensor::empty({4}, DType::kBF16);
  Tensor half = Tensor::empty({4}, DType::kF16);
  const float values[4] = {1.5f, -2.25f, 0.0f, 1024.0f};
  for (int i = 0; i < 4; ++i) bf.data<uint16_t>()[i] = f32_to_bf16(values[i]);
  const uint16_t f16_bits[4] = {0x3e00, 0xc080, 0x0000, 0x6400};  // the same values in IEEE half
  for (int i = 0; i < 4; ++i) half.data<uint16_t>()[i] = f16_bits[i];
  Tensor from_bf = ops->upload(bf), from_half = ops->upload(half);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(from_bf.data<float>()[i], values[i]);
    EXPECT_EQ(from_half.data<float>()[i], values[i]);
  }

  Tensor ids = Tensor::from_vector_i32({3}, {7, 0, 2});
  Tensor ids_dev = ops->upload(ids);
  EXPECT_EQ(ids_dev.dtype(), DType::kI32);
  EXPECT_EQ(ids_dev.data<int32_t>()[0], 7);
  Tensor codes = ops->upload(Tensor::zeros({2}, DType::kU8));  // packed MXFP4 codes stay bytes
  EXPECT_EQ(codes.dtype(), DType::kU8);
}

TEST_F(DenseOps, ToHostAndCopyAreDeepCopies) {
  Tensor a = random_tensor({2, 3}, rng);
  Tensor h = ops->to_host_f32(a);
  EXPECT_NE(h.raw(), a.raw());
  EXPECT_TRUE(all_close(h, a, 0.0));
  Tensor b = ops->zeros({2, 3}, DType::kF32);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(b.data<float>()[i], 0.0f);
  ops->copy(a, b);
  EXPECT_TRUE(all_close(b, a, 0.0));
  Tensor wrong = ops->empty({3, 2}, DType::kF32);
  EXPECT_THROW(ops->copy(a, wrong), Error);
  EXPECT_THROW(ops->to_host_f32(Tensor::zeros({2}, DType::kI32)), Error);
}

TEST_F(DenseOps, Embedding) {
  Tensor table = random_tensor({10, 6}, rng);
  Tensor ids = Tensor::from_vector_i32({4}, {3, 9, 0, 3});
  Tensor y = ops->embedding(table, ids);
  ASSERT_EQ(y.shape(), (Shape{4, 6}));
  for (int t = 0; t < 4; ++t) {
    for (int d = 0; d < 6; ++d)
      EXPECT_EQ(y.data<float>()[t * 6 + d], table.data<float>()[ids.data<int32_t>()[t] * 6 + d]);
  }
  EXPECT_THROW(ops->embedding(table, Tensor::from_vector_i32({1}, {10})), Error);
  EXPECT_THROW(ops->embedding(table, Tensor::from_vector_i32({1}, {-1})), Error);
  EXPECT_THROW(ops->embedding(table, Tensor::from_vector({1}, {1.0f})), Error);
}

TEST_F(DenseOps, LinearMatchesReference) {
  const int64_t t_len = 37, in = 300, out = 129;
  Tensor x = random_tensor({t_len, in}, rng), w = random_tensor({out, in}, rng);
  Tensor y = ops->linear(x, w);
  ASSERT_EQ(y.shape(), (Shape{t_len, out}));
  std::vector<double> ref(t_len * out);
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i)
        acc += double(x.data<float>()[t * in + i]) * w.data<float>()[o * in + i];
      ref[t * out + o] = acc;
    }
  }
  EXPECT_TRUE(all_close(y, ref, 1e-5));
  EXPECT_EQ(ops->linear(Tensor::zeros({0, in}, DType::kF32), w).shape(), (Shape{0, out}));
  EXPECT_THROW(ops->linear(x, random_tensor({out, in + 1}, rng)), Error);
  EXPECT_THROW(ops->linear(x.reshape({1, t_len, in}), w), Error);
}

TEST_F(DenseOps, RmsNormMatchesReference) {
  Tensor x = random_tensor({3, 4, 64}, rng, -3.0f, 3.0f), w = random_tensor({64}, rng);
  const float eps = 1e-5f;
  Tensor y = ops->rms_norm(x, w, eps);
  std::vector<double> ref(x.numel());
  for (int64_t r = 0; r < 12; ++r) {
    double ss = 0;
    for (int i = 0; i < 64; ++i) ss += std::pow(double(x.data<float>()[r * 64 + i]), 2);
    const double inv = 1.0 / std::sqrt(ss / 64 + eps);
    for (int i = 0; i < 64; ++i) ref[r * 64 + i] = w.data<float>()[i] * x.data<float>()[r * 64 + i] * inv;
  }
  EXPECT_TRUE(all_close(y, ref, 1e-6));
  EXPECT_THROW(ops->rms_norm(x, random_tensor({63}, rng), eps), Error);
}

TEST_F(DenseOps, AddInplaceAndSigmoid) {
  Tensor y = random_tensor({5, 7}, rng), x = random_tensor({5, 7}, rng);
  std::vector<double> ref(35);
  for (int i = 0; i < 35; ++i) ref[i] = double(y.data<float>()[i]) + x.data<float>()[i];
  ops->add_inplace(y, x);
  EXPECT_TRUE(all_close(y, ref, 1e-7));
  Tensor bad = random_tensor({7, 5}, rng);
  EXPECT_THROW(ops->add_inplace(y, bad), Error);

  Tensor z = Tensor::from_vector({6}, {-200.0f, -20.0f, -0.5f, 0.0f, 3.0f, 200.0f});
  Tensor s = ops->sigmoid(z);
  std::vector<double> sref;
  for (int i = 0; i < 6; ++i) sref.push_back(1.0 / (1.0 + std::exp(-double(z.data<float>()[i]))));
  EXPECT_TRUE(all_close(s, sref, 1e-6));
}

TEST_F(DenseOps, GluSiluAndSitu) {
  Tensor g = random_tensor({9, 33}, rng, -30.0f, 30.0f), u = random_tensor({9, 33}, rng, -60.0f, 60.0f);
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  std::vector<double> silu_ref, situ_ref;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double gv = g.data<float>()[i], uv = u.data<float>()[i];
    silu_ref.push_back(gv * sig(gv) * uv);
    situ_ref.push_back(4.0 * std::tanh(gv / 4.0) * sig(gv) * 25.0 * std::tanh(uv / 25.0));
  }
  EXPECT_TRUE(all_close(ops->glu(g, u, ActivationParams{}), silu_ref, 1e-6));
  ActivationParams situ;
  situ.kind = Activation::kSitu;
  EXPECT_TRUE(all_close(ops->glu(g, u, situ), situ_ref, 1e-6));
  EXPECT_THROW(ops->glu(g, random_tensor({9, 32}, rng), situ), Error);
}

TEST_F(DenseOps, HeadMatmulMatchesReference) {
  const int64_t t_len = 5, heads = 3, a = 17, b = 11;
  Tensor x = random_tensor({t_len, heads, a}, rng), w = random_tensor({heads, a, b}, rng);
  Tensor y = ops->head_matmul(x, w);
  ASSERT_EQ(y.shape(), (Shape{t_len, heads, b}));
  std::vector<double> ref(t_len * heads * b);
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < b; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < a; ++i)
          acc += double(x.data<float>()[(t * heads + h) * a + i]) * w.data<float>()[(h * a + i) * b + j];
        ref[(t * heads + h) * b + j] = acc;
      }
    }
  }
  EXPECT_TRUE(all_close(y, ref, 1e-6));
  EXPECT_THROW(ops->head_matmul(x, random_tensor({heads + 1, a, b}, rng)), Error);
  EXPECT_THROW(ops->head_matmul(x, random_tensor({heads, a + 1, b}, rng)), Error);
}

TEST_F(DenseOps, SliceConcatGather) {
  Tensor x = random_tensor({2, 3, 8}, rng);
  Tensor s = ops->slice_last(x, 2, 7);
  ASSERT_EQ(s.shape(), (Shape{2, 3, 5}));
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 5; ++c) EXPECT_EQ(s.data<float>()[r * 5 + c], x.data<float>()[r * 8 + 2 + c]);
  }
  EXPECT_EQ(ops->slice_last(x, 3, 3).shape(), (Shape{2, 3, 0}));
  EXPECT_THROW(ops->slice_last(x, 5, 9), Error);
  EXPECT_THROW(ops->slice_last(x, 4, 3), Error);

  Tensor b = random_tensor({2, 3, 4}, rng);
  Tensor c = ops->concat_last(x, b);
  ASSERT_EQ(c.shape(), (Shape{2, 3, 12}));
  for (int r = 0; r < 6; ++r) {
    for (int j = 0; j < 12; ++j) {
      const float want = j < 8 ? x.data<float>()[r * 8 + j] : b.data<float>()[r * 4 + j - 8];
      EXPECT_EQ(c.data<float>()[r * 12 + j], want);
    }
  }
  EXPECT_THROW(ops->concat_last(x, random_tensor({3, 2, 4}, rng)), Error);

  Tensor rows = Tensor::from_vector_i32({3}, {1, 0, 1});
  Tensor g = ops->gather_rows(x, rows);
  ASSERT_EQ(g.shape(), (Shape{3, 3, 8}));
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 24; ++j)
      EXPECT_EQ(g.data<float>()[i * 24 + j], x.data<float>()[rows.data<int32_t>()[i] * 24 + j]);
  }
  EXPECT_THROW(ops->gather_rows(x, Tensor::from_vector_i32({1}, {2})), Error);
}

TEST_F(DenseOps, Transpose01SwapsLeadingDimensions) {
  Tensor x = random_tensor({3, 4, 5}, rng);
  Tensor y = ops->transpose01(x);
  ASSERT_EQ(y.shape(), (Shape{4, 3, 5}));
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) {
      for (int k = 0; k < 5; ++k)
        EXPECT_EQ(y.data<float>()[(j * 3 + i) * 5 + k], x.data<float>()[(i * 4 + j) * 5 + k]);
    }
  }
  EXPECT_THROW(ops->transpose01(random_tensor({6}, rng)), Error);
}

TEST_F(DenseOps, FillZeroClearsOnlyTheView) {
  Tensor x = random_tensor({3, 4}, rng);
  Tensor row = x[1];
  ops->fill_zero(row);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(x.data<float>()[4 + j], 0.0f);
    EXPECT_NE(x.data<float>()[j], 0.0f);
    EXPECT_NE(x.data<float>()[8 + j], 0.0f);
  }
}

TEST_F(DenseOps, SigmoidGateInplace) {
  Tensor y = random_tensor({3, 5}, rng);
  Tensor g = random_tensor({3, 5}, rng, -4.0f, 4.0f);
  std::vector<double> ref = test::to_double(y);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] /= 1.0 + std::exp(-static_cast<double>(g.data<float>()[i]));
  ops->sigmoid_gate_inplace(y, g);
  EXPECT_TRUE(all_close(y, ref, 1e-6));
  Tensor bad = random_tensor({5, 3}, rng);
  EXPECT_THROW(ops->sigmoid_gate_inplace(y, bad), Error);
}

TEST_F(DenseOps, AttnResMixesRawCandidatesBySoftmaxOfNormedScores) {
  const int64_t t = 4, d = 6;
  std::vector<Tensor> cands = {random_tensor({t, d}, rng, -3, 3), random_tensor({t, d}, rng),
                               random_tensor({t, d}, rng)};
  Tensor proj = random_tensor({d}, rng), norm = random_tensor({d}, rng, 0.5f, 1.5f);
  const float eps = 1e-5f;
  std::vector<double> ref(t * d);
  for (int64_t r = 0; r < t; ++r) {
    std::vector<double> score;
    for (const Tensor& c : cands) {
      const float* v = c.data<float>() + r * d;
      double ms = 0, dot = 0;
      for (int64_t k = 0; k < d; ++k) ms += static_cast<double>(v[k]) * v[k] / d;
      for (int64_t k = 0; k < d; ++k)
        dot += v[k] / std::sqrt(ms + eps) * norm.data<float>()[k] * proj.data<float>()[k];
      score.push_back(dot);
    }
    double mx = *std::max_element(score.begin(), score.end()), z = 0;
    for (double& s : score) z += (s = std::exp(s - mx));
    for (int64_t k = 0; k < d; ++k) {
      for (size_t c = 0; c < cands.size(); ++c)
        ref[r * d + k] += score[c] / z * cands[c].data<float>()[r * d + k];
    }
  }
  EXPECT_TRUE(all_close(ops->attn_res(cands, proj, norm, eps), ref, 1e-6));
  // A single candidate is returned as it is, whatever the weights.
  Tensor one = ops->attn_res({cands[0]}, proj, norm, eps);
  EXPECT_TRUE(all_close(one, test::to_double(cands[0]), 1e-6));
  EXPECT_THROW(ops->attn_res({}, proj, norm, eps), Error);
  EXPECT_THROW(ops->attn_res({cands[0], random_tensor({t, d + 1}, rng)}, proj, norm, eps), Error);
}

}  // namespace
}  // namespace hlm
