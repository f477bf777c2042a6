// Internal to the CUDA backend: the ops implemented in their own files (like ops/cpu/cpu_kernels.h), each
// a host function that checks its arguments, allocates its outputs from the context and launches its
// kernels on ctx.stream(). CudaOps forwards to them. Semantics are those of ops/ops.h; the dtypes each
// accepts and returns are stated here.
//
// Rules every op here follows (they are what makes decode steps capturable as CUDA graphs):
//  - No host synchronization and no device->host copy inside an op (sample() returns host ids and is
//    the one exception: it runs outside graphs).
//  - Launch shapes may depend on host shapes (T, S, H, ...) and on the host lists of SeqBatch/MlaBatch
//    only through their sizes; per-sequence counts, slots, pages and kv lengths are read on the device
//    from the tables (SeqBatch::table, MlaBatch::table, kv_len, page_table, write slots). A span whose
//    device token_count is 0 (padding; slot -1) must touch no state and write zeros to its rows.
//  - No cudaMalloc: scratch comes from ctx.empty() (the step arena inside a step).
//  - Every kernel launch is followed by HLM_CHECK_LAUNCH; kernels take a plain params struct and are
//    launched by launch_x(params, stream); templates on head size and dtype are dispatched from one switch.
#pragma once

#include <vector>

#include "ops/cuda/cuda_context.h"
#include "ops/ops.h"

namespace hlm::cuda {

template <class T>
struct TypeTag {
  using type = T;
};

// The one switch from a float dtype to a kernel's element type: calls f(TypeTag<T>{}) with T = float or
// __nv_bfloat16.
template <class F>
void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(TypeTag<float>{});
      return;
    case DType::kBF16:
      f(TypeTag<__nv_bfloat16>{});
      return;
    default:
      HLM_FAIL("{}: activations must be F32 or BF16, got {}", op, dtype_name(dtype));
  }
}

// --- dense and element-wise (elementwise.cu, gemm.cc) -----------------------------------------------------
// table [V, D] (BF16/F32), ids [T] I32 -> [T, D] F32 (the residual stream is kept in F32).
Tensor embedding(CudaContext& ctx, const Tensor& table, const Tensor& ids);
// x [T, in] (BF16/F32), w [out, in] (BF16/F32) -> [T, out] BF16 (F32 with f32_out); fp32 accumulation.
Tensor linear(CudaContext& ctx, const Tensor& x, const Tensor& w, bool f32_out);
// Ops::linear_glu: one skinny-GEMM launch where it applies, else its definition.
Tensor linear_glu(CudaContext& ctx, const Tensor& x, const Tensor& gate_up, const ActivationParams& act);
// The decode-size path of linear (skinny_gemm.cu): whether it takes x [T, K] · w [M, K]ᵀ (T <= 16, BF16 w,
// K % 8 == 0, 16-byte aligned), and the GEMM itself into y [T, M] (BF16 or F32); x BF16 or F32.
bool skinny_gemm_applies(const Tensor& x, const Tensor& w);
void skinny_gemm(CudaContext& ctx, const Tensor& x, const Tensor& w, Tensor& y);
// y [T, I] = glu of x · gate_upᵀ, gate_up [2I, K] stacking gate over up rows (Ops::linear_glu).
void skinny_gemm_glu(CudaContext& ctx, const Tensor& x, const Tensor& gate_up, const ActivationParams& act,
                     Tensor& y);
