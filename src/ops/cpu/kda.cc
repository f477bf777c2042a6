// The KDA core (docs/MODEL.md §5.4-5.6) over ragged batches, updating the per-slot recurrent state
// [slots, H, K, V] (rows = key channel) in place.
//   kda_decode:  the token recurrence — decay first, then the delta-rule update, output read after it.
//   kda_prefill: the chunked form, chunks of 64 aligned to each sequence's first new token, the last one
//                partial. Every decay is a pairwise exp(Γ_i − Γ_j) with i ≥ j (exponent ≤ 0): with softplus
//                gates Γ reaches −1000s within a chunk, so the factored exp(Γ_i)·exp(−Γ_j) would overflow.
//                Γ is accumulated in double so that differences of two large cumulative sums keep their
//                precision.
// Work is split over (sequence, head) pairs; each pair runs on one thread in a fixed order, so results
// do not depend on the thread count.
#include <algorithm>

#include "ops/cpu/cpu_kernels.h"

namespace hlm::cpu {
namespace {

constexpr int64_t kChunk = 64;

struct KdaArgs {
  const float* q;     // [T, H, K]
  const float* k;     // [T, H, K]
  const float* v;     // [T, H, V]
  const float* g;     // [T, H, K]
  const float* beta;  // [T, H]
  float* state;       // [slots, H, K, V]
  float* out;         // [T, H, V]
  int64_t heads, kdim, vdim;
};

KdaArgs check_kda_args(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                       const Tensor& beta, const std::vector<SeqSpan>& seqs, Tensor& state, Tensor& out) {
  expect_tensor(q, op, "q", DType::kF32, 3, "[T, H, K]");
  expect_tensor(k, op, "k", DType::kF32, 3, "[T, H, K]");
  expect_tensor(g, op, "g", DType::kF32, 3, "[T, H, K]");
  expect_same_shape(q, k, op, "q", "k", "[T, H, K]");
  expect_same_shape(q, g, op, "q", "g", "[T, H, K]");
  const int64_t rows = q.dim(0), heads = q.dim(1), kdim = q.dim(2);
  expect_tensor(v, op, "v", DType::kF32, 3, "[T, H, V]");
  expect_dim(v, 0, rows, op, "v [T, H, V]", "the token count of q [T, H, K]");
  expect_dim(v, 1, heads, op, "v [T, H, V]", "the head count of q [T, H, K]");
  const int64_t vdim = v.dim(2);
  expect_tensor(beta, op, "beta", DType::kF32, 2, "[T, H]");
  expect_dim(beta, 0, rows, op, "beta [T, H]", "the token count of q [T, H, K]");
  expect_dim(beta, 1, heads, op, "beta [T, H]", "the head count of q [T, H, K]");
  expect_tensor(state, op, "state", DType::kF32, 4, "[slots, H, K, V]");
  expect_dim(state, 1, heads, op, "state [slots, H, K, V]", "the head count of q [T, H, K]");
  expect_dim(state, 2, kdim, op, "state [slots, H, K, V]", "the key dimension of q [T, H, K]");
  expect_dim(state, 3, vdim, op, "state [slots, H, K, V]", "the value dimension of v [T, H, V]");
  check_seq_spans(seqs, rows, state.dim(0), op);
  out = Tensor::zeros({rows, heads, vdim}, DType::kF32);  // rows outside every sequence stay 0
  return {q.data<float>(),
          k.data<float>(),
          v.data<float>(),
          g.data<float>(),
          beta.data<float>(),
          state.data<float>(),
          out.data<float>(),
          heads,
          kdim,
          vdim};
}

// Per-thread buffers of one chunk.
struct ChunkWorkspace {
  ChunkWorkspace(int64_t kdim, int64_t vdim)
      : qn(kChunk * kdim),
        kn(kChunk * kdim),
        gamma(kChunk * kdim),
        decay_from_start(kChunk * kdim),
        beta(kChunk),
        akk(kChunk * kChunk),
        aqk(kChunk * kChunk),
        u(kChunk * vdim),
        w(kChunk * kdim),
        kdec(kdim) {}
  std::vector<float> qn, kn;            // [C, K] normalized (q also scaled by K^-0.5)
  std::vector<double> gamma;            // [C, K] Γ_i = Σ_{r≤i} g_r within the chunk
  std::vector<float> decay_from_start;  // [C, K] exp(Γ_i)
  std::vector<float> beta;              // [C]
  std::vector<float> akk, aqk;          // [C, C] lower triangular
  std::vector<float> u;                 // [C, V] U, then v_new in place
  std::vector<float> w;                 // [C, K]
  std::vector<float> kdec;              // [K] k̂_j ⊙ exp(Γ_i − Γ_j)
};

// One (sequence, head) pair through all its chunks (docs/MODEL.md §5.6).
void prefill_pair(const KdaArgs& a, const SeqSpan& seq, int64_t h, ChunkWorkspace& ws) {
  const int64_t kd = a.kdim, vd = a.vdim, heads = a.heads;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(kd));
  float* s = a.state + (seq.slot * heads + h) * kd * vd;  // [K, V]
  float* qn = ws.qn.data();
  float* kn = ws.kn.data();
  double* gamma = ws.gamma.data();
  float* dstart = ws.decay_from_start.data();
  float* akk = ws.akk.data();
  float* aqk = ws.aqk.data();
  float* u = ws.u.data();
  float* w = ws.w.data();
  float* kdec = ws.kdec.data();

