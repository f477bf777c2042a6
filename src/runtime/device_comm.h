// The Comm a model on a given backend uses: on the CUDA backend with more than one rank, the GPU Comm
// (parallel/gpu_comm.h) bound to the backend's stream and step allocator; elsewhere the host Comm itself.
#pragma once

#include <memory>

#include "ops/ops.h"
#include "parallel/gpu_comm.h"

namespace hlm {

// The GPU Comm over `host` for a model on `ops`, or nullptr where `host` serves (CPU backend, one rank).
// `options`' stream and allocator are filled from `ops`, which must outlive the result. Collective.
std::unique_ptr<Comm> make_device_comm(Comm& host, const Mapping& mapping, Ops& ops,
                                       GpuCommOptions options = {});

}  // namespace hlm
