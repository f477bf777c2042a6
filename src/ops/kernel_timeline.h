// A device kernel timeline (`bench --kernel-trace`): the kernels a backend ran in a window, with their start
// and end times, summarized as the step's span, the time at least one kernel was running (busy) and the
// time none was (idle: launch latencies, dependency waits, host work), with the longest idle gaps and the
// kernels around them; and written as a Chrome trace (chrome://tracing, ui.perfetto.dev). The summary is
// what a device timeline profiler would show for a decode step, for machines where none runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hlm {

struct KernelSpan {
  std::string name;  // as the backend reports it (CUDA: the mangled symbol)
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t stream = 0;
  std::string grid, block;  // "x,y,z"
};

struct TimelineGap {
  double us = 0;
  std::string before, after;  // the kernel that ended last before the gap, and the one that starts it
};

// One kind of kernel (by short_kernel_name) in the window: its calls, their summed durations, and the time
// they extend the timeline: taken in order of their ends, a kernel's end minus the later of its start and
// the latest end before it. With programmatic dependent launch a kernel starts while the one before it
// runs (its CTAs wait on the dependency), so durations overlap and the idle gaps shrink to nothing; the
// extensions still add up to the busy time, and say which kernels the step's time goes to.
struct KernelShare {
  std::string name;
  size_t calls = 0;
  double kernel_us = 0, extend_us = 0;
};

struct TimelineSummary {
  size_t kernels = 0;
  double span_us = 0;                     // first start to last end
  double busy_us = 0;                     // covered by at least one kernel
  double kernel_sum_us = 0;               // Σ durations (more than busy where kernels overlap)
  std::vector<TimelineGap> longest_gaps;  // the idle gaps, longest first
  std::vector<KernelShare> shares;        // every kind of kernel, largest extension first
};

// The summary of `spans` (any order), keeping the `top` longest gaps.
TimelineSummary summarize_timeline(std::vector<KernelSpan> spans, size_t top);
// Chrome trace events: one complete ("X") event per kernel, its stream as the thread, times in µs from
// the first start.
nlohmann::json chrome_trace(const std::vector<KernelSpan>& spans);
// A readable kernel name: demangled, without the argument list, and without the namespaces and template
// arguments ("hlm::cuda::(anonymous namespace)::skinny_gemm_kernel<16, 1, ...>(...)" ->
// "skinny_gemm_kernel").
std::string short_kernel_name(const std::string& mangled);
// Writes chrome_trace(spans) to `path` and logs summarize_timeline's figures (info level).
void write_kernel_trace(const std::string& path, const std::vector<KernelSpan>& spans);

}  // namespace hlm
