// The per-step guard on logits: a row holding a NaN or an Inf is a failed step for that sequence, never a
// token (argmax over NaNs is index 0, so a broken model would otherwise print 0,0,0,... and exit 0). A
// front end fails that sequence (the CLI reports the prompt, the server fails the request) and lets the
// others go on. The GPU sampler applies the same rule.
#pragma once

#include <string>

#include "base/tensor.h"

namespace hlm {

// Empty when every value of `row` (host F32 [vocab]) is finite; otherwise what is wrong, e.g.
// "logit 17 of 512 is NaN (and 511 more non-finite)".
std::string non_finite_logits(const Tensor& row);

}  // namespace hlm
