// Dense GEMMs through cuBLASLt: `linear` (x·wᵀ, the projections and lm_head) and `head_matmul` (one small
// GEMM per head, as a strided batch: MLA's W_UK absorption and W_UV). Decode-size linears and per-head
// products (T <= 16 tokens, BF16 weights) go to the weight-streaming kernels of skinny_gemm.cu instead.
// Row-major tensors are handed to cuBLASLt as their column-major transposes, so y = x·wᵀ becomes yᵀ = w·xᵀ
// with w's buffer read transposed. Inputs are converted to the weight's dtype (BF16, or F32 for an F32-stored
// weight), the accumulation is fp32, and plans (layouts + the heuristic's algorithm) are cached per shape so
// a decode step asks the heuristic nothing after its first run — which also keeps graph capture free of host
// work that could differ between runs.
#include <map>
#include <mutex>
#include <tuple>

#include "ops/cuda/cuda_kernels.h"

namespace hlm::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      HLM_FAIL("GEMM: unsupported dtype {}", dtype_name(t));
  }
}

// C[m, n] (col-major, ldc) = op(A)[m, k] · B[k, n], batched with strides; A is [k, m] read transposed when
// trans_a, else [m, k].
struct GemmShape {
  bool trans_a = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  DType ab = DType::kBF16, c = DType::kBF16;
  auto key() const {
    return std::make_tuple(trans_a, m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c,
                           static_cast<int>(ab), static_cast<int>(c));
  }
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

cublasLtMatrixLayout_t make_layout(DType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  HLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_type(t), static_cast<uint64_t>(rows),
                                              static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    HLM_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    HLM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof(stride)));
  }
  return l;
}

const GemmPlan& plan_for(CudaContext& ctx, const GemmShape& s) {
  static std::mutex mu;
  static std::map<decltype(s.key()), GemmPlan> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(s.key());
  if (it != plans.end()) return it->second;
  GemmPlan p;
  HLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  HLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  HLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  p.a = s.trans_a ? make_layout(s.ab, s.k, s.m, s.lda, s.batch, s.stride_a)
                  : make_layout(s.ab, s.m, s.k, s.lda, s.batch, s.stride_a);
  p.b = make_layout(s.ab, s.k, s.n, s.ldb, s.batch, s.stride_b);
  p.c = make_layout(s.c, s.m, s.n, s.ldc, s.batch, s.stride_c);
  cublasLtMatmulPreference_t pref = nullptr;
  HLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = ctx.gemm_workspace_bytes();
  HLM_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Plans are reused for any pointers of the shape; 16 bytes is what every operand here guarantees.
  const uint32_t align = 16;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    HLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  HLM_CUBLAS_CHECK(
      cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt(), p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  HLM_CHECK(found > 0, "cuBLASLt has no algorithm for a {}x{}x{} GEMM ({} x {} -> {})", s.m, s.n, s.k,
            dtype_name(s.ab), dtype_name(s.ab), dtype_name(s.c));
  p.algo = result.algo;
  return plans.emplace(s.key(), p).first->second;
}

void run_gemm(CudaContext& ctx, const GemmShape& s, const void* a, const void* b, void* c) {
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    // An empty reduction: C = 0 (cuBLASLt rejects k = 0).
    HLM_CHECK(s.batch == 1 && s.ldc == s.m, "GEMM with k = 0 on a strided output");
    HLM_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(s.m * s.n) * dtype_size(s.c), ctx.stream()));
    return;
  }
  const GemmPlan& p = plan_for(ctx, s);
  const float alpha = 1.0f, beta = 0.0f;
  HLM_CUBLAS_CHECK(cublasLtMatmul(ctx.cublaslt(), p.desc, &alpha, a, p.a, b, p.b, &beta, c, p.c, c, p.c,
                                  &p.algo, ctx.gemm_workspace(), ctx.gemm_workspace_bytes(), ctx.stream()));
}

// x in the GEMM's operand dtype: as is, or converted into step scratch.
Tensor as_operand(CudaContext& ctx, const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor y = ctx.empty(x.shape(), dtype);
  convert(ctx, x, y);
  return y;
}

}  // namespace

