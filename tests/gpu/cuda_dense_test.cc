// The CUDA backend's memory, dense and element-wise ops against the CPU reference. Inputs are drawn in
// F32 and rounded to bf16 where the GPU takes bf16 activations, so both backends see the same values;
// tolerances (relative L2) follow from the output dtype: a BF16 output carries a rounding error of at most
// 2^-9 per element (≈ 2e-3 relative; a few roundings in a row stay under 5e-3), an F32 output only the
// accumulation-order differences of fp32 (≈ 1e-6, 1e-4 for 2k-long dot products).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>

#include "gpu_test_util.h"

namespace hlm::test {
namespace {

constexpr double kBf16Out = 5e-3;
constexpr double kF32Out = 1e-5;
constexpr double kF32Dot = 1e-4;

class CudaDense : public ::testing::Test {
 protected:
  std::mt19937 rng_{7};
  std::unique_ptr<Ops> cpu_ = make_cpu_ops();
};

// Host F32 tensor -> a BF16 device tensor holding its bf16-rounded values.
Tensor to_gpu_bf16(Ops& gpu, const Tensor& x) { return gpu.upload(as_bf16(x)); }

TEST_F(CudaDense, UploadRoundTripsAndConvertsIntoSlices) {
  HLM_GPU_OR_SKIP(gpu);
  Tensor x = random_f32({5, 7}, rng_);
  Tensor on = gpu->upload(x);
  EXPECT_EQ(on.dtype(), DType::kF32);
  EXPECT_EQ(rel_l2(gpu->to_host_f32(on), x), 0.0);
  Tensor fused = gpu->zeros({10, 7}, DType::kBF16);
  Tensor lower = fused.slice(5, 10);
  gpu->upload_into(x, lower);  // F32 host into a BF16 slice
  Tensor back = gpu->to_host_f32(fused);
  EXPECT_EQ(rel_l2(back.slice(5, 10), round_bf16(x)), 0.0);
  for (int64_t i = 0; i < 35; ++i) EXPECT_EQ(back.data<float>()[i], 0.0f);
}

TEST_F(CudaDense, EmbeddingGathersRowsAsF32) {
  HLM_GPU_OR_SKIP(gpu);
  Tensor table = random_f32({50, 24}, rng_);
  Tensor ids = Tensor::from_vector_i32({6}, {3, 0, 49, 3, 17, 8});
  Tensor want = cpu_->embedding(round_bf16(table), ids);
  Tensor got = gpu->to_host_f32(gpu->embedding(to_gpu_bf16(*gpu, table), gpu->upload(ids)));
  EXPECT_EQ(rel_l2(got, want), 0.0);
}

TEST_F(CudaDense, LinearMatchesInBf16AndF32) {
  HLM_GPU_OR_SKIP(gpu);
  // Up to 16 tokens with BF16 weights take the weight-streaming kernel (skinny_gemm.cu): row counts off
  // the 16-row tile, K off the 64-column chunk and long K (more chunks than its warps keep in flight).
  // Its streaming configuration follows the tiles per SM (pick_streaming: at most 1, 2 or 4, more): on a
  // GPU of 105 to 143 SMs (an H200 has 132), 3,200 rows (200 tiles) and the 48B's o_proj and dense down
  // (2,304 rows, 144 tiles) take the second, 6,720 (420) the third, the 48B's KDA projection (12,576 rows,
  // 786 tiles) the fourth, the smaller shapes the first (13,056 columns: 204 chunks, 13 per warp). One
  // token takes it up to 16,384 rows, two or more up to 8,192 (cuBLASLt past them: 2 x 9,000).
  for (auto [t, in, out] :
       {std::tuple{1, 64, 96}, std::tuple{37, 2304, 520}, std::tuple{150, 128, 16}, std::tuple{5, 2312, 1027},
        std::tuple{16, 200, 72}, std::tuple{9, 4096, 40}, std::tuple{3, 8, 3}, std::tuple{1, 2304, 3200},
        std::tuple{9, 1000, 3200}, std::tuple{3, 2304, 6720}, std::tuple{16, 520, 6720},
        std::tuple{1, 4096, 2304}, std::tuple{9, 4096, 2310}, std::tuple{2, 9216, 2304},
        std::tuple{1, 13056, 256}, std::tuple{1, 2304, 12576}, std::tuple{2, 520, 9000}}) {
    Tensor x = round_bf16(random_f32({t, in}, rng_));
    Tensor w = round_bf16(random_f32({out, in}, rng_, -0.1f, 0.1f));
    Tensor want = cpu_->linear(x, w);
    Tensor xg = to_gpu_bf16(*gpu, x), wg = to_gpu_bf16(*gpu, w);
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->linear(xg, wg)), want), kBf16Out) << t << "x" << in << "x" << out;
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->linear(xg, wg, true)), want), kF32Dot) << "f32_out";
    // An F32-stored weight runs an fp32 GEMM (the F32 activation is taken as is).
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->linear(gpu->upload(x), gpu->upload(w))), want), kF32Dot)
        << "F32 w";
    // An F32 activation with BF16 weights is rounded to bf16 on the way in, as the CPU input was.
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->linear(gpu->upload(x), wg)), want), kBf16Out) << "F32 x";
  }
}