// The decode-size path of head_matmul (skinny_gemm.cu): whether it takes x [T, H, a] (T <= 16, BF16 or F32)
// with a BF16 w [H, b, a] (w_transposed, a % 8 == 0) or [H, a, b] (a <= 128, b % 8 == 0), and the per-head
// products into y [T, H, b] BF16.
bool head_gemv_applies(const Tensor& x, const Tensor& w, bool w_transposed);
void head_gemv(CudaContext& ctx, const Tensor& x, const Tensor& w, bool w_transposed, Tensor& y);
// Ops::mla_absorb_queries in one launch of head_gemv's plain-form kernel where it applies (BF16 q, and
// head_gemv's range for w_uk): the product and the copied rope columns written straight into [T, H, L + R].
bool mla_absorb_queries_applies(const Tensor& q, const Tensor& w_uk);
Tensor mla_absorb_queries(CudaContext& ctx, const Tensor& q, const Tensor& w_uk);
// x [..., D] (BF16/F32), w [D] -> BF16: w · bf16(x · rsqrt(mean(x²) + eps)) (docs/MODEL.md §4).
Tensor rms_norm(CudaContext& ctx, const Tensor& x, const Tensor& w, float eps);
// h += a, then rms_norm(h, w, eps), in one kernel (Ops::add_rms_norm).
Tensor add_rms_norm(CudaContext& ctx, Tensor& h, const Tensor& a, const Tensor& w, float eps);
void add_inplace(CudaContext& ctx, Tensor& y, const Tensor& x);  // any float dtypes, same shape
Tensor glu(CudaContext& ctx, const Tensor& gate, const Tensor& up, const ActivationParams& act);  // -> BF16
Tensor glu_packed(CudaContext& ctx, const Tensor& gate_up, const ActivationParams& act);          // -> BF16
Tensor sigmoid(CudaContext& ctx, const Tensor& x);                                                // -> F32
void sigmoid_gate_inplace(CudaContext& ctx, Tensor& y, const Tensor& gate);
// -> F32 [T, D]
Tensor attn_res(CudaContext& ctx, const std::vector<Tensor>& candidates, const Tensor& proj,
                const Tensor& norm, float eps);
Tensor head_matmul(CudaContext& ctx, const Tensor& x, const Tensor& w, bool w_transposed);  // -> BF16
Tensor slice_last(CudaContext& ctx, const Tensor& x, int64_t begin, int64_t end);           // dtype kept
Tensor concat_last(CudaContext& ctx, const Tensor& a, const Tensor& b);     // mixed F32/BF16 -> F32
Tensor gather_rows(CudaContext& ctx, const Tensor& x, const Tensor& rows);  // rows: I32 on the device
Tensor transpose01(CudaContext& ctx, const Tensor& x);
// dst = src converted to dst's dtype (F32 <-> BF16, or the same dtype), same element count.
void convert(CudaContext& ctx, const Tensor& src, Tensor& dst);
void random_fill(CudaContext& ctx, Tensor& t, const RandomFill& fill);

// --- KDA (kda_conv_gate.cu, kda_decode.cu, kda_prefill.cu) -----------------------------------------------
// x [T, C] (BF16/F32), w [C, W] (BF16/F32), state [slots, C, W-1] (BF16/F32, raw inputs) -> [T, C] BF16
// (planes 1), or the C output columns as `planes` planes [planes, T, C / planes] BF16
// (Ops::short_conv_planes).
Tensor short_conv(CudaContext& ctx, const Tensor& x, const Tensor& w, const SeqBatch& seqs, Tensor& state,
                  int64_t planes = 1);
// graw [T, H*K] (BF16/F32), a_log [H], dt_bias [H*K] (F32 or BF16) -> F32 [T, H*K].
Tensor kda_gate(CudaContext& ctx, const Tensor& graw, const Tensor& a_log, const Tensor& dt_bias,
                float lower_bound);
// q, k, v [T, H, K] (BF16/F32), g [T, H, K] F32, beta [T, H] F32, state [slots, H, K, V] F32 -> [T, H, V]
// BF16.
Tensor kda_prefill(CudaContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                   const Tensor& beta, const SeqBatch& seqs, Tensor& state);
Tensor kda_decode(CudaContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                  const Tensor& beta, const SeqBatch& seqs, Tensor& state);
// o, gate [T, H, V] (BF16/F32), w [V] -> [T, H, V] BF16.
Tensor gated_rms_norm(CudaContext& ctx, const Tensor& o, const Tensor& gate, const Tensor& w, float eps);
// The fused kernel of Ops::kda_decode_gated for head sizes with a tiled decode kernel (K = V in 16, 32,
// 64, 128) and batches of at most 256 (row, head) pairs: sets `out` [T, H, V] and returns true; returns
// false (nothing launched) otherwise.
bool kda_decode_gated(CudaContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& graw,
                      const Tensor& beta_logits, const Tensor& out_gate, const KdaHeadParams& hp,
                      const SeqBatch& seqs, Tensor& state, Tensor& out);
