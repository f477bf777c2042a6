// PLACEHOLDER while the kernels are written on their own branch; replaced before landing.
#include "ops/cuda/cuda_kernels.h"

namespace hlm::cuda {

void cache_write(CudaContext& ctx, const Tensor& entries, const Tensor& slots, Tensor& cache) {
  HLM_FAIL("CUDA cache_write: not built yet");
}

void mla_attention(CudaContext& ctx, const Tensor& q, const Tensor& cache, const Tensor& page_table, const MlaBatch& seqs, const Tensor& kv_len, float scale, int64_t v_dim, Tensor& out, Tensor& stats) {
  HLM_FAIL("CUDA mla_attention: not built yet");
}

Tensor lse_combine(CudaContext& ctx, const Tensor& parts, const Tensor& stats) {
  HLM_FAIL("CUDA lse_combine: not built yet");
}

}  // namespace hlm::cuda
