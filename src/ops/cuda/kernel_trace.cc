#include "ops/cuda/kernel_trace.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "base/error.h"
#include "ops/cuda/cuda_check.h"

#if HLM_HAVE_CUPTI
#include <cupti.h>
#endif

namespace hlm::cuda {

#if HLM_HAVE_CUPTI

namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kBufferAlign = 8;  // CUPTI's record alignment

// Records delivered by CUPTI's buffer callbacks, which run on CUPTI's thread.
std::mutex records_mutex;
std::vector<KernelSpan>* records = nullptr;

}  // namespace

struct KernelTrace::Api {
  void* lib = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  std::vector<KernelSpan> collected;

  void check(CUptiResult r, const char* what) const {
    if (r == CUPTI_SUCCESS) return;
    const char* text = "unknown error";
    if (result_string != nullptr) result_string(r, &text);
    HLM_FAIL("kernel trace: CUPTI {} failed: {}", what, text);
  }
};

namespace {

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

KernelTrace::Api* active_api = nullptr;

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(records_mutex);
  CUpti_Activity* record = nullptr;
  while (active_api != nullptr && active_api->next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    records->push_back(KernelSpan{k->name != nullptr ? k->name : "?", k->start, k->end, k->streamId,
                                  fmt::format("{},{},{}", k->gridX, k->gridY, k->gridZ),
                                  fmt::format("{},{},{}", k->blockX, k->blockY, k->blockZ)});
  }
  std::free(buffer);
}

template <class F>
F symbol(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  HLM_CHECK(p != nullptr, "kernel trace: libcupti has no symbol {}", name);
  return reinterpret_cast<F>(p);
}

}  // namespace

KernelTrace& KernelTrace::get() {
  static KernelTrace* trace = [] {
    auto api = std::make_unique<Api>();
    std::string errors;
    for (const char* name : {"libcupti.so.13", "libcupti.so"}) {
      api->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (api->lib != nullptr) break;
      errors += fmt::format("{}{}", errors.empty() ? "" : "; ", dlerror());
    }
    HLM_CHECK(
        api->lib != nullptr,
        "kernel trace: libcupti (CUDA's profiling library, in the toolkit's lib64 or extras/CUPTI/lib64) "
        "could not be loaded: {}; add its directory to LD_LIBRARY_PATH",
        errors);
    api->enable = symbol<decltype(api->enable)>(api->lib, "cuptiActivityEnable");
    api->disable = symbol<decltype(api->disable)>(api->lib, "cuptiActivityDisable");
    api->flush_all = symbol<decltype(api->flush_all)>(api->lib, "cuptiActivityFlushAll");
    api->next_record = symbol<decltype(api->next_record)>(api->lib, "cuptiActivityGetNextRecord");
    api->register_callbacks =
        symbol<decltype(api->register_callbacks)>(api->lib, "cuptiActivityRegisterCallbacks");
    api->result_string = symbol<decltype(api->result_string)>(api->lib, "cuptiGetResultString");
    api->check(api->register_callbacks(buffer_requested, buffer_completed), "buffer callbacks");
    return new KernelTrace(std::move(api));  // lives as long as the process: CUPTI keeps the callbacks
  }();
  return *trace;
}

KernelTrace::KernelTrace(std::unique_ptr<Api> api) : api_(std::move(api)) {}

void KernelTrace::start() {
  HLM_CHECK(!running_, "kernel trace: start() while a trace is running");
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    api_->collected.clear();
    records = &api_->collected;
    active_api = api_.get();
  }
  HLM_CUDA_CHECK(cudaDeviceSynchronize());
  api_->check(api_->enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
  running_ = true;
}

std::vector<KernelSpan> KernelTrace::stop() {
  HLM_CHECK(running_, "kernel trace: stop() without start()");
  running_ = false;
  HLM_CUDA_CHECK(cudaDeviceSynchronize());
  api_->check(api_->disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disabling kernel records");
  api_->check(api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flushing the records");
  std::lock_guard<std::mutex> lock(records_mutex);
  active_api = nullptr;
  records = nullptr;
  return std::move(api_->collected);
}

#else

struct KernelTrace::Api {};

KernelTrace& KernelTrace::get() {
  HLM_FAIL("kernel trace: this build has no CUPTI (its headers were not found with the CUDA toolkit)");
}
KernelTrace::KernelTrace(std::unique_ptr<Api> api) : api_(std::move(api)) {}
void KernelTrace::start() {}
std::vector<KernelSpan> KernelTrace::stop() { return {}; }

#endif

}  // namespace hlm::cuda