  for (int64_t c0 = 0; c0 < seq.token_count; c0 += kChunk) {
    const int64_t m = std::min(kChunk, seq.token_count - c0);
    const int64_t row0 = seq.token_begin + c0;
    for (int64_t i = 0; i < m; ++i) {
      const int64_t base = (row0 + i) * heads + h;
      l2_normalize(a.q + base * kd, kd, q_scale, qn + i * kd);
      l2_normalize(a.k + base * kd, kd, 1.0f, kn + i * kd);
      const float* gi = a.g + base * kd;
      for (int64_t d = 0; d < kd; ++d) {
        gamma[i * kd + d] = (i == 0 ? 0.0 : gamma[(i - 1) * kd + d]) + gi[d];
        dstart[i * kd + d] = std::exp(static_cast<float>(gamma[i * kd + d]));
      }
      ws.beta[i] = a.beta[base];
    }

    // Akk[i][j] = β_i Σ_d k̂_i k̂_j exp(Γ_i − Γ_j) for j < i; Aqk[i][j] = Σ_d q̂_i k̂_j exp(Γ_i − Γ_j), j ≤ i.
    for (int64_t i = 0; i < m; ++i) {
      const float* qi = qn + i * kd;
      const float* ki = kn + i * kd;
      const double* gi = gamma + i * kd;
      for (int64_t j = 0; j <= i; ++j) {
        const float* kj = kn + j * kd;
        const double* gj = gamma + j * kd;
        // The exps first, then two vectorized dot products over the decayed key.
        for (int64_t d = 0; d < kd; ++d) kdec[d] = kj[d] * std::exp(static_cast<float>(gi[d] - gj[d]));
        float dot_q = 0.0f, dot_k = 0.0f;
#pragma omp simd reduction(+ : dot_q, dot_k)
        for (int64_t d = 0; d < kd; ++d) {
          dot_q += qi[d] * kdec[d];
          dot_k += ki[d] * kdec[d];
        }
        aqk[i * kChunk + j] = dot_q;
        if (j < i) akk[i * kChunk + j] = ws.beta[i] * dot_k;
      }
    }

    // Forward substitution through the unit lower triangular (I + Akk):
    // U[i] = β_i v_i − Σ_{j<i} Akk[i][j] U[j];  W[i] = β_i (k̂_i ⊙ exp(Γ_i)) − Σ_{j<i} Akk[i][j] W[j].
    for (int64_t i = 0; i < m; ++i) {
      const float bi = ws.beta[i];
      const float* vi = a.v + ((row0 + i) * heads + h) * vd;
      float* ui = u + i * vd;  // [V]
      float* wi = w + i * kd;  // [K]
      for (int64_t j = 0; j < vd; ++j) ui[j] = bi * vi[j];
      for (int64_t d = 0; d < kd; ++d) wi[d] = bi * kn[i * kd + d] * dstart[i * kd + d];
      for (int64_t j = 0; j < i; ++j) {
        const float c = akk[i * kChunk + j];
        const float* uj = u + j * vd;
        const float* wj = w + j * kd;
        for (int64_t e = 0; e < vd; ++e) ui[e] -= c * uj[e];
        for (int64_t d = 0; d < kd; ++d) wi[d] -= c * wj[d];
      }
    }

    // Against the state at chunk start: O[i] = (q̂_i ⊙ exp(Γ_i))ᵀ S and v_new = U − W·S (in place in u).
    for (int64_t i = 0; i < m; ++i) {
      float* oi = a.out + ((row0 + i) * heads + h) * vd;  // [V], zero on entry
      float* ui = u + i * vd;
      for (int64_t d = 0; d < kd; ++d) {
        const float qd = qn[i * kd + d] * dstart[i * kd + d];
        const float wd = w[i * kd + d];
        const float* srow = s + d * vd;
        for (int64_t e = 0; e < vd; ++e) {
          oi[e] += qd * srow[e];
          ui[e] -= wd * srow[e];
        }
      }
    }
    // Within the chunk: O[i] += Σ_{j≤i} Aqk[i][j] v_new[j].
    for (int64_t i = 0; i < m; ++i) {
      float* oi = a.out + ((row0 + i) * heads + h) * vd;
      for (int64_t j = 0; j <= i; ++j) {
        const float c = aqk[i * kChunk + j];
        const float* uj = u + j * vd;
        for (int64_t e = 0; e < vd; ++e) oi[e] += c * uj[e];
      }
    }
    // S = diag(exp(Γ_last)) S + Σ_j (k̂_j ⊙ exp(Γ_last − Γ_j)) v_new[j]ᵀ.
    const double* glast = gamma + (m - 1) * kd;
    for (int64_t d = 0; d < kd; ++d) {
      const float decay = dstart[(m - 1) * kd + d];
      float* srow = s + d * vd;
      for (int64_t e = 0; e < vd; ++e) srow[e] *= decay;
    }
    for (int64_t j = 0; j < m; ++j) {
      const float* uj = u + j * vd;
      const double* gj = gamma + j * kd;
      for (int64_t d = 0; d < kd; ++d) {
        const float kd_decayed = kn[j * kd + d] * std::exp(static_cast<float>(glast[d] - gj[d]));
        float* srow = s + d * vd;
        for (int64_t e = 0; e < vd; ++e) srow[e] += kd_decayed * uj[e];
      }
    }
  }
}

// One token of one (sequence, head) pair (docs/MODEL.md §5.5). qn, kn: [K] and u: [V] scratch.
void decode_pair(const KdaArgs& a, const SeqSpan& seq, int64_t h, float* qn, float* kn, float* u) {
  const int64_t kd = a.kdim, vd = a.vdim, base = seq.token_begin * a.heads + h;
  float* s = a.state + (seq.slot * a.heads + h) * kd * vd;  // [K, V]
  l2_normalize(a.q + base * kd, kd, 1.0f / std::sqrt(static_cast<float>(kd)), qn);
  l2_normalize(a.k + base * kd, kd, 1.0f, kn);
  const float* g = a.g + base * kd;
  const float* v = a.v + base * vd;
  const float b = a.beta[base];
  float* o = a.out + base * vd;  // [V], zero on entry

  // Decay first; u collects Sᵀk̂ of the decayed state.
  std::fill(u, u + vd, 0.0f);
  for (int64_t d = 0; d < kd; ++d) {
    const float decay = std::exp(g[d]);
    float* srow = s + d * vd;
    for (int64_t e = 0; e < vd; ++e) {
      srow[e] *= decay;
      u[e] += srow[e] * kn[d];
    }
  }
  for (int64_t e = 0; e < vd; ++e) u[e] = b * (v[e] - u[e]);
  // Delta update S += k̂ uᵀ, then read o = Sᵀq̂ from the updated state.
  for (int64_t d = 0; d < kd; ++d) {
    float* srow = s + d * vd;
    for (int64_t e = 0; e < vd; ++e) {
      srow[e] += kn[d] * u[e];
      o[e] += srow[e] * qn[d];
    }
  }
}

}  // namespace

