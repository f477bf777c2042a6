// Check macros for CUDA runtime and cuBLAS calls and kernel launches (the TensorRT-LLM habit): a failure
// throws hlm::Error with the call, the error string and the source location, so a bad launch surfaces
// where it happened instead of as a later, unrelated failure.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
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

#define HLM_CUBLAS_CHECK(call)                                                       \
  do {                                                                               \
    const cublasStatus_t hlm_st_ = (call);                                           \
    if (hlm_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                             \
      HLM_FAIL("cuBLAS error in {}: {} ({})", #call, cublasGetStatusString(hlm_st_), \
               static_cast<int>(hlm_st_));                                           \
    }                                                                                \
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