// The fused kernel of Ops::kda_decode_layer (kda_decode_layer.cu) for the shapes it takes (K = V in 16, 32,
// 64, 128, batches of at most 256 (row, head) pairs, bf16 f_b and g_b of one rank r <= 128 with
// r % 32 == 0, conv width <= 4): sets `out` [T, H, V] and returns true; returns false (nothing launched)
// otherwise.
bool kda_decode_layer(CudaContext& ctx, const Tensor& proj, const KdaProjColumns& cols, const Tensor& conv_w,
                      const Tensor& f_b, const Tensor& g_b, const KdaHeadParams& hp, const SeqBatch& seqs,
                      Tensor& conv_state, Tensor& state, Tensor& out);

// --- MLA (mla.cu; the attention kernel: mla_attention.cu) ----------------------------------------------
// entries [T, D] (BF16/F32), slots [T] I64, cache [pages, P, D] BF16.
void cache_write(CudaContext& ctx, const Tensor& entries, const Tensor& slots, Tensor& cache);
// Ops::mla_cache_write in one kernel.
void mla_cache_write(CudaContext& ctx, const Tensor& ckv, int64_t latent, const Tensor& norm_w, float eps,
                     const Tensor& slots, Tensor& cache);
// Ops::mla_write_and_absorb in one kernel (mla_write_absorb.cu), where mla_absorb_queries_applies(q, w_uk).
Tensor mla_write_and_absorb(CudaContext& ctx, const Tensor& ckv, int64_t latent, const Tensor& norm_w,
                            float eps, const Tensor& slots, Tensor& cache, const Tensor& q,
                            const Tensor& w_uk);
// q [T, H, D] (BF16/F32), cache [pages, P, D] BF16 -> out [T, H, v_dim] F32, stats [T, H, 2] F32.
void mla_attention(CudaContext& ctx, const Tensor& q, const Tensor& cache, const Tensor& page_table,
                   const MlaBatch& seqs, const Tensor& kv_len, float scale, int64_t v_dim, Tensor& out,
                   Tensor& stats);
// parts [R, T, H, V] F32, stats [R, T, H, 2] F32 -> [T, H, V] F32.
Tensor lse_combine(CudaContext& ctx, const Tensor& parts, const Tensor& stats);
// --- MLA, expanded form (mla_expanded.cu) -----------------------------------------------------------------
// cache [pages, P, D] BF16 -> [count, D] BF16.
Tensor mla_gather_keys(CudaContext& ctx, const Tensor& cache, const Tensor& page_table, const MlaSeq& seq,
                       int64_t key_begin, int64_t count);
// q [T, H, nope + R] (BF16/F32), k_nope [N, H, nope], v [N, H, V], keys [N, L + R] BF16 -> out [T, H, V]
// F32, stats [T, H, 2] F32 (nope + R <= 192, V <= 128).
void mla_expanded_attention(CudaContext& ctx, const Tensor& q, const Tensor& k_nope, const Tensor& v,
                            const Tensor& keys, int64_t latent, const Tensor& kv_len, int64_t key_begin,
                            float scale, bool merge, Tensor& out, Tensor& stats);

// --- MoE (moe_route.cu, moe_experts.cu) ------------------------------------------------------------------
// x [T, D] (BF16/F32), w [E, D] (BF16/F32), bias [E] (F32/BF16) -> idx [T, k] I32, weights [T, k] F32.
void moe_route(CudaContext& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const RouterParams& p,
               Tensor& idx, Tensor& weights);
// x [T, D] (BF16/F32); experts BF16 (or F32) dense, or MXFP4 U8 codes + scales -> [T, D] F32, plus
// `addend` [T, D] (BF16/F32) when given (Ops::moe_experts_add).
Tensor moe_experts(CudaContext& ctx, const Tensor& x, const Tensor& idx, const Tensor& weights,
                   const ExpertWeights& experts, int64_t expert_begin, const ActivationParams& act,
                   const Tensor* addend = nullptr);

// --- sampling (sampling.cu) ------------------------------------------------------------------------------
// logits [R, V] F32 on the device -> host ids (the same draws as ops/cpu/sampling.cc).
std::vector<int32_t> sample(CudaContext& ctx, const Tensor& logits, const std::vector<SampleParams>& rows);

}  // namespace hlm::cuda
