// MLA ops of the CPU backend: cache writes, partial attention over scattered pages against naive softmax
// attention in double, the LSE merge of partials (docs/HELIX.md §4), and the absorbed decode form against
// the expanded one (docs/MODEL.md §6.2).
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ops/cpu/cpu_ops.h"
#include "ops_test_util.h"

namespace hlm {
namespace {

using test::all_close;
using test::random_tensor;

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(MlaOps, CacheWriteScattersRowsAndSkipsNegativeSlots) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(21);
  Tensor cache = Tensor::zeros({3, 4, 5}, DType::kF32);
  Tensor entries = random_tensor({3, 5}, rng);
  Tensor slots = Tensor::empty({3}, DType::kI64);
  const int64_t slot_values[3] = {9, -1, 2};
  for (int i = 0; i < 3; ++i) slots.data<int64_t>()[i] = slot_values[i];
  ops->cache_write(entries, slots, cache);
  const float* c = cache.data<float>();
  for (int64_t s = 0; s < 12; ++s) {
    for (int d = 0; d < 5; ++d) {
      const float want = s == 9 ? entries.data<float>()[d] : s == 2 ? entries.data<float>()[10 + d] : 0.0f;
      EXPECT_EQ(c[s * 5 + d], want) << s;
    }
  }
  slots.data<int64_t>()[1] = 12;
  EXPECT_THROW(ops->cache_write(entries, slots, cache), Error);
  EXPECT_THROW(ops->cache_write(random_tensor({3, 6}, rng), slots, cache), Error);
  EXPECT_THROW(ops->cache_write(entries, Tensor::zeros({3}, DType::kI32), cache), Error);
}

// Naive softmax attention in double over each row's first kv_len keys, for comparison.
struct Reference {
  std::vector<double> out, max, sum;
};
Reference naive_attention(const Tensor& q, const Tensor& cache, const Tensor& page_table,
                          const std::vector<MlaSeq>& seqs, const Tensor& kv_len, double scale,
                          int64_t v_dim) {
  const int64_t rows = q.dim(0), heads = q.dim(1), width = q.dim(2), page = cache.dim(1);
  Reference r;
  r.out.assign(rows * heads * v_dim, 0.0);
  r.max.assign(rows * heads, -INFINITY);
  r.sum.assign(rows * heads, 0.0);
  for (const MlaSeq& s : seqs) {
    for (int64_t t = s.token_begin; t < s.token_begin + s.token_count; ++t) {
      const int64_t n = kv_len.data<int32_t>()[t];
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> logit(n);
        std::vector<const float*> key(n);
        for (int64_t j = 0; j < n; ++j) {
          const int32_t pg = page_table.data<int32_t>()[s.page_begin + j / page];
          key[j] = cache.data<float>() + (pg * page + j % page) * width;
          double dot = 0;
          for (int64_t d = 0; d < width; ++d)
            dot += double(q.data<float>()[(t * heads + h) * width + d]) * key[j][d];
          logit[j] = dot * scale;
          r.max[t * heads + h] = std::max(r.max[t * heads + h], logit[j]);
        }
        for (int64_t j = 0; j < n; ++j) {
          const double p = std::exp(logit[j] - r.max[t * heads + h]);
          r.sum[t * heads + h] += p;
          for (int64_t e = 0; e < v_dim; ++e) r.out[(t * heads + h) * v_dim + e] += p * key[j][e];
        }
        for (int64_t e = 0; e < v_dim && n > 0; ++e)
          r.out[(t * heads + h) * v_dim + e] /= r.sum[t * heads + h];
      }
    }
  }
  return r;
}

