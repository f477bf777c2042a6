// Backend selection: which Ops implementation a run uses. The CUDA backend exists only in builds where
// nvcc was found (CMake option HLM_CUDA); a CPU-only build answers every CUDA question with the reason.
#pragma once

#include <memory>
#include <string>

#include "ops/ops.h"

namespace hlm {

enum class DeviceChoice { kCpu, kCuda, kAuto };

struct BackendOptions {
  int cuda_device = 0;  // GPU index (the local rank under mpirun)
  int cpu_threads = 0;  // OpenMP and OpenBLAS threads of the CPU backend; 0 leaves their defaults
};

// Whether this build has the CUDA backend.
bool cuda_built();
// Number of usable GPUs; 0 with the reason in `why` (no driver, no device, CPU-only build).
int cuda_device_count(std::string* why);
// The device a choice resolves to: kAuto is CUDA when a GPU is visible. A kCuda choice with no usable GPU
// is an error naming the reason.
Device resolve_device(DeviceChoice choice);
std::unique_ptr<Ops> make_ops(Device device, const BackendOptions& options);
// The dtype `device`'s backend keeps a weight stored as `stored` in (its Ops::weight_dtype, also for
// planning without a backend): the CPU holds 16-bit floats as F32, a GPU holds F16 as BF16, the rest
// stays as stored.
DType held_weight_dtype(Device device, DType stored);

}  // namespace hlm
