// Internal to the CPU backend: the op implementations that live in their own files (KDA, MLA, MoE), and
// the helpers they share: argument checks that name the op and the tensor, scalar activations, the
// OpenBLAS GEMM wrapper and the validation of ragged sequence lists. Every check runs before any OpenMP
// region, because an exception must not escape a parallel region.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "base/tensor.h"
#include "ops/ops.h"

namespace hlm::cpu {

// --- argument checks ---------------------------------------------------------------------------------
// Throws unless t is a defined host tensor of `dtype` and `rank`; `layout` spells the expected shape for
// the message, e.g. "kda_prefill: q must be F32[T, H, K], got F32[3, 4]".
void expect_tensor(const Tensor& t, const char* op, const char* name, DType dtype, int rank,
                   const char* layout);
// Throws unless a and b have the same shape: "op: a [layout] and b must have the same shape, got ...".
void expect_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* a_name,
                       const char* b_name, const char* layout);
// Throws unless dimension `dim` of t equals `expected`, naming what the dimension means.
void expect_dim(const Tensor& t, int dim, int64_t expected, const char* op, const char* name,
                const char* meaning);
// Output arguments passed by reference: allocated when undefined, otherwise checked and overwritten.
void prepare_output(Tensor& out, const Shape& shape, DType dtype, const char* op, const char* name);
// A ragged batch must have spans inside [0, rows), pairwise disjoint, and slots inside [0, slots) that
// are distinct (two spans on one slot would race on its state).
// An empty span (padding) may use slot -1.
void check_seq_spans(const std::vector<SeqSpan>& seqs, int64_t rows, int64_t slots, const char* op);

// Host RAM: MemAvailable and MemTotal of /proc/meminfo (what the CPU backend's caches can take).
MemoryInfo host_memory_info();

// --- math --------------------------------------------------------------------------------------------
inline float logistic(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// act(gate) · up: silu, or SiTU = [β·tanh(g/β)·sigmoid(g)] · [β_l·tanh(u/β_l)] (docs/MODEL.md §7.4).
inline float glu_value(float g, float u, const ActivationParams& act) {
  if (act.kind == Activation::kSilu) return silu(g) * u;
  float gate = act.situ_beta * std::tanh(g / act.situ_beta) * logistic(g);
  return gate * (act.situ_linear_beta * std::tanh(u / act.situ_linear_beta));
}
// out[i] = x[i] · scale / sqrt(Σ x² + 1e-6): the KDA l2norm (eps inside the sqrt, docs/MODEL.md §5.4).
void l2_normalize(const float* x, int64_t n, float scale, float* out);
// 1 / sqrt(mean(x²) + eps), the RMSNorm factor of one row, with the sum of squares in double.
inline float inv_rms(const float* x, int64_t n, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(n) + eps));
}

// C[m, n] = A[m, k] · op(B) (+ C when accumulate), row-major with leading dimensions; op(B) = Bᵀ for
// B [n, k] when trans_b, else B [k, n]. Runs OpenBLAS (its own threads); never call it inside an OpenMP
// region.
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          bool trans_b, float* c, int64_t ldc, bool accumulate);

// --- ops implemented in their own files ----------------------------------------------------------------
// kda_conv_gate.cc
Tensor attn_res(const std::vector<Tensor>& candidates, const Tensor& proj, const Tensor& norm, float eps);
Tensor short_conv(const Tensor& x, const Tensor& w, const SeqBatch& seqs, Tensor& state);
Tensor kda_gate(const Tensor& graw, const Tensor& a_log, const Tensor& dt_bias, float lower_bound);
Tensor gated_rms_norm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps);
// kda.cc
Tensor kda_prefill(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                   const SeqBatch& seqs, Tensor& state);
Tensor kda_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const SeqBatch& seqs, Tensor& state);
// mla_attention.cc
void cache_write(const Tensor& entries, const Tensor& slots, Tensor& cache);
void mla_attention(const Tensor& q, const Tensor& cache, const Tensor& page_table, const MlaBatch& seqs,
                   const Tensor& kv_len, float scale, int64_t v_dim, Tensor& out, Tensor& stats);
Tensor lse_combine(const Tensor& parts, const Tensor& stats);
// mla_expanded.cc
Tensor mla_gather_keys(const Tensor& cache, const Tensor& page_table, const MlaSeq& seq, int64_t key_begin,
                       int64_t count);
void mla_expanded_attention(const Tensor& q, const Tensor& k_nope, const Tensor& v, const Tensor& keys,
                            int64_t latent, const Tensor& kv_len, int64_t key_begin, float scale, bool merge,
                            Tensor& out, Tensor& stats);
// moe.cc
void moe_route(const Tensor& x, const Tensor& w, const Tensor& bias, const RouterParams& p, Tensor& idx,
               Tensor& weights);
Tensor moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertWeights& experts,
                   int64_t expert_begin, const ActivationParams& act);
// sampling.cc
int32_t sample_row(const float* logits, int64_t n, const SampleParams& p);
std::vector<int32_t> sample(const Tensor& logits, const std::vector<SampleParams>& rows);

}  // namespace hlm::cpu
