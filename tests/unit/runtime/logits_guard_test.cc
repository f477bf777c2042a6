// The per-step logits guard. Regression (issue 12): a non-finite logits row was sampled (argmax of NaNs
// is 0), so a broken model printed 0,0,0,... and exited 0.
#include "runtime/logits_guard.h"

#include <gtest/gtest.h>

#include <cmath>

namespace hlm {
namespace {

TEST(LogitsGuard, FiniteRowsPassAndNonFiniteRowsAreNamed) {
  Tensor row = Tensor::from_vector({5}, {0.5f, -3.0f, 1e30f, -1e30f, 0.0f});
  EXPECT_EQ(non_finite_logits(row), "");
  row.data<float>()[3] = NAN;
  EXPECT_EQ(non_finite_logits(row), "logit 3 of 5 is NaN");
  row.data<float>()[1] = -INFINITY;
  EXPECT_EQ(non_finite_logits(row), "logit 1 of 5 is Inf (and 1 more non-finite)");
}

}  // namespace
}  // namespace hlm
