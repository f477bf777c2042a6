#include "ops/ops.h"

namespace hlm {

Tensor Ops::upload(const Tensor& host) {
  const bool index = host.dtype() == DType::kI32 || host.dtype() == DType::kI64 || host.dtype() == DType::kU8;
  Tensor t = empty(host.shape(), index ? host.dtype() : weight_dtype(host.dtype()));
  upload_into(host, t);
  return t;
}

}  // namespace hlm