Tensor linear(CudaContext& ctx, const Tensor& x, const Tensor& w, bool f32_out) {
  expect_cuda(x, "linear", "x", {DType::kBF16, DType::kF32}, 2, "[T, in]");
  expect_cuda(w, "linear", "w", {DType::kBF16, DType::kF32}, 2, "[out, in]");
  expect_dim(w, 1, x.dim(1), "linear", "w [out, in]", "the input width of x [T, in]");
  const int64_t t = x.dim(0), in = x.dim(1), out = w.dim(0);
  Tensor y =
      ctx.empty({t, out}, f32_out || w.dtype() == DType::kF32 ? DType::kF32 : DType::kBF16);  // [T, out]
  if (skinny_gemm_applies(x, w)) {
    skinny_gemm(ctx, x, w, y);
    return y;
  }
  const Tensor xa = as_operand(ctx, x, w.dtype());
  GemmShape s;
  s.trans_a = true;
  s.m = out;
  s.n = t;
  s.k = in;
  s.lda = in;
  s.ldb = in;
  s.ldc = out;
  s.ab = w.dtype();
  s.c = y.dtype();
  run_gemm(ctx, s, w.raw(), xa.raw(), y.raw());
  return y;
}

Tensor linear_glu(CudaContext& ctx, const Tensor& x, const Tensor& gate_up, const ActivationParams& act) {
  expect_cuda(x, "linear_glu", "x", {DType::kBF16, DType::kF32}, 2, "[T, in]");
  expect_cuda(gate_up, "linear_glu", "gate_up", {DType::kBF16, DType::kF32}, 2, "[2I, in]");
  expect_dim(gate_up, 1, x.dim(1), "linear_glu", "gate_up [2I, in]", "the input width of x [T, in]");
  HLM_CHECK(gate_up.dim(0) % 2 == 0, "linear_glu: gate_up must stack [2I, in] gate and up rows, got {}",
            gate_up.describe());
  if (!skinny_gemm_applies(x, gate_up)) return glu_packed(ctx, linear(ctx, x, gate_up, false), act);
  Tensor y = ctx.empty({x.dim(0), gate_up.dim(0) / 2}, DType::kBF16);  // [T, I]
  skinny_gemm_glu(ctx, x, gate_up, act, y);
  return y;
}

Tensor head_matmul(CudaContext& ctx, const Tensor& x, const Tensor& w, bool w_transposed) {
  expect_cuda(x, "head_matmul", "x", {DType::kBF16, DType::kF32}, 3, "[T, H, a]");
  expect_cuda(w, "head_matmul", "w", {DType::kBF16, DType::kF32}, 3,
              w_transposed ? "[H, b, a]" : "[H, a, b]");
  expect_dim(w, 0, x.dim(1), "head_matmul", "w", "the head count of x [T, H, a]");
  expect_dim(w, w_transposed ? 2 : 1, x.dim(2), "head_matmul", "w", "the last dimension of x [T, H, a]");
  const int64_t t = x.dim(0), heads = x.dim(1), a = x.dim(2), b = w_transposed ? w.dim(1) : w.dim(2);
  Tensor y = ctx.empty({t, heads, b}, w.dtype() == DType::kF32 ? DType::kF32 : DType::kBF16);  // [T, H, b]
  if (head_gemv_applies(x, w, w_transposed)) {
    head_gemv(ctx, x, w, w_transposed, y);
    return y;
  }
  const Tensor xa = as_operand(ctx, x, w.dtype());
  // Per head h: yᵀ[b, T] (ld H·b) = w_hᵀ[b, a] · x_hᵀ[a, T] (ld H·a).
  GemmShape s;
  s.trans_a = w_transposed;
  s.m = b;
  s.n = t;
  s.k = a;
  s.lda = w_transposed ? a : b;
  s.ldb = heads * a;
  s.ldc = heads * b;
  s.batch = heads;
  s.stride_a = a * b;
  s.stride_b = a;
  s.stride_c = b;
  s.ab = w.dtype();
  s.c = y.dtype();
  if (heads == 1) s.batch = 1;
  run_gemm(ctx, s, w.raw(), xa.raw(), y.raw());
  return y;
}

}  // namespace hlm::cuda
