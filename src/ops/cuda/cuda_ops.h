// The CUDA backend (sm_90a): every op of ops/ops.h on one GPU, bf16 activations with fp32 accumulation,
// step scratch from an arena, and decode steps capturable as CUDA graphs.
#pragma once

#include <memory>
#include <string>

#include "ops/ops.h"

namespace hlm::cuda {

// Usable GPUs; 0 with the reason in `why`.
int device_count(std::string* why);
std::unique_ptr<Ops> make_cuda_ops(int device);

}  // namespace hlm::cuda