// linear_glu: the skinny GEMM's GLU epilogue (gate row i and up row i in one CTA) up to 16 tokens, with I
// off the 8-row tile; 17 tokens take linear + glu_packed. Both against the CPU's definition.
TEST_F(CudaDense, LinearGluMatchesCpu) {
  HLM_GPU_OR_SKIP(gpu);
  // I = 1,600 and 3,000 (200 and 375 tiles of 8 gate rows) take the other two streaming configurations on
  // an H200 (see LinearMatchesInBf16AndF32).
  for (auto [t, in, inter] : {std::tuple{1, 2304, 1024}, std::tuple{5, 64, 20}, std::tuple{16, 200, 36},
                              std::tuple{17, 96, 24}, std::tuple{2, 2304, 1600}, std::tuple{9, 1024, 3000}}) {
    Tensor x = round_bf16(random_f32({t, in}, rng_));
    Tensor w = round_bf16(random_f32({2 * inter, in}, rng_, -0.2f, 0.2f));
    for (Activation kind : {Activation::kSilu, Activation::kSitu}) {
      ActivationParams act;
      act.kind = kind;
      const Tensor want = cpu_->linear_glu(x, w, act);
      const std::string what = std::to_string(t) + "x" + std::to_string(in) + "x" + std::to_string(inter) +
                               (kind == Activation::kSilu ? " silu" : " situ");
      EXPECT_LE(
          rel_l2(gpu->to_host_f32(gpu->linear_glu(to_gpu_bf16(*gpu, x), to_gpu_bf16(*gpu, w), act)), want),
          kBf16Out)
          << what;
      EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->linear_glu(gpu->upload(x), to_gpu_bf16(*gpu, w), act)), want),
                kBf16Out)
          << what << ", F32 x";
    }
  }
}