// Three sequences with pages scattered over the pool, causal kv_len per query, rows without keys.
struct AttentionCase {
  static constexpr int64_t kPage = 4, kHeads = 3, kLatent = 16, kRope = 8, kWidth = kLatent + kRope;
  Tensor cache, q, page_table, kv_len;
  std::vector<MlaSeq> seqs;
  std::vector<std::vector<int32_t>> pages;  // each sequence's pages in local order
  explicit AttentionCase(std::mt19937& rng) {
    cache = random_tensor({20, kPage, kWidth}, rng);
    pages = {{7, 2, 15}, {12}, {0, 19, 5, 11}};
    const std::vector<std::vector<int32_t>> lens = {{9, 10, 11}, {0}, {0, 3, 13, 14, 6}};
    std::vector<int32_t> table, len;
    int64_t row = 0;
    for (size_t s = 0; s < pages.size(); ++s) {
      seqs.push_back({row, static_cast<int64_t>(lens[s].size()), static_cast<int64_t>(table.size()),
                      static_cast<int64_t>(pages[s].size())});
      table.insert(table.end(), pages[s].begin(), pages[s].end());
      len.insert(len.end(), lens[s].begin(), lens[s].end());
      row += static_cast<int64_t>(lens[s].size());
    }
    page_table = Tensor::from_vector_i32({static_cast<int64_t>(table.size())}, table);
    kv_len = Tensor::from_vector_i32({row}, len);
    q = random_tensor({row, kHeads, kWidth}, rng, -2.0f, 2.0f);
  }
};

TEST(MlaOps, AttentionMatchesNaiveSoftmax) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(22);
  AttentionCase c(rng);
  const float scale = 0.4f;
  const int64_t v_dim = AttentionCase::kLatent;
  Tensor out, stats;
  ops->mla_attention(c.q, c.cache, c.page_table, c.seqs, c.kv_len, scale, v_dim, out, stats);
  ASSERT_EQ(out.shape(), (Shape{c.q.dim(0), AttentionCase::kHeads, v_dim}));
  ASSERT_EQ(stats.shape(), (Shape{c.q.dim(0), AttentionCase::kHeads, 2}));
  const Reference ref = naive_attention(c.q, c.cache, c.page_table, c.seqs, c.kv_len, scale, v_dim);
  EXPECT_TRUE(all_close(out, ref.out, 1e-5));
  for (int64_t i = 0; i < stats.numel() / 2; ++i) {
    const float m = stats.data<float>()[2 * i], s = stats.data<float>()[2 * i + 1];
    if (ref.sum[i] == 0.0) {  // no keys: (-inf, 0), out 0, no NaN
      EXPECT_EQ(m, -kInf) << i;
      EXPECT_EQ(s, 0.0f) << i;
      for (int64_t e = 0; e < v_dim; ++e) EXPECT_EQ(out.data<float>()[i * v_dim + e], 0.0f);
    } else {
      EXPECT_NEAR(m, ref.max[i], 1e-5 * (1 + std::abs(ref.max[i]))) << i;
      EXPECT_NEAR(s, ref.sum[i], 1e-5 * ref.sum[i]) << i;
    }
  }

  // Preallocated outputs are filled in place; wrong shapes are refused.
  Tensor out2 = Tensor::filled(out.shape(), 7.0f), stats2 = Tensor::filled(stats.shape(), 7.0f);
  ops->mla_attention(c.q, c.cache, c.page_table, c.seqs, c.kv_len, scale, v_dim, out2, stats2);
  EXPECT_TRUE(all_close(out2, out, 0.0));
  Tensor bad_out = Tensor::zeros({c.q.dim(0), AttentionCase::kHeads, v_dim + 1}, DType::kF32);
  EXPECT_THROW(
      ops->mla_attention(c.q, c.cache, c.page_table, c.seqs, c.kv_len, scale, v_dim, bad_out, stats2), Error);
}

