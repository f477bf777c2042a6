#include "ops/ops.h"

namespace hlm {

Tensor Ops::upload(const Tensor& host) {
  const bool index = host.dtype() == DType::kI32 || host.dtype() == DType::kI64 || host.dtype() == DType::kU8;
  Tensor t = empty(host.shape(), index ? host.dtype() : weight_dtype(host.dtype()));
  upload_into(host, t);
  return t;
}

void check_router_params(const RouterParams& p, int64_t experts, const char* op) {
  const int64_t groups = p.num_expert_group;
  HLM_CHECK(groups >= 1 && experts % groups == 0 && experts / groups >= 2,
            "{}: num_expert_group {} must divide the {} experts into groups of at least 2", op, groups,
            experts);
  const int64_t per_group = experts / groups;
  HLM_CHECK(p.topk_group >= 1 && p.topk_group <= groups, "{}: topk_group {} must be in [1, {}]", op,
            p.topk_group, groups);
  HLM_CHECK(p.top_k >= 1 && p.top_k <= p.topk_group * per_group,
            "{}: top_k {} must be in [1, {}] (topk_group {} groups of {} experts)", op, p.top_k,
            p.topk_group * per_group, p.topk_group, per_group);
}

}  // namespace hlm
