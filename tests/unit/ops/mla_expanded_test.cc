// The expanded (MHA) form of MLA on the CPU backend (docs/MODEL.md §6.1): gathering a sequence's cache rows
// from its pages, and attention over keys expanded per head in chunks merged exactly, against the absorbed
// form (mla_attention, then W_UV), which computes the same math in another order (1e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/cpu/cpu_ops.h"
#include "ops_test_util.h"

namespace hlm {
namespace {

using test::all_close;
using test::random_tensor;

constexpr float kInf = std::numeric_limits<float>::infinity();

// One sequence of `keys` keys over shuffled pages of a pool whose other rows are NaN, and rows queries:
// a causal chunk after `keys - rows` cached keys, plus a last row that sees no key (kv_len 0).
struct ExpandedCase {
  static constexpr int64_t kHeads = 3, kNope = 16, kRope = 8, kV = 12, kLatent = 32, kPage = 4;
  int64_t keys, rows;
  Tensor cache, page_table, q, kv_len, w_uk, w_uv;  // w_uk [H, nope, L], w_uv [H, v, L]
  MlaSeq seq;

  ExpandedCase(std::mt19937& rng, int64_t keys_, int64_t rows_) : keys(keys_), rows(rows_) {
    const int64_t pages = (keys + kPage - 1) / kPage, pool = pages + 3;
    cache = Tensor::filled({pool, kPage, kLatent + kRope}, std::numeric_limits<float>::quiet_NaN());
    std::vector<int32_t> ids;
    for (int64_t p = 0; p < pages; ++p) ids.push_back(static_cast<int32_t>((p * 5 + 2) % pool));
    page_table = Tensor::from_vector_i32({pages}, ids);
    const Tensor rows_src = random_tensor({keys, kLatent + kRope}, rng);
    for (int64_t s = 0; s < keys; ++s) {
      std::copy_n(rows_src.data<float>() + s * (kLatent + kRope), kLatent + kRope,
                  cache.data<float>() + (ids[s / kPage] * kPage + s % kPage) * (kLatent + kRope));
    }
    q = random_tensor({rows, kHeads, kNope + kRope}, rng);
    kv_len = Tensor::empty({rows}, DType::kI32);
    for (int64_t t = 0; t < rows; ++t) kv_len.data<int32_t>()[t] = static_cast<int32_t>(keys - rows + 1 + t);
    kv_len.data<int32_t>()[rows - 1] = 0;
    w_uk = random_tensor({kHeads, kNope, kLatent}, rng, -0.3f, 0.3f);
    w_uv = random_tensor({kHeads, kV, kLatent}, rng, -0.3f, 0.3f);
    seq = MlaSeq{0, rows, 0, pages};
  }
};

// The absorbed form: q_abs = W_UKᵀ q_nope, attention over the latent rows, then W_UV.
void absorbed(Ops& ops, const ExpandedCase& c, float scale, Tensor& heads, Tensor& stats) {
  const Tensor query = ops.mla_absorb_queries(c.q, c.w_uk);  // [T, H, L + R]
  Tensor ctx;
  ops.mla_attention(query, c.cache, c.page_table, {c.seq}, c.kv_len, scale, ExpandedCase::kLatent, ctx,
                    stats);
  heads = ops.head_matmul(ctx, c.w_uv, /*w_transposed=*/true);  // [T, H, v]
}

// The expanded form over chunks of `chunk` keys, as MlaLayer runs it.
void expanded(Ops& ops, const ExpandedCase& c, float scale, int64_t chunk, Tensor& out, Tensor& stats) {
  using E = ExpandedCase;
  const Tensor w_uk = c.w_uk.reshape({E::kHeads * E::kNope, E::kLatent});
  const Tensor w_uv = c.w_uv.reshape({E::kHeads * E::kV, E::kLatent});
  const int64_t total = c.seq.num_pages * E::kPage;
  for (int64_t k0 = 0; k0 < total; k0 += chunk) {
    const int64_t n = std::min(chunk, total - k0);
    const Tensor keys = ops.mla_gather_keys(c.cache, c.page_table, c.seq, k0, n);  // [n, L + R]
    const Tensor latent = ops.slice_last(keys, 0, E::kLatent);
    const Tensor k_nope = ops.linear(latent, w_uk).reshape({n, E::kHeads, E::kNope});
    const Tensor v = ops.linear(latent, w_uv).reshape({n, E::kHeads, E::kV});
    ops.mla_expanded_attention(c.q, k_nope, v, keys, E::kLatent, c.kv_len, k0, scale, k0 > 0, out, stats);
  }
}

TEST(MlaExpanded, GatherReadsTheSequencesPagesInOrder) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(41);
  ExpandedCase c(rng, 10, 3);
  const Tensor keys = ops->mla_gather_keys(c.cache, c.page_table, c.seq, 3, 6);  // keys 3..8, three pages
  ASSERT_EQ(keys.shape(), (Shape{6, ExpandedCase::kLatent + ExpandedCase::kRope}));
  const int64_t w = keys.dim(1);
  for (int64_t i = 0; i < 6; ++i) {
    const int64_t s = 3 + i, page = c.page_table.data<int32_t>()[s / ExpandedCase::kPage];
    for (int64_t d = 0; d < w; ++d) {
      ASSERT_EQ(keys.data<float>()[i * w + d],
                c.cache.data<float>()[(page * ExpandedCase::kPage + s % ExpandedCase::kPage) * w + d]);
    }
  }
  EXPECT_THROW(ops->mla_gather_keys(c.cache, c.page_table, c.seq, 8, 5),
               Error);  // past the 12 keys of 3 pages
  Tensor bad_table = c.page_table.clone();
  bad_table.data<int32_t>()[1] = 99;
  EXPECT_THROW(ops->mla_gather_keys(c.cache, bad_table, c.seq, 0, 8), Error);
}

TEST(MlaExpanded, ChunkedExpandedEqualsAbsorbed) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(42);
  const float scale = 1.0f / std::sqrt(float(ExpandedCase::kNope + ExpandedCase::kRope));
  for (int64_t chunk : {64, 8, 5}) {  // one chunk; two and a partial third; chunks that split pages
    ExpandedCase c(rng, 21, 7);
    Tensor ref, ref_stats, out, stats;
    absorbed(*ops, c, scale, ref, ref_stats);
    expanded(*ops, c, scale, chunk, out, stats);
    ASSERT_EQ(out.shape(), ref.shape());
    EXPECT_TRUE(all_close(out, ref, 1e-5)) << "chunk " << chunk;
    for (int64_t i = 0; i < stats.numel() / 2; ++i) {
      const float m = stats.data<float>()[2 * i], s = stats.data<float>()[2 * i + 1];
      const float rm = ref_stats.data<float>()[2 * i], rs = ref_stats.data<float>()[2 * i + 1];
      if (rs == 0.0f) {  // the row without keys: (-inf, 0) and out 0, no NaN from the NaN pool rows
        EXPECT_EQ(m, -kInf) << i;
        EXPECT_EQ(s, 0.0f) << i;
        for (int64_t e = 0; e < ExpandedCase::kV; ++e)
          EXPECT_EQ(out.data<float>()[i * ExpandedCase::kV + e], 0.0f);
      } else {
        EXPECT_NEAR(m, rm, 1e-5 * (1 + std::abs(rm))) << "chunk " << chunk << " row " << i;
        EXPECT_NEAR(s, rs, 1e-5 * rs) << "chunk " << chunk << " row " << i;
      }
    }
  }
}