// Up to 16 tokens with BF16 weights the per-head products take the weight-streaming kernels
// (skinny_gemm.cu: the skinny GEMM batched over heads for w [H, b, a], head_rows_kernel for w [H, a, b]
// up to a = 128); beyond, cuBLASLt. Shapes: MLA's W_UK and W_UV at 32 heads, column counts off the
// 128-column block and the 16-row tile, a past 128 (cuBLASLt for the plain form), 17 tokens; x as BF16
// and as F32 (which the plain form reads as is and the others round to bf16).
TEST_F(CudaDense, HeadMatmulBothOrientations) {
  HLM_GPU_OR_SKIP(gpu);
  for (auto [t, h, a, b] :
       {std::tuple{9, 4, 32, 48}, std::tuple{1, 32, 128, 512}, std::tuple{4, 32, 512, 128},
        std::tuple{16, 3, 128, 200}, std::tuple{5, 2, 120, 24}, std::tuple{2, 2, 136, 16},
        std::tuple{17, 4, 64, 40}}) {
    const std::string what =
        std::to_string(t) + "x" + std::to_string(h) + "x" + std::to_string(a) + "x" + std::to_string(b);
    Tensor x = random_f32({t, h, a}, rng_);
    Tensor xb = round_bf16(x);
    Tensor w = round_bf16(random_f32({h, a, b}, rng_, -0.2f, 0.2f));
    Tensor wt = round_bf16(random_f32({h, b, a}, rng_, -0.2f, 0.2f));
    const Tensor wg = to_gpu_bf16(*gpu, w), wtg = to_gpu_bf16(*gpu, wt);
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->head_matmul(gpu->upload(xb), wg)), cpu_->head_matmul(xb, w)),
              kBf16Out)
        << what;
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->head_matmul(to_gpu_bf16(*gpu, x), wtg, true)),
                     cpu_->head_matmul(xb, wt, true)),
              kBf16Out)
        << what << " transposed";
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->head_matmul(gpu->upload(x), wg)), cpu_->head_matmul(x, w)),
              kBf16Out)
        << what << ", F32 x";
    EXPECT_LE(
        rel_l2(gpu->to_host_f32(gpu->head_matmul(gpu->upload(x), wtg, true)), cpu_->head_matmul(x, wt, true)),
        kBf16Out)
        << what << " transposed, F32 x";
  }
}

// mla_absorb_queries: one head_rows_kernel launch writing the product and the copied rope columns (BF16 q up
// to 16 tokens), else the ops of its definition (F32 q, 17 tokens); both against the CPU's definition.
// Shapes: the 48B's 32 heads (nope 128 + rope 64, L 512), and small ones off the 128-column block.
TEST_F(CudaDense, MlaAbsorbQueriesMatchesCpu) {
  HLM_GPU_OR_SKIP(gpu);
  for (auto [t, h, nope, rope, lat] : {std::tuple{1, 32, 128, 64, 512}, std::tuple{3, 4, 32, 8, 48},
                                       std::tuple{16, 2, 128, 0, 136}, std::tuple{17, 2, 16, 8, 16}}) {
    const std::string what = std::to_string(t) + "x" + std::to_string(h) + "x" + std::to_string(nope) + "+" +
                             std::to_string(rope) + "->" + std::to_string(lat);
    Tensor q = round_bf16(random_f32({t, h, nope + rope}, rng_));
    Tensor w_uk = round_bf16(random_f32({h, nope, lat}, rng_, -0.2f, 0.2f));
    const Tensor want = cpu_->mla_absorb_queries(q, w_uk);
    const Tensor wg = to_gpu_bf16(*gpu, w_uk);
    const Tensor got = gpu->to_host_f32(gpu->mla_absorb_queries(to_gpu_bf16(*gpu, q), wg));
    EXPECT_EQ(got.shape(), want.shape()) << what;
    EXPECT_LE(rel_l2(got, want), kBf16Out) << what;
    // The rope columns are copied, not computed: exactly the input's.
    for (int64_t r = 0; r < t * h; ++r) {
      for (int64_t j = 0; j < rope; ++j) {
        ASSERT_EQ(got.data<float>()[r * (lat + rope) + lat + j],
                  q.data<float>()[r * (nope + rope) + nope + j])
            << what << " row " << r << " rope column " << j;
      }
    }
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->mla_absorb_queries(gpu->upload(q), wg)), want), kBf16Out)
        << what << ", F32 q";
  }
}

