// The expanded (MHA) form of MLA attention (docs/MODEL.md §6.1) on the CPU: gathering a chunk of one
// sequence's latent cache rows, and the attention of every query over such a chunk with its keys expanded
// per head, merged into the result of the earlier chunks. The reference the GPU kernels are diffed
// against: fp32 throughout, a two-pass softmax per (query, head) row, and the merge written as
// lse_combine's sum over two sources.
#include <algorithm>
#include <cstring>
#include <limits>

#include "ops/cpu/cpu_kernels.h"

namespace hlm::cpu {

Tensor mla_gather_keys(const Tensor& cache, const Tensor& page_table, const MlaSeq& seq, int64_t key_begin,
                       int64_t count) {
  const char* op = "mla_gather_keys";
  expect_tensor(cache, op, "cache", DType::kF32, 3, "[pages, P, D]");
  expect_tensor(page_table, op, "page_table", DType::kI32, 1, "[N]");
  check_mla_gather_keys(cache, page_table, seq, key_begin, count);
  const int64_t page_size = cache.dim(1), width = cache.dim(2);
  const int32_t* pt = page_table.data<int32_t>() + seq.page_begin;
  for (int64_t p = key_begin / page_size; p * page_size < key_begin + count; ++p) {
    HLM_CHECK(pt[p] >= 0 && pt[p] < cache.dim(0),
              "mla_gather_keys: page_table[{}] = {} is not a page of the cache ({})", seq.page_begin + p,
              pt[p], cache.describe());
  }
  Tensor keys = Tensor::empty({count, width}, DType::kF32);  // [N, D]
  const float* src = cache.data<float>();
  float* dst = keys.data<float>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t s = key_begin + i;
    std::memcpy(dst + i * width, src + (pt[s / page_size] * page_size + s % page_size) * width,
                width * sizeof(float));
  }
  return keys;
}

void mla_expanded_attention(const Tensor& q, const Tensor& k_nope, const Tensor& v, const Tensor& keys,
                            int64_t latent, const Tensor& kv_len, int64_t key_begin, float scale, bool merge,
                            Tensor& out, Tensor& stats) {
  const char* op = "mla_expanded_attention";
  expect_tensor(q, op, "q", DType::kF32, 3, "[T, H, nope + R]");
  expect_tensor(k_nope, op, "k_nope", DType::kF32, 3, "[N, H, nope]");
  expect_tensor(v, op, "v", DType::kF32, 3, "[N, H, V]");
  expect_tensor(keys, op, "keys", DType::kF32, 2, "[N, L + R]");
  expect_tensor(kv_len, op, "kv_len", DType::kI32, 1, "[T]");
  const int64_t rows = q.dim(0), heads = q.dim(1), qk = q.dim(2), n = k_nope.dim(0), nope = k_nope.dim(2);
  const int64_t vd = v.dim(2), rope = qk - nope;
  check_mla_expanded_attention(q, k_nope, v, keys, latent, kv_len, key_begin, merge, out, stats);
  prepare_output(out, {rows, heads, vd}, DType::kF32, op, "out");
  prepare_output(stats, {rows, heads, 2}, DType::kF32, op, "stats");

  const float* qp = q.data<float>();
  const float* kp = k_nope.data<float>();
  const float* vp = v.data<float>();
  const float* rp = keys.data<float>();
  const int32_t* len = kv_len.data<int32_t>();
  float* op_out = out.data<float>();
  float* sp = stats.data<float>();
  const int64_t width = keys.dim(1);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel
  {
    std::vector<float> logits(static_cast<size_t>(n)), o(static_cast<size_t>(vd));
#pragma omp for schedule(dynamic, 1)
    for (int64_t pair = 0; pair < rows * heads; ++pair) {
      const int64_t t = pair / heads, h = pair % heads;
      const int64_t visible = std::clamp<int64_t>(int64_t{len[t]} - key_begin, 0, n);
      const float* qr = qp + pair * qk;
      float max_logit = kNegInf, sum = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t s = 0; s < visible; ++s) {
        const float* kn = kp + (s * heads + h) * nope;
        const float* kr = rp + s * width + latent;
        float dot = 0.0f;
        for (int64_t d = 0; d < nope; ++d) dot += qr[d] * kn[d];
        for (int64_t d = 0; d < rope; ++d) dot += qr[nope + d] * kr[d];
        logits[s] = dot * scale;
        max_logit = std::max(max_logit, logits[s]);
      }
      for (int64_t s = 0; s < visible; ++s) {
        const float p = std::exp(logits[s] - max_logit);
        const float* vr = vp + (s * heads + h) * vd;
        sum += p;
        for (int64_t e = 0; e < vd; ++e) o[e] += p * vr[e];
      }
      if (visible > 0) {
        for (int64_t e = 0; e < vd; ++e) o[e] /= sum;
      }
      float* dst = op_out + pair * vd;
      float* st = sp + pair * 2;
      if (!merge) {
        std::copy(o.begin(), o.end(), dst);
        st[0] = max_logit;
        st[1] = sum;
        continue;
      }
      // lse_combine over (earlier chunks, this chunk).
      const float m = std::max(st[0], max_logit);
      if (m == kNegInf) continue;  // no key in either: stays 0, (-inf, 0)
      const float w0 = st[1] * std::exp(st[0] - m), w1 = sum * std::exp(max_logit - m);
      const float denom = w0 + w1;
      for (int64_t e = 0; e < vd; ++e) {
        float y = 0.0f;
        if (w0 != 0.0f) y += w0 / denom * dst[e];
        if (w1 != 0.0f) y += w1 / denom * o[e];
        dst[e] = y;
      }
      st[0] = m;
      st[1] = denom;
    }
  }
}

}  // namespace hlm::cpu
