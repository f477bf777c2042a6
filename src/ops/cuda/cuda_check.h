// Check macros of the CUDA backend: the CUDA runtime ones (base/cuda_check.h) plus cuBLAS, each throwing
// hlm::Error with the call, the error string and the source location.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "base/cuda_check.h"

#define HLM_CUBLAS_CHECK(call)                                                       \
  do {                                                                               \
    const cublasStatus_t hlm_st_ = (call);                                           \
    if (hlm_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                             \
      HLM_FAIL("cuBLAS error in {}: {} ({})", #call, cublasGetStatusString(hlm_st_), \
               static_cast<int>(hlm_st_));                                           \
    }                                                                                \
  } while (0)
