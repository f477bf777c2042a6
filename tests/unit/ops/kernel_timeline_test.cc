// The kernel timeline summary of `bench --kernel-trace` (kernel_timeline.h): busy time as the union of
// overlapping kernels, idle gaps with the kernels around them, the Chrome trace, and readable names.
#include "ops/kernel_timeline.h"

#include <gtest/gtest.h>

namespace hlm {
namespace {

KernelSpan span(const char* name, uint64_t start, uint64_t end, uint32_t stream = 7) {
  return KernelSpan{name, start, end, stream, "1,1,1", "32,1,1"};
}

TEST(KernelTimeline, BusyIsTheUnionAndGapsAreWhereNoKernelRuns) {
  // a [1000, 3000), b [2000, 5000) on another stream (overlapping a), c [5000, 6000) right after b, d
  // [8000, 8500) after a 2 µs gap, e [9000, 9100) after a 0.5 µs gap; given out of order.
  const std::vector<KernelSpan> spans = {span("e", 9000, 9100), span("a", 1000, 3000), span("d", 8000, 8500),
                                         span("b", 2000, 5000, 8), span("c", 5000, 6000)};
  const TimelineSummary s = summarize_timeline(spans, 8);
  EXPECT_EQ(s.kernels, 5u);
  EXPECT_DOUBLE_EQ(s.span_us, 8.1);
  EXPECT_DOUBLE_EQ(s.busy_us, 5.0 + 0.5 + 0.1);  // [1000, 6000) + d + e
  EXPECT_DOUBLE_EQ(s.kernel_sum_us, 2.0 + 3.0 + 1.0 + 0.5 + 0.1);
  ASSERT_EQ(s.longest_gaps.size(), 2u);
  EXPECT_DOUBLE_EQ(s.longest_gaps[0].us, 2.0);
  EXPECT_EQ(s.longest_gaps[0].before, "c");
  EXPECT_EQ(s.longest_gaps[0].after, "d");
  EXPECT_DOUBLE_EQ(s.longest_gaps[1].us, 0.5);
  EXPECT_EQ(s.longest_gaps[1].before, "d");
  EXPECT_EQ(s.longest_gaps[1].after, "e");
  EXPECT_EQ(summarize_timeline(spans, 1).longest_gaps.size(), 1u);
  // In order of their ends: a extends [1000, 3000), b [3000, 5000), c [5000, 6000), d and e their own.
  ASSERT_EQ(s.shares.size(), 5u);
  EXPECT_EQ(s.shares[0].name, "a");  // 2.0, before b's equal 2.0 (a stable order of names)
  EXPECT_DOUBLE_EQ(s.shares[0].extend_us, 2.0);
  EXPECT_EQ(s.shares[1].name, "b");
  EXPECT_DOUBLE_EQ(s.shares[1].extend_us, 2.0);
  EXPECT_DOUBLE_EQ(s.shares[1].kernel_us, 3.0);
  EXPECT_EQ(s.shares[2].name, "c");
  double extended = 0;
  for (const KernelShare& k : s.shares) extended += k.extend_us;
  EXPECT_DOUBLE_EQ(extended, s.busy_us);
}

TEST(KernelTimeline, EarlyLaunchedKernelsShareTheStepByWhatTheyExtend) {
  // Programmatic dependent launch: each kernel starts while the one before runs and ends after it. x runs
  // [0, 4000), y starts at 1000 and ends at 5000, y again [4500, 9000): the step is 9 µs of which x takes 4,
  // y 1 + 4 in two calls, though y's calls ran 8.5 µs.
  const TimelineSummary s =
      summarize_timeline({span("x", 0, 4000), span("y", 1000, 5000), span("y", 4500, 9000)}, 4);
  EXPECT_TRUE(s.longest_gaps.empty());
  ASSERT_EQ(s.shares.size(), 2u);
  EXPECT_EQ(s.shares[0].name, "y");
  EXPECT_EQ(s.shares[0].calls, 2u);
  EXPECT_DOUBLE_EQ(s.shares[0].extend_us, 5.0);
  EXPECT_DOUBLE_EQ(s.shares[0].kernel_us, 8.5);
  EXPECT_DOUBLE_EQ(s.shares[1].extend_us, 4.0);
}

TEST(KernelTimeline, AGapFollowsTheKernelThatEndsLast) {
  // a long kernel covers a short one that ends first: the gap after both is a's.
  const TimelineSummary s =
      summarize_timeline({span("a", 0, 10000), span("b", 1000, 2000), span("c", 12000, 13000)}, 4);
  EXPECT_DOUBLE_EQ(s.busy_us, 11.0);
  ASSERT_EQ(s.longest_gaps.size(), 1u);
  EXPECT_EQ(s.longest_gaps[0].before, "a");
  EXPECT_DOUBLE_EQ(s.longest_gaps[0].us, 2.0);
}

TEST(KernelTimeline, EmptyTimeline) {
  const TimelineSummary s = summarize_timeline({}, 4);
  EXPECT_EQ(s.kernels, 0u);
  EXPECT_EQ(s.busy_us, 0.0);
  EXPECT_TRUE(s.longest_gaps.empty());
}

TEST(KernelTimeline, ChromeTraceHasOneCompleteEventPerKernel) {
  const nlohmann::json t = chrome_trace({span("b", 3500, 4000, 9), span("a", 1500, 2500)});
  ASSERT_EQ(t["traceEvents"].size(), 2u);
  const nlohmann::json& b = t["traceEvents"][0];
  EXPECT_EQ(b["name"], "b");
  EXPECT_EQ(b["ph"], "X");
  EXPECT_EQ(b["tid"], 9);
  EXPECT_DOUBLE_EQ(b["ts"].get<double>(), 2.0);  // µs after the first start
  EXPECT_DOUBLE_EQ(b["dur"].get<double>(), 0.5);
  EXPECT_EQ(b["args"]["grid"], "1,1,1");
  EXPECT_DOUBLE_EQ(t["traceEvents"][1]["ts"].get<double>(), 0.0);
}

TEST(KernelTimeline, ShortNamesDropNamespacesTemplatesAndArguments) {
  // void hlm::cuda::(anonymous namespace)::skinny_gemm_kernel<16, 1, 1, __nv_bfloat16, float, false,
  // false>(hlm::cuda::(anonymous namespace)::SkinnyGemmParams), as nvcc mangles it.
  EXPECT_EQ(short_kernel_name("_ZN3hlm4cuda47_GLOBAL__N__926e24ee_14_skinny_gemm_cu_f93f10d418skinny_gemm_"
                              "kernelILi16ELi1ELi1E13__nv_bfloat16fLb0ELb0EEEvNS1_16SkinnyGemmParamsE"),
            "skinny_gemm_kernel");
  EXPECT_EQ(short_kernel_name("_Z10plain_funcPf"), "plain_func");  // void plain_func(float*)
  EXPECT_EQ(short_kernel_name("_ZN2ns3fooIiEEvi"), "foo");         // void ns::foo<int>(int)
  EXPECT_EQ(short_kernel_name("not_mangled"), "not_mangled");
}

}  // namespace
}  // namespace hlm