TEST(MlaExpanded, RejectsBadArguments) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(43);
  ExpandedCase c(rng, 8, 2);
  using E = ExpandedCase;
  const Tensor keys = ops->mla_gather_keys(c.cache, c.page_table, c.seq, 0, 8);
  const Tensor k_nope = random_tensor({8, E::kHeads, E::kNope}, rng),
               v = random_tensor({8, E::kHeads, E::kV}, rng);
  auto run = [&](const Tensor& q, const Tensor& kn, const Tensor& vv, int64_t latent, bool merge) {
    Tensor out, stats;
    ops->mla_expanded_attention(q, kn, vv, keys, latent, c.kv_len, 0, 1.0f, merge, out, stats);
  };
  EXPECT_NO_THROW(run(c.q, k_nope, v, E::kLatent, false));
  EXPECT_THROW(run(c.q, k_nope, v, E::kLatent, true), Error);  // merging into nothing
  EXPECT_THROW(run(c.q, k_nope, v, E::kLatent + 1, false), Error);
  EXPECT_THROW(run(c.q, random_tensor({8, E::kHeads + 1, E::kNope}, rng), v, E::kLatent, false), Error);
  EXPECT_THROW(run(c.q, k_nope, random_tensor({7, E::kHeads, E::kV}, rng), E::kLatent, false), Error);
}

}  // namespace
}  // namespace hlm
