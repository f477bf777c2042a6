// The CUDA ops of the expanded (MHA) MLA prefill form (mla_gather_keys, mla_expanded_attention) against
// the CPU reference. Inputs are rounded to bf16 for the CPU and uploaded as BF16, so both backends see the
// same values. Every key row past the last one a query may see holds NaN (in k_nope, v and the gathered
// rows), so a read past it shows up; the rows of a chunk a CTA's queries cannot see must never be read.
//
// Tolerances, as for mla_attention (cuda_mla_test.cc): stats max 1e-5·(1 + |max|), sum 3e-5 relative (the
// logits are fp32 sums of exact bf16 products in another order); out: the GPU rounds the softmax weights
// to bf16 for P·V, |Δout| <= 2^-8 · max|v| per element with |v| <= 1, and 5e-3 relative L2. Merging a
// second chunk applies the same exact LSE formula to both results, so the bounds stay those of one chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "gpu_test_util.h"

namespace hlm::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kMaxTol = 1e-5;
constexpr double kSumTol = 3e-5;
constexpr double kOutRelL2 = 5e-3;
constexpr double kOutAbs = 1.0 / 256 + 1e-5;

struct Dims {
  int64_t heads, nope, rope, v, latent;
};

// One sequence's chunk: T queries after `prefix` keys (causal), row 5 sees no key; n keys in all, NaN
// from the last visible key on.
struct Case {
  Tensor q, k_nope, v, keys, kv_len;  // host F32 (bf16-rounded), kv_len I32
};

Case make_case(std::mt19937& rng, const Dims& d, int64_t rows, int64_t prefix, int64_t n) {
  Case c;
  c.q = round_bf16(random_f32({rows, d.heads, d.nope + d.rope}, rng, -2.0f, 2.0f));
  c.k_nope = round_bf16(random_f32({n, d.heads, d.nope}, rng));
  c.v = round_bf16(random_f32({n, d.heads, d.v}, rng));
  c.keys = round_bf16(random_f32({n, d.latent + d.rope}, rng));
  c.kv_len = Tensor::empty({rows}, DType::kI32);
  for (int64_t t = 0; t < rows; ++t) c.kv_len.data<int32_t>()[t] = static_cast<int32_t>(prefix + t + 1);
  c.kv_len.data<int32_t>()[5] = 0;
  const int64_t visible = prefix + rows;
  for (Tensor* t : {&c.k_nope, &c.v, &c.keys}) {
    const int64_t per_key = t->numel() / n;
    for (int64_t i = visible * per_key; i < t->numel(); ++i) t->data<float>()[i] = kNaN;
  }
  return c;
}

class CudaMlaExpanded : public ::testing::Test {
 protected:
  // Runs both backends over the chunks [bounds[i], bounds[i+1]) of the keys, merging after the first, and
  // compares out and stats.
  void check(Ops& gpu, const Case& c, int64_t latent, const std::vector<int64_t>& bounds, bool q_f32,
             const std::string& what) {
    SCOPED_TRACE(what);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.q.dim(2)));
    const int64_t rows = c.q.dim(0), heads = c.q.dim(1), vd = c.v.dim(2);
    Tensor out_c, stats_c;
    Tensor out_g = gpu.upload(Tensor::filled({rows, heads, vd}, kNaN));
    Tensor stats_g = gpu.upload(Tensor::filled({rows, heads, 2}, kNaN));
    const Tensor q_g = q_f32 ? gpu.upload(c.q) : gpu.upload(as_bf16(c.q));
    const Tensor kv_g = gpu.upload(c.kv_len);
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      const int64_t b = bounds[i], e = bounds[i + 1];
      const Tensor kn = c.k_nope.slice(b, e), v = c.v.slice(b, e), keys = c.keys.slice(b, e);
      cpu_->mla_expanded_attention(c.q, kn, v, keys, latent, c.kv_len, b, scale, i > 0, out_c, stats_c);
      gpu.mla_expanded_attention(q_g, gpu.upload(as_bf16(kn)), gpu.upload(as_bf16(v)),
                                 gpu.upload(as_bf16(keys)), latent, kv_g, b, scale, i > 0, out_g, stats_g);
    }
    const Tensor out = gpu.to_host_f32(out_g), stats = gpu.to_host_f32(stats_g);
    EXPECT_LE(rel_l2(out, out_c), kOutRelL2);
    const int64_t empty = expect_attention_rows(out, stats, out_c, stats_c, heads, kMaxTol, kSumTol, kOutAbs);
    EXPECT_EQ(empty, heads) << "row 5 sees no key";
  }

  std::mt19937 rng_{51};
  std::unique_ptr<Ops> cpu_ = make_cpu_ops();
};