TEST_F(CudaDense, NormsAndElementwise) {
  HLM_GPU_OR_SKIP(gpu);
  Tensor x = random_f32({13, 2304}, rng_, -3.0f, 3.0f);
  Tensor w = round_bf16(random_f32({2304}, rng_, 0.5f, 1.5f));
  EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->rms_norm(gpu->upload(x), to_gpu_bf16(*gpu, w), 1e-5f)),
                   cpu_->rms_norm(x, w, 1e-5f)),
            kBf16Out);
  // The fused residual step with a BF16 addend: h += a exactly as add_inplace (F32), then the same norm;
  // and the plain norm. Widths for both kernels: multiples of 8 up to 8192 take the vectorized one (2304,
  // 5000), others the per-element one (1003; 9000, wider than it keeps in registers).
  for (int64_t dim : {2304, 5000, 1003, 9000}) {
    Tensor h = random_f32({3, dim}, rng_, -3.0f, 3.0f);
    Tensor a = round_bf16(random_f32({3, dim}, rng_, -1.0f, 1.0f));
    Tensor wd = round_bf16(random_f32({dim}, rng_, 0.5f, 1.5f));
    Tensor hg = gpu->upload(h);
    Tensor got = gpu->add_rms_norm(hg, to_gpu_bf16(*gpu, a), to_gpu_bf16(*gpu, wd), 1e-5f);
    Tensor h_cpu = h.clone();
    Tensor want = cpu_->add_rms_norm(h_cpu, a, wd, 1e-5f);
    EXPECT_LE(rel_l2(gpu->to_host_f32(hg), h_cpu), kF32Out) << "h after add_rms_norm, D " << dim;
    EXPECT_LE(rel_l2(gpu->to_host_f32(got), want), kBf16Out) << "add_rms_norm, D " << dim;
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->rms_norm(gpu->upload(h), to_gpu_bf16(*gpu, wd), 1e-5f)),
                     cpu_->rms_norm(h, wd, 1e-5f)),
              kBf16Out)
        << "rms_norm, D " << dim;
  }

  // GLU: I = 300 takes the 4-wide kernel (BF16 or F32 inputs), I = 302 the scalar one.
  for (int64_t inter : {300, 302}) {
    Tensor g = round_bf16(random_f32({13, inter}, rng_, -6.0f, 6.0f));
    Tensor u = round_bf16(random_f32({13, inter}, rng_, -40.0f, 40.0f));
    // The fused gate|up form: [T, 2I] with the gate columns first, against the CPU's glu of the halves.
    Tensor gate_up = Tensor::empty({13, 2 * inter}, DType::kF32);
    for (int64_t t = 0; t < 13; ++t) {
      for (int64_t c = 0; c < inter; ++c) {
        gate_up.data<float>()[t * 2 * inter + c] = g.data<float>()[t * inter + c];
        gate_up.data<float>()[t * 2 * inter + inter + c] = u.data<float>()[t * inter + c];
      }
    }
    for (Activation kind : {Activation::kSilu, Activation::kSitu}) {
      ActivationParams act;
      act.kind = kind;
      const Tensor want = cpu_->glu(g, u, act);
      for (bool bf16_in : {true, false}) {
        auto in = [&](const Tensor& t) { return bf16_in ? to_gpu_bf16(*gpu, t) : gpu->upload(t); };
        const std::string what = "I " + std::to_string(inter) + (bf16_in ? ", BF16 in" : ", F32 in");
        EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->glu(in(g), in(u), act)), want), kBf16Out) << "glu, " << what;
        EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->glu_packed(in(gate_up), act)), want), kBf16Out)
            << "glu_packed, " << what;
      }
      EXPECT_LE(rel_l2(cpu_->glu_packed(gate_up, act), want), 0.0) << "CPU glu_packed";
    }
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->sigmoid(to_gpu_bf16(*gpu, g))), cpu_->sigmoid(g)), kF32Out);
    Tensor gated = to_gpu_bf16(*gpu, g);
    gpu->sigmoid_gate_inplace(gated, to_gpu_bf16(*gpu, u));
    Tensor gated_cpu = g.clone();
    cpu_->sigmoid_gate_inplace(gated_cpu, u);
    EXPECT_LE(rel_l2(gpu->to_host_f32(gated), gated_cpu), kBf16Out);
  }

  Tensor y = gpu->upload(x);  // F32 residual += BF16 branch
  Tensor branch = round_bf16(random_f32({13, 2304}, rng_));
  gpu->add_inplace(y, to_gpu_bf16(*gpu, branch));
  Tensor want = x.clone();
  cpu_->add_inplace(want, branch);
  EXPECT_LE(rel_l2(gpu->to_host_f32(y), want), kF32Out);
}

