// Check macros for CUDA runtime calls and kernel launches (the TensorRT-LLM habit): a failure throws
// hlm::Error with the call, the error string and the source location, so a bad launch surfaces where it
// happened instead of as a later, unrelated failure. In base/ because both the CUDA ops (ops/cuda/) and
// the GPU collectives (parallel/cuda/) use them; include only from code built with the CUDA toolkit.
#pragma once

#include <cuda_runtime.h>

#include "base/error.h"

#define HLM_CUDA_CHECK(call)                                                     \
  do {                                                                           \
    const cudaError_t hlm_err_ = (call);                                         \
    if (hlm_err_ != cudaSuccess) [[unlikely]] {                                  \
      HLM_FAIL("CUDA error in {}: {} ({})", #call, cudaGetErrorString(hlm_err_), \
               static_cast<int>(hlm_err_));                                      \
    }                                                                            \
  } while (0)

// After a <<<...>>> launch: reports an invalid configuration or a missing kernel image at the launch.
#define HLM_CHECK_LAUNCH(name)                                                              \
  do {                                                                                      \
    const cudaError_t hlm_err_ = cudaGetLastError();                                        \
    if (hlm_err_ != cudaSuccess) [[unlikely]] {                                             \
      HLM_FAIL("CUDA kernel launch {} failed: {} ({})", name, cudaGetErrorString(hlm_err_), \
               static_cast<int>(hlm_err_));                                                 \
    }                                                                                       \
  } while (0)
