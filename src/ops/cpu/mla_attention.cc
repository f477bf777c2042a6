// MLA attention over the paged latent cache (docs/MODEL.md §6.2, docs/HELIX.md §3-4): writing new cache
// rows, the partial attention of one rank over its local keys with (max, sum) statistics, and the exact
// LSE merge of the partials of several ranks. fp32 throughout; the softmax is two-pass (max, then
// Σ exp(logit − max)), so it is stable for any logit range. Work is split over (query, head) rows.
#include <algorithm>
#include <cstring>
#include <limits>

#include "ops/cpu/cpu_kernels.h"

namespace hlm::cpu {

void cache_write(const Tensor& entries, const Tensor& slots, Tensor& cache) {
  const char* op = "cache_write";
  expect_tensor(entries, op, "entries", DType::kF32, 2, "[T, D]");
  expect_tensor(slots, op, "slots", DType::kI64, 1, "[T]");
  expect_tensor(cache, op, "cache", DType::kF32, 3, "[pages, P, D]");
  expect_dim(slots, 0, entries.dim(0), op, "slots [T]", "the row count of entries [T, D]");
  expect_dim(cache, 2, entries.dim(1), op, "cache [pages, P, D]", "the width of entries [T, D]");
  const int64_t rows = entries.dim(0), width = entries.dim(1), capacity = cache.dim(0) * cache.dim(1);
  const int64_t* slot = slots.data<int64_t>();
  for (int64_t t = 0; t < rows; ++t) {
    HLM_CHECK(slot[t] < capacity, "cache_write: slot {} of row {} is outside the cache's {} slots ({})",
              slot[t], t, capacity, cache.describe());
  }
  const float* src = entries.data<float>();
  float* dst = cache.data<float>();
  for (int64_t t = 0; t < rows; ++t) {
    if (slot[t] >= 0) std::memcpy(dst + slot[t] * width, src + t * width, width * sizeof(float));
  }
}

void mla_attention(const Tensor& q, const Tensor& cache, const Tensor& page_table, const MlaBatch& batch,
                   const Tensor& kv_len, float scale, int64_t v_dim, Tensor& out, Tensor& stats) {
  const std::vector<MlaSeq>& seqs = batch.seqs;
  const char* op = "mla_attention";
  expect_tensor(q, op, "q", DType::kF32, 3, "[T, H, D]");
  expect_tensor(cache, op, "cache", DType::kF32, 3, "[pages, P, D]");
  expect_tensor(page_table, op, "page_table", DType::kI32, 1, "[N]");
  expect_tensor(kv_len, op, "kv_len", DType::kI32, 1, "[T]");
  const int64_t rows = q.dim(0), heads = q.dim(1), width = q.dim(2);
  const int64_t num_pages = cache.dim(0), page_size = cache.dim(1);
  expect_dim(cache, 2, width, op, "cache [pages, P, D]", "the query width of q [T, H, D]");
  expect_dim(kv_len, 0, rows, op, "kv_len [T]", "the query count of q [T, H, D]");
  HLM_CHECK(v_dim >= 1 && v_dim <= width, "mla_attention: v_dim {} must be in [1, {}] (the cache row width)",
            v_dim, width);
  const int32_t* pt = page_table.data<int32_t>();
  const int32_t* len = kv_len.data<int32_t>();
  std::vector<int64_t> row_seq(static_cast<size_t>(rows), -1);
  int64_t max_len = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const MlaSeq& s = seqs[i];
    HLM_CHECK(s.token_begin >= 0 && s.token_count >= 0 && s.token_begin + s.token_count <= rows,
              "mla_attention: sequence {} covers query rows [{}, {}), outside the {} rows of q", i,
              s.token_begin, s.token_begin + s.token_count, rows);
    HLM_CHECK(s.page_begin >= 0 && s.num_pages >= 0 && s.page_begin + s.num_pages <= page_table.dim(0),
              "mla_attention: sequence {} lists page_table entries [{}, {}), outside the {} entries", i,
              s.page_begin, s.page_begin + s.num_pages, page_table.dim(0));
    for (int64_t p = s.page_begin; p < s.page_begin + s.num_pages; ++p) {
      HLM_CHECK(pt[p] >= 0 && pt[p] < num_pages,
                "mla_attention: page_table[{}] = {} is not a page of the cache ({})", p, pt[p],
                cache.describe());
    }
    for (int64_t t = s.token_begin; t < s.token_begin + s.token_count; ++t) {
      HLM_CHECK(row_seq[t] < 0, "mla_attention: query row {} belongs to two sequences", t);
      HLM_CHECK(len[t] >= 0 && len[t] <= s.num_pages * page_size,
                "mla_attention: kv_len[{}] = {} exceeds the {} keys of sequence {}'s {} pages", t, len[t],
                s.num_pages * page_size, i, s.num_pages);
      row_seq[t] = static_cast<int64_t>(i);
      max_len = std::max<int64_t>(max_len, len[t]);
    }
  }
  prepare_output(out, {rows, heads, v_dim}, DType::kF32, op, "out");
  prepare_output(stats, {rows, heads, 2}, DType::kF32, op, "stats");

