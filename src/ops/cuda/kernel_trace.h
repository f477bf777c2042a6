// Kernel timestamps from CUPTI's activity API (concurrent-kernel records: start, end, stream, grid), for
// `bench --kernel-trace` on machines without a timeline profiler. libcupti is loaded at run time (dlopen) on
// first use, so helixlm neither links it nor needs it unless a trace is asked for.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/kernel_timeline.h"

namespace hlm::cuda {

class KernelTrace {
 public:
  // The process's tracer (CUPTI keeps one set of activity callbacks per process); throws naming the
  // library and the reason when CUPTI cannot be loaded or was not compiled in.
  static KernelTrace& get();
  // Records every kernel that starts from now until stop(), which flushes CUPTI's buffers (after the
  // device has finished) and returns the records in the order CUPTI delivered them.
  void start();
  std::vector<KernelSpan> stop();

  struct Api;

 private:
  explicit KernelTrace(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
  bool running_ = false;
};

}  // namespace hlm::cuda
