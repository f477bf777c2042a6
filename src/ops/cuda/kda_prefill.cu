// PLACEHOLDER while the kernels are written on their own branch; replaced before landing.
#include "ops/cuda/cuda_kernels.h"

namespace hlm::cuda {

Tensor kda_prefill(CudaContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, const SeqBatch& seqs, Tensor& state) {
  HLM_FAIL("CUDA kda_prefill: not built yet");
}

}  // namespace hlm::cuda