  const float* qp = q.data<float>();
  const float* cp = cache.data<float>();
  float* op_out = out.data<float>();
  float* sp = stats.data<float>();
  const int64_t pairs = rows * heads;
#pragma omp parallel
  {
    std::vector<float> logits(static_cast<size_t>(max_len));
#pragma omp for schedule(dynamic, 1)
    for (int64_t pair = 0; pair < pairs; ++pair) {
      const int64_t t = pair / heads;
      float* o = op_out + pair * v_dim;  // [v_dim]
      std::fill(o, o + v_dim, 0.0f);
      const int64_t n = row_seq[t] < 0 ? 0 : len[t];
      if (n == 0) {  // no visible key on this rank: weight 0 in the LSE merge
        sp[pair * 2] = -std::numeric_limits<float>::infinity();
        sp[pair * 2 + 1] = 0.0f;
        continue;
      }
      const MlaSeq& seq = seqs[row_seq[t]];
      const float* qr = qp + pair * width;
      auto key_row = [&](int64_t s) {
        return cp + (pt[seq.page_begin + s / page_size] * page_size + s % page_size) * width;
      };
      float max_logit = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < n; ++s) {
        const float* kr = key_row(s);
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < width; ++d) dot += qr[d] * kr[d];
        logits[s] = dot * scale;
        max_logit = std::max(max_logit, logits[s]);
      }
      float sum = 0.0f;
      for (int64_t s = 0; s < n; ++s) {
        const float p = std::exp(logits[s] - max_logit);
        const float* vr = key_row(s);  // values: the first v_dim columns of the key row
        sum += p;
        for (int64_t e = 0; e < v_dim; ++e) o[e] += p * vr[e];
      }
      const float inv = 1.0f / sum;
      for (int64_t e = 0; e < v_dim; ++e) o[e] *= inv;
      sp[pair * 2] = max_logit;
      sp[pair * 2 + 1] = sum;
    }
  }
}

Tensor lse_combine(const Tensor& parts, const Tensor& stats) {
  const char* op = "lse_combine";
  expect_tensor(parts, op, "parts", DType::kF32, 4, "[R, T, H, V]");
  expect_tensor(stats, op, "stats", DType::kF32, 4, "[R, T, H, 2]");
  for (int i = 0; i < 3; ++i) {
    expect_dim(stats, i, parts.dim(i), op, "stats [R, T, H, 2]", "the same dimension of parts [R, T, H, V]");
  }
  expect_dim(stats, 3, 2, op, "stats [R, T, H, 2]", "the (max, sum) pair");
  const int64_t sources = parts.dim(0), rows = parts.dim(1) * parts.dim(2), vd = parts.dim(3);
  Tensor y = Tensor::zeros({parts.dim(1), parts.dim(2), vd}, DType::kF32);  // [T, H, V]
  const float* pp = parts.data<float>();
  const float* sp = stats.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel
  {
    std::vector<float> weight(static_cast<size_t>(sources));
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      float global_max = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < sources; ++i) global_max = std::max(global_max, sp[(i * rows + r) * 2]);
      if (global_max == -std::numeric_limits<float>::infinity()) continue;  // no keys anywhere: output 0
      float denom = 0.0f;
      for (int64_t i = 0; i < sources; ++i) {
        const float m = sp[(i * rows + r) * 2], s = sp[(i * rows + r) * 2 + 1];
        weight[i] = s * std::exp(m - global_max);  // 0 for an empty source (-inf, 0)
        denom += weight[i];
      }
      if (denom <= 0.0f) continue;
      float* yr = yp + r * vd;
      for (int64_t i = 0; i < sources; ++i) {
        if (weight[i] == 0.0f) continue;  // an empty source's part is never read, even if it is not 0
        const float wi = weight[i] / denom;
        const float* part = pp + (i * rows + r) * vd;
        for (int64_t e = 0; e < vd; ++e) yr[e] += wi * part[e];
      }
    }
  }
  return y;
}

}  // namespace hlm::cpu