TEST_F(CudaDense, LayoutMoversAreExact) {
  HLM_GPU_OR_SKIP(gpu);
  Tensor x = random_f32({6, 4, 10}, rng_);
  Tensor xg = gpu->upload(x);
  EXPECT_EQ(rel_l2(gpu->to_host_f32(gpu->slice_last(xg, 3, 9)), cpu_->slice_last(x, 3, 9)), 0.0);
  // One row: the slice is a view of x (no copy), with the same values and shape.
  Tensor row = random_f32({1, 1, 40}, rng_);
  Tensor row_slice = gpu->slice_last(gpu->upload(row), 8, 24);
  EXPECT_EQ(row_slice.shape(), (Shape{1, 1, 16}));
  EXPECT_EQ(rel_l2(gpu->to_host_f32(row_slice), cpu_->slice_last(row, 8, 24)), 0.0);
  Tensor b = random_f32({6, 4, 5}, rng_);
  EXPECT_EQ(rel_l2(gpu->to_host_f32(gpu->concat_last(xg, gpu->upload(b))), cpu_->concat_last(x, b)), 0.0);
  Tensor idx = Tensor::from_vector_i32({4}, {5, 0, 0, 2});
  EXPECT_EQ(rel_l2(gpu->to_host_f32(gpu->gather_rows(xg, gpu->upload(idx))), cpu_->gather_rows(x, idx)), 0.0);
  EXPECT_EQ(rel_l2(gpu->to_host_f32(gpu->transpose01(xg)), cpu_->transpose01(x)), 0.0);
  Tensor i64 = gpu->upload(Tensor::from_vector_i32({3, 2}, {1, 2, 3, 4, 5, 6}));
  Tensor t64 = gpu->to_host(gpu->transpose01(i64));
  EXPECT_EQ(std::vector<int32_t>(t64.data<int32_t>(), t64.data<int32_t>() + 6),
            (std::vector<int32_t>{1, 3, 5, 2, 4, 6}));
}

// Decode batches (7 rows) of widths divisible by 4 up to 8 x 1024 take the sliced kernel: 256 one CTA per
// token (also with a BF16 candidate), K3's 7168 a cluster of 7, 5000 a cluster of 5 whose last CTA covers
// part of its columns, with the most candidates the op takes. 40 rows of 7168 (more CTAs than one wave on
// an H200), 9000 (9 slices) take the one-block 4-column kernel, 250 the column-per-thread one.
TEST_F(CudaDense, AttnResMatchesInF32) {
  HLM_GPU_OR_SKIP(gpu);
  struct Case {
    int64_t dim;
    int num;
    bool bf16_first;
    int64_t rows = 7;
  };
  for (const Case& k :
       {Case{256, 5, false}, Case{7168, 9, false}, Case{5000, 16, true}, Case{7168, 3, false, 40},
        Case{9000, 3, false}, Case{250, 9, false}, Case{256, 5, true}, Case{250, 5, true}}) {
    std::vector<Tensor> cands, cands_gpu;
    for (int c = 0; c < k.num; ++c) {
      cands.push_back(round_bf16(random_f32({k.rows, k.dim}, rng_, -2.0f, 2.0f)));
      cands_gpu.push_back(c == 0 && k.bf16_first ? to_gpu_bf16(*gpu, cands.back())
                                                 : gpu->upload(cands.back()));
    }
    Tensor proj = random_f32({k.dim}, rng_), norm = random_f32({k.dim}, rng_);
    EXPECT_LE(rel_l2(gpu->to_host_f32(gpu->attn_res(cands_gpu, gpu->upload(proj), gpu->upload(norm), 1e-5f)),
                     cpu_->attn_res(cands, proj, norm, 1e-5f)),
              kF32Dot)
        << "D " << k.dim << ", " << k.num << " candidates, " << k.rows << " rows"
        << (k.bf16_first ? ", the first BF16" : "");
  }
}

