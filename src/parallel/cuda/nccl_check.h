// HLM_NCCL_CHECK: throws hlm::Error with the call, NCCL's error string and its last error message, and
// the source location, like the CUDA and MPI check macros.
#pragma once

#include <nccl.h>

#include <string>

#include "base/error.h"

#define HLM_NCCL_CHECK(call)                                                            \
  do {                                                                                  \
    const ncclResult_t hlm_nccl_rc_ = (call);                                           \
    if (hlm_nccl_rc_ != ncclSuccess) [[unlikely]] {                                     \
      HLM_FAIL("NCCL call {} failed: {} ({})", #call, ncclGetErrorString(hlm_nccl_rc_), \
               std::string(ncclGetLastError(nullptr)));                                 \
    }                                                                                   \
  } while (0)
