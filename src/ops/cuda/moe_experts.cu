// PLACEHOLDER while the kernels are written on their own branch; replaced before landing.
#include "ops/cuda/cuda_kernels.h"

namespace hlm::cuda {

Tensor moe_experts(CudaContext& ctx, const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertWeights& experts, int64_t expert_begin, const ActivationParams& act) {
  HLM_FAIL("CUDA moe_experts: not built yet");
}

}  // namespace hlm::cuda
