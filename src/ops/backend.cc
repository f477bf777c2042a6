#include "ops/backend.h"

#include <omp.h>

#include <cblas.h>

#include "base/error.h"
#include "ops/cpu/cpu_ops.h"
#if HLM_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace hlm {

bool cuda_built() { return HLM_HAVE_CUDA != 0; }

DType held_weight_dtype(Device device, DType stored) {
  if (device == Device::kCpu) return stored == DType::kBF16 || stored == DType::kF16 ? DType::kF32 : stored;
  return stored == DType::kF16 ? DType::kBF16 : stored;
}

int cuda_device_count(std::string* why) {
#if HLM_HAVE_CUDA
  return cuda::device_count(why);
#else
  if (why != nullptr)
    *why = "this helixlm was built without the CUDA backend (nvcc was not found at build time)";
  return 0;
#endif
}

Device resolve_device(DeviceChoice choice) {
  if (choice == DeviceChoice::kCpu) return Device::kCpu;
  std::string why;
  const int gpus = cuda_device_count(&why);
  if (choice == DeviceChoice::kAuto) return gpus > 0 ? Device::kCuda : Device::kCpu;
  HLM_CHECK(gpus > 0, "--device cuda: no usable GPU: {}", why);
  return Device::kCuda;
}

std::unique_ptr<Ops> make_ops(Device device, const BackendOptions& o) {
  if (device == Device::kCuda) {
#if HLM_HAVE_CUDA
    return cuda::make_cuda_ops(o.cuda_device);
#else
    HLM_FAIL("the CUDA backend is not part of this build (nvcc was not found at build time)");
#endif
  }
  if (o.cpu_threads > 0) {
    omp_set_num_threads(o.cpu_threads);
    openblas_set_num_threads(o.cpu_threads);
  }
  return make_cpu_ops();
}

}  // namespace hlm
