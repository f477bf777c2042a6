// The CPU backend: the reference implementation of every op (fp32 math, OpenMP threads, OpenBLAS GEMMs).
#pragma once

#include <memory>

#include "ops/ops.h"

namespace hlm {

std::unique_ptr<Ops> make_cpu_ops();

}  // namespace hlm
