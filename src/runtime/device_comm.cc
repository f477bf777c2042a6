#include "runtime/device_comm.h"

namespace hlm {

std::unique_ptr<Comm> make_device_comm(Comm& host, const Mapping& mapping, Ops& ops, GpuCommOptions options) {
  if (ops.device() != Device::kCuda || host.size() == 1) return nullptr;
#if HLM_HAVE_CUDA
  options.stream = ops.native_stream();
  options.empty = [&ops](const Shape& shape, DType dtype) { return ops.empty(shape, dtype); };
  return make_gpu_comm(host, mapping, options);
#else
  HLM_FAIL("the GPU Comm is not part of this build (nvcc was not found at build time)");
#endif
}

}  // namespace hlm