TEST(MlaOps, AttentionDoesNotDependOnThreadCount) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(27);
  AttentionCase c(rng);
  const int saved = omp_get_max_threads();
  std::vector<Tensor> outs, stats;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    outs.emplace_back();
    stats.emplace_back();
    ops->mla_attention(c.q, c.cache, c.page_table, c.seqs, c.kv_len, 0.3f, 16, outs.back(), stats.back());
  }
  omp_set_num_threads(saved);
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_TRUE(all_close(outs[i], outs[0], 0.0));
    EXPECT_EQ(std::memcmp(stats[i].raw(), stats[0].raw(), stats[0].nbytes()), 0);  // bitwise, -inf included
  }
}

TEST(MlaOps, AttentionRejectsBadInput) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(23);
  AttentionCase c(rng);
  Tensor out, stats;
  auto run = [&](const Tensor& page_table, const Tensor& kv_len, const std::vector<MlaSeq>& seqs,
                 int64_t v_dim) {
    Tensor o, s;
    ops->mla_attention(c.q, c.cache, page_table, seqs, kv_len, 1.0f, v_dim, o, s);
  };
  EXPECT_NO_THROW(run(c.page_table, c.kv_len, c.seqs, 16));
  EXPECT_THROW(run(c.page_table, c.kv_len, c.seqs, AttentionCase::kWidth + 1), Error);
  Tensor long_len = c.kv_len.clone();
  long_len.data<int32_t>()[0] = 13;  // the first sequence has 3 pages of 4
  EXPECT_THROW(run(c.page_table, long_len, c.seqs, 16), Error);
  Tensor bad_table = c.page_table.clone();
  bad_table.data<int32_t>()[1] = 20;  // the pool has 20 pages
  EXPECT_THROW(run(bad_table, c.kv_len, c.seqs, 16), Error);
  std::vector<MlaSeq> overlapping = c.seqs;
  overlapping[1].token_begin = 2;
  EXPECT_THROW(run(c.page_table, c.kv_len, overlapping, 16), Error);
  Tensor q_wide = random_tensor({c.q.dim(0), AttentionCase::kHeads, AttentionCase::kWidth + 1}, rng);
  EXPECT_THROW(ops->mla_attention(q_wide, c.cache, c.page_table, c.seqs, c.kv_len, 1.0f, 16, out, stats),
               Error);
}

TEST(MlaOps, PartialAttentionOverTwoRanksPlusCombineEqualsFull) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(24);
  AttentionCase c(rng);
  const float scale = 0.4f;
  const int64_t v_dim = AttentionCase::kLatent, page = AttentionCase::kPage, rows = c.q.dim(0);
  Tensor full_out, full_stats;
  ops->mla_attention(c.q, c.cache, c.page_table, c.seqs, c.kv_len, scale, v_dim, full_out, full_stats);

  // Pages striped over two ranks (local page i of a sequence lives on rank i % 2). A rank's visible keys
  // are those of its pages below the query's global kv_len: a prefix of its local keys.
  const int ranks = 2;
  Tensor parts = Tensor::empty({ranks, rows, AttentionCase::kHeads, v_dim}, DType::kF32);
  Tensor stats = Tensor::empty({ranks, rows, AttentionCase::kHeads, 2}, DType::kF32);
  bool some_row_empty_on_one_rank = false;
  for (int r = 0; r < ranks; ++r) {
    std::vector<int32_t> table, len(rows, 0);
    std::vector<MlaSeq> seqs;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      std::vector<int64_t> owned;
      for (size_t i = 0; i < c.pages[s].size(); ++i) {
        if (static_cast<int>(i % ranks) == r) owned.push_back(static_cast<int64_t>(i));
      }
      MlaSeq local = c.seqs[s];
      local.page_begin = static_cast<int64_t>(table.size());
      local.num_pages = static_cast<int64_t>(owned.size());
      for (int64_t i : owned) table.push_back(c.pages[s][i]);
      for (int64_t t = local.token_begin; t < local.token_begin + local.token_count; ++t) {
        const int64_t n = c.kv_len.data<int32_t>()[t];
        for (int64_t i : owned) len[t] += static_cast<int32_t>(std::clamp<int64_t>(n - i * page, 0, page));
        some_row_empty_on_one_rank |= n > 0 && len[t] == 0;
      }
      seqs.push_back(local);
    }
    Tensor out = parts[r], st = stats[r];
    ops->mla_attention(c.q, c.cache, Tensor::from_vector_i32({static_cast<int64_t>(table.size())}, table),
                       seqs, Tensor::from_vector_i32({rows}, len), scale, v_dim, out, st);
  }
  EXPECT_TRUE(some_row_empty_on_one_rank);
  Tensor merged = ops->lse_combine(parts, stats);
  EXPECT_TRUE(all_close(merged, full_out, 1e-5));
  for (int64_t i = 0; i < merged.numel(); ++i) EXPECT_FALSE(std::isnan(merged.data<float>()[i]));
}