// Kimi Linear's heads (nope 128, rope 64, v 128, latent 512), 150 queries after 150 cached keys (three
// 64-row blocks, the last partial), 320 keys of which 300 are visible: one chunk, three chunks (128 keys,
// the last partial and past every query's last key), and chunks of 100 keys, not a multiple of the tile.
TEST_F(CudaMlaExpanded, KimiHeadsOneAndSeveralChunks) {
  HLM_GPU_OR_SKIP(gpu);
  const Dims d{4, 128, 64, 128, 512};
  const Case c = make_case(rng_, d, 150, 150, 320);
  check(*gpu, c, d.latent, {0, 320}, false, "one chunk");
  check(*gpu, c, d.latent, {0, 128, 256, 320}, false, "chunks of 128");
  check(*gpu, c, d.latent, {0, 100, 200, 300, 320}, true, "chunks of 100, F32 q");
}

// Enough query rows (1,100 of 32 heads: 5 row blocks of 256 per head, the last partial) that the kernel
// takes its 256-row CTAs (two m16 tiles per warp), after 100 cached keys, in two chunks.
TEST_F(CudaMlaExpanded, KimiHeadsWideTiling) {
  HLM_GPU_OR_SKIP(gpu);
  const Dims d{32, 128, 64, 128, 512};
  const Case c = make_case(rng_, d, 1100, 100, 1216);
  check(*gpu, c, d.latent, {0, 512, 1216}, false, "two chunks");
  check(*gpu, c, d.latent, {0, 1216}, true, "one chunk, F32 q");
}

// The fixtures' widths (nope 16, rope 8, v 16: padded inside the tile) and a chunk whose queries start
// with no cached keys (prefix 0).
TEST_F(CudaMlaExpanded, SmallWidthsArePadded) {
  HLM_GPU_OR_SKIP(gpu);
  const Dims d{8, 16, 8, 16, 32};
  const Case c = make_case(rng_, d, 70, 0, 80);
  check(*gpu, c, d.latent, {0, 80}, false, "one chunk");
  check(*gpu, c, d.latent, {0, 40, 80}, true, "two chunks, F32 q");
}

// The gather reads a sequence's pages in order (bitwise), from any key offset, and rejects ranges outside
// its pages.
TEST_F(CudaMlaExpanded, GatherMatchesCpu) {
  HLM_GPU_OR_SKIP(gpu);
  const int64_t pool = 9, page = 16, width = 576;
  const Tensor cache = round_bf16(random_f32({pool, page, width}, rng_));
  const Tensor table = Tensor::from_vector_i32({6}, {7, 3, 8, 0, 5, 2});
  const MlaSeq seq{0, 1, 1, 4};  // pages 3, 8, 0, 5
  const Tensor cache_g = gpu->upload(as_bf16(cache)), table_g = gpu->upload(table);
  for (const auto& [begin, count] : {std::pair<int64_t, int64_t>{0, 64}, {5, 40}, {63, 1}, {17, 0}}) {
    const Tensor want = cpu_->mla_gather_keys(cache, table, seq, begin, count);
    const Tensor got = gpu->to_host_f32(gpu->mla_gather_keys(cache_g, table_g, seq, begin, count));
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(rel_l2(got, want), 0.0) << "keys " << begin << " + " << count;
  }
  EXPECT_THROW(gpu->mla_gather_keys(cache_g, table_g, seq, 60, 5), Error);
  EXPECT_THROW(gpu->mla_gather_keys(cache_g, table_g, MlaSeq{0, 1, 4, 3}, 0, 1), Error);
}

TEST_F(CudaMlaExpanded, RejectsUnsupportedShapes) {
  HLM_GPU_OR_SKIP(gpu);
  const Dims d{2, 128, 72, 128, 512};  // nope + rope = 200 > 192
  const Case c = make_case(rng_, d, 8, 0, 16);
  Tensor out, stats;
  EXPECT_THROW(gpu->mla_expanded_attention(gpu->upload(as_bf16(c.q)), gpu->upload(as_bf16(c.k_nope)),
                                           gpu->upload(as_bf16(c.v)), gpu->upload(as_bf16(c.keys)), d.latent,
                                           gpu->upload(c.kv_len), 0, 1.0f, false, out, stats),
               Error);
}

}  // namespace
}  // namespace hlm::test
