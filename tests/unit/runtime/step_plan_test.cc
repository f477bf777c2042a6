#include "runtime/step_plan.h"

#include <gtest/gtest.h>

#include "base/error.h"

namespace hlm {
namespace {

TEST(StepPlan, RoundTrips) {
  StepPlan p;
  p.entries.push_back(StepEntry{3, true, false, {1, 2, 3}});
  p.entries.push_back(StepEntry{-9, false, true, {}});
  p.release = {4, 5};
  const StepPlan q = StepPlan::deserialize(p.serialize());
  ASSERT_EQ(q.entries.size(), 2u);
  EXPECT_EQ(q.entries[0].seq_id, 3);
  EXPECT_TRUE(q.entries[0].is_new);
  EXPECT_EQ(q.entries[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(q.entries[1].all_logits);
  EXPECT_EQ(q.release, (std::vector<int64_t>{4, 5}));
  EXPECT_FALSE(q.stop);
}

TEST(StepPlan, RejectsTruncatedMessages) {
  StepPlan p;
  p.entries.push_back(StepEntry{1, false, false, {7}});
  std::string bytes = p.serialize();
  bytes.pop_back();
  EXPECT_THROW(StepPlan::deserialize(bytes), Error);
  EXPECT_THROW(StepPlan::deserialize(bytes + "xx"), Error);
}

}  // namespace
}  // namespace hlm