TEST(MlaOps, LseCombineMatchesReference) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(25);
  const int64_t sources = 3, rows = 4, heads = 2, vd = 5;
  Tensor parts = random_tensor({sources, rows, heads, vd}, rng);
  Tensor stats = Tensor::empty({sources, rows, heads, 2}, DType::kF32);
  std::uniform_real_distribution<float> max_dist(-50.0f, 50.0f), sum_dist(1.0f, 100.0f);
  for (int64_t i = 0; i < sources * rows * heads; ++i) {
    stats.data<float>()[2 * i] = max_dist(rng);
    stats.data<float>()[2 * i + 1] = sum_dist(rng);
  }
  auto make_empty = [&](int64_t src, int64_t row) {  // empty source; its part is garbage and must be ignored
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t i = (src * rows + row) * heads + h;
      stats.data<float>()[2 * i] = -kInf;
      stats.data<float>()[2 * i + 1] = 0.0f;
      for (int64_t e = 0; e < vd; ++e) parts.data<float>()[i * vd + e] = NAN;
    }
  };
  make_empty(1, 0);
  make_empty(0, 2);
  make_empty(2, 2);
  for (int64_t s = 0; s < sources; ++s) make_empty(s, 3);  // no keys anywhere
  std::vector<double> ref(rows * heads * vd, 0.0);
  for (int64_t r = 0; r < rows * heads; ++r) {
    double m = -INFINITY;
    for (int64_t s = 0; s < sources; ++s)
      m = std::max(m, double(stats.data<float>()[2 * (s * rows * heads + r)]));
    if (m == -INFINITY) continue;
    double den = 0;
    std::vector<double> w(sources);
    for (int64_t s = 0; s < sources; ++s) {
      const int64_t i = s * rows * heads + r;
      w[s] = stats.data<float>()[2 * i + 1] * std::exp(stats.data<float>()[2 * i] - m);
      den += w[s];
    }
    for (int64_t s = 0; s < sources; ++s) {
      if (w[s] == 0) continue;
      for (int64_t e = 0; e < vd; ++e)
        ref[r * vd + e] += w[s] / den * parts.data<float>()[(s * rows * heads + r) * vd + e];
    }
  }
  Tensor y = ops->lse_combine(parts, stats);
  ASSERT_EQ(y.shape(), (Shape{rows, heads, vd}));
  EXPECT_TRUE(all_close(y, ref, 1e-5));
  EXPECT_THROW(ops->lse_combine(parts, random_tensor({sources, rows, heads, 3}, rng)), Error);
  EXPECT_THROW(ops->lse_combine(parts, random_tensor({sources + 1, rows, heads, 2}, rng)), Error);
}