Tensor kda_prefill(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                   const SeqBatch& batch, Tensor& state) {
  const std::vector<SeqSpan>& seqs = batch.spans;
  Tensor out;
  const KdaArgs a = check_kda_args("kda_prefill", q, k, v, g, beta, seqs, state, out);
  const int64_t pairs = static_cast<int64_t>(seqs.size()) * a.heads;
#pragma omp parallel
  {
    ChunkWorkspace ws(a.kdim, a.vdim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t p = 0; p < pairs; ++p) {
      if (seqs[p / a.heads].token_count > 0) prefill_pair(a, seqs[p / a.heads], p % a.heads, ws);
    }
  }
  return out;
}

Tensor kda_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const SeqBatch& batch, Tensor& state) {
  const std::vector<SeqSpan>& seqs = batch.spans;
  Tensor out;
  const KdaArgs a = check_kda_args("kda_decode", q, k, v, g, beta, seqs, state, out);
  for (size_t i = 0; i < seqs.size(); ++i) {
    HLM_CHECK(seqs[i].token_count <= 1,
              "kda_decode: sequence {} has {} new tokens; decode takes at most 1 (use kda_prefill for more)",
              i, seqs[i].token_count);
  }
  const int64_t pairs = static_cast<int64_t>(seqs.size()) * a.heads;
#pragma omp parallel
  {
    std::vector<float> qn(a.kdim), kn(a.kdim), u(a.vdim);
#pragma omp for
    for (int64_t p = 0; p < pairs; ++p) {
      if (seqs[p / a.heads].token_count == 1) {
        decode_pair(a, seqs[p / a.heads], p % a.heads, qn.data(), kn.data(), u.data());
      }
    }
  }
  return out;
}

}  // namespace hlm::cpu