TEST_F(CudaDense, RandomFillIsTheCpuFill) {
  HLM_GPU_OR_SKIP(gpu);
  RandomFill f;
  f.scale = 0.3f;
  f.offset = 1.0f;
  f.seed = 99;
  Tensor want = Tensor::empty({1000}, DType::kF32);
  cpu_->random_fill(want, f);
  Tensor got = gpu->empty({1000}, DType::kF32);
  gpu->random_fill(got, f);
  EXPECT_LE(rel_l2(gpu->to_host_f32(got), want), 1e-6);  // fused multiply-add may differ in the last ulp
  f.byte_lo = 118;
  f.byte_hi = 121;
  Tensor bytes_want = Tensor::empty({1000}, DType::kU8);
  cpu_->random_fill(bytes_want, f);
  Tensor bytes = gpu->empty({1000}, DType::kU8);
  gpu->random_fill(bytes, f);
  Tensor host = gpu->to_host(bytes);
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(host.data<uint8_t>()[i], bytes_want.data<uint8_t>()[i]) << i;
}

TEST_F(CudaDense, StepScratchComesFromTheArenaAtRepeatingAddresses) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(int64_t{1} << 20);
  auto run = [&] {
    gpu->begin_step();
    Tensor a = gpu->empty({1000}, DType::kF32);
    Tensor b = gpu->empty({3000}, DType::kF32);
    const void* where = b.raw();
    a = Tensor();
    Tensor c = gpu->empty({500}, DType::kF32);  // reuses a's block
    gpu->end_step();
    return std::pair{where, c.raw()};
  };
  const auto first = run();
  EXPECT_EQ(run(), first);
  gpu->begin_step();
  EXPECT_THROW(gpu->empty({int64_t{1} << 20}, DType::kF32), Error);  // 4 MiB > 1 MiB arena
  gpu->end_step();
}

// Ops::begin_side .. join_side inside a step: the side's GEMMs (cuBLASLt and the skinny kernel, each stream
// with its own workspace) give what they give on the main stream, and a block released while side work is
// pending is not handed out again before the join (the side stream may still be using it).
TEST_F(CudaDense, SideStreamWorkIsJoinedAndItsReleasesHeld) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(int64_t{64} << 20);
  Tensor x = round_bf16(random_f32({32, 512}, rng_)), x1 = round_bf16(random_f32({1, 512}, rng_));
  Tensor w = round_bf16(random_f32({640, 512}, rng_, -0.1f, 0.1f));
  Tensor xg = to_gpu_bf16(*gpu, x), x1g = to_gpu_bf16(*gpu, x1), wg = to_gpu_bf16(*gpu, w);
  gpu->begin_step();
  gpu->begin_side();
  Tensor side_big = gpu->linear(xg, wg, true);   // [32, 640] cuBLASLt
  Tensor side_one = gpu->linear(x1g, wg, true);  // [1, 640] skinny GEMM
  Tensor scratch = gpu->empty({4096}, DType::kF32);
  const void* released = scratch.raw();
  scratch = Tensor();
  gpu->end_side();
  Tensor main_big = gpu->linear(xg, wg, true);
  Tensor during = gpu->empty({4096}, DType::kF32);
  EXPECT_NE(during.raw(), released);
  gpu->join_side();
  Tensor after = gpu->empty({4096}, DType::kF32);
  EXPECT_EQ(after.raw(), released);
  const Tensor got_big = gpu->to_host_f32(side_big), got_one = gpu->to_host_f32(side_one);
  const Tensor got_main = gpu->to_host_f32(main_big);
  gpu->end_step();
  EXPECT_LE(rel_l2(got_big, cpu_->linear(x, w)), kF32Dot);
  EXPECT_LE(rel_l2(got_one, cpu_->linear(x1, w)), kF32Dot);
  EXPECT_EQ(rel_l2(got_big, got_main), 0.0);
}

}  // namespace
}  // namespace hlm::test