TEST(MlaOps, AbsorbedEqualsExpanded) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(26);
  const int64_t heads = 4, nope = 16, rope = 8, vd = 12, latent = 32, keys = 10, page = 4, rows = 2;
  const int64_t per_head = nope + vd;
  Tensor w_kv_b = random_tensor({heads * per_head, latent}, rng, -0.3f, 0.3f);  // rows h·(nope+v) + j
  Tensor c = random_tensor({keys, latent}, rng), k_pe = random_tensor({keys, rope}, rng);
  Tensor q_nope = random_tensor({rows, heads, nope}, rng), q_pe = random_tensor({rows, heads, rope}, rng);
  const std::vector<int32_t> lens = {keys, 6};  // the second query sees a causal prefix
  const double scale = 1.0 / std::sqrt(double(nope + rope));

  // Absorbed: q_abs = W_UKᵀ q_nope, attention over [c | k_pe] with values c, then W_UV.
  Tensor w_uk = Tensor::empty({heads, nope, latent}, DType::kF32);  // [H, nope, L]
  Tensor w_uv_t = Tensor::empty({heads, latent, vd}, DType::kF32);  // [H, L, v] = W_UV[h]ᵀ
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t l = 0; l < latent; ++l) {
      for (int64_t i = 0; i < nope; ++i)
        w_uk.data<float>()[(h * nope + i) * latent + l] =
            w_kv_b.data<float>()[(h * per_head + i) * latent + l];
      for (int64_t j = 0; j < vd; ++j)
        w_uv_t.data<float>()[(h * latent + l) * vd + j] =
            w_kv_b.data<float>()[(h * per_head + nope + j) * latent + l];
    }
  }
  Tensor query = ops->concat_last(ops->head_matmul(q_nope, w_uk), q_pe);  // [T, H, L + R]
  Tensor cache = Tensor::zeros({5, page, latent + rope}, DType::kF32);
  const std::vector<int32_t> pages = {3, 0, 4};
  Tensor slots = Tensor::empty({keys}, DType::kI64);
  for (int64_t s = 0; s < keys; ++s) slots.data<int64_t>()[s] = pages[s / page] * page + s % page;
  ops->cache_write(ops->concat_last(c, k_pe), slots, cache);
  Tensor ctx, stats;
  ops->mla_attention(query, cache, Tensor::from_vector_i32({3}, pages), {{0, rows, 0, 3}},
                     Tensor::from_vector_i32({rows}, lens), static_cast<float>(scale), latent, ctx, stats);
  Tensor absorbed = ops->head_matmul(ctx, w_uv_t);  // [T, H, v]

  // Expanded, in double: k = [W_UK c | k_pe], v = W_UV c, softmax(q·k·scale)·v.
  std::vector<double> ref(rows * heads * vd, 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> logit(lens[t]), value(lens[t] * vd);
      double m = -INFINITY;
      for (int64_t s = 0; s < lens[t]; ++s) {
        double score = 0;
        for (int64_t i = 0; i < nope; ++i) {
          double k = 0;
          for (int64_t l = 0; l < latent; ++l)
            k += double(w_kv_b.data<float>()[(h * per_head + i) * latent + l]) *
                 c.data<float>()[s * latent + l];
          score += double(q_nope.data<float>()[(t * heads + h) * nope + i]) * k;
        }
        for (int64_t i = 0; i < rope; ++i)
          score += double(q_pe.data<float>()[(t * heads + h) * rope + i]) * k_pe.data<float>()[s * rope + i];
        logit[s] = score * scale;
        m = std::max(m, logit[s]);
        for (int64_t j = 0; j < vd; ++j) {
          double v = 0;
          for (int64_t l = 0; l < latent; ++l)
            v += double(w_kv_b.data<float>()[(h * per_head + nope + j) * latent + l]) *
                 c.data<float>()[s * latent + l];
          value[s * vd + j] = v;
        }
      }
      double sum = 0;
      for (int64_t s = 0; s < lens[t]; ++s) sum += std::exp(logit[s] - m);
      for (int64_t s = 0; s < lens[t]; ++s) {
        for (int64_t j = 0; j < vd; ++j)
          ref[(t * heads + h) * vd + j] += std::exp(logit[s] - m) / sum * value[s * vd + j];
      }
    }
  }
  EXPECT_TRUE(all_close(absorbed, ref, 1e-5));
}

}  // namespace
}  // namespace hlm
