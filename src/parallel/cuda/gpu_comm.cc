// GpuComm (parallel/gpu_comm.h): NCCL communicators and LL16 peer-memory channels per group, one failure
// record for the channels' deadlines, and a watchdog for the case where the main thread cannot report.
//
// Which path a call takes depends only on the group, the dtype and the byte sizes, which every member
// shares, never on pointers or timing, so all members always enter the same kernel.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "base/cuda_check.h"
#include "base/log.h"
#include "parallel/cuda/ll_channel.h"
#include "parallel/cuda/nccl_check.h"
#include "parallel/gpu_comm.h"

namespace hlm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kGroups = 3;
// How long the watchdog leaves a recorded failure to the main thread before it reports it itself: the
// main thread may be blocked in a device synchronization behind an NCCL kernel waiting for the same peer.
constexpr auto kWatchdogGrace = std::chrono::seconds(10);

int index(CommGroup g) { return static_cast<int>(g); }
const char* const kGroupNames[kGroups] = {"world", "TP", "CP"};  // by CommGroup

// Written by the kernels, read by the host without a device synchronization (mapped pinned memory).
struct HostControl {
  volatile int code;            // the first failure (ll::ErrorState), 0 while none
  volatile int64_t timeout_ns;  // the deadline of one wait in a peer-memory collective
};

class GpuComm final : public Comm {
 public:
  GpuComm(Comm& host, const Mapping& mapping, const GpuCommOptions& options)
      : host_(host),
        mapping_(mapping),
        options_(options),
        stream_(static_cast<cudaStream_t>(options.stream)) {
    HLM_CHECK(stream_ != nullptr && options_.empty,
              "the GPU Comm needs the CUDA backend's stream and allocator");
    for (CommGroup g : {CommGroup::kWorld, CommGroup::kTp, CommGroup::kCp}) {
      sizes_[index(g)] = host_.group_size(g);
    }
    agree_on_thresholds();
    // NVLink multicast (NVLS) can take a shared host's GPUs out of service: never used. NCCL connects
    // eagerly, so that the memory plan after this sees what its buffers take (as TensorRT-LLM does).
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);

    void* control = nullptr;
    HLM_CUDA_CHECK(cudaHostAlloc(&control, sizeof(HostControl), cudaHostAllocMapped));
    control_ = new (control) HostControl{0, 0};
    HLM_CUDA_CHECK(cudaMalloc(&device_code_, sizeof(int)));
    HLM_CUDA_CHECK(cudaMemset(device_code_, 0, sizeof(int)));
    HLM_CUDA_CHECK(cudaDeviceSynchronize());  // the backend's stream does not wait for the legacy stream
    set_device_timeout(host_.timeout() > 0 ? host_.timeout() : 600);
    ll::ErrorState error{};
    error.device_code = device_code_;
    void* mapped = nullptr;
    HLM_CUDA_CHECK(cudaHostGetDevicePointer(&mapped, control, 0));
    auto* device_control = static_cast<HostControl*>(mapped);
    error.host_code = &device_control->code;
    error.timeout_ns = &device_control->timeout_ns;

    ncclUniqueId id{};
    if (host_.rank() == 0) HLM_NCCL_CHECK(ncclGetUniqueId(&id));
    std::string bytes(reinterpret_cast<const char*>(&id), sizeof id);
    host_.broadcast(bytes, 0);
    HLM_CHECK(bytes.size() == sizeof id, "NCCL unique id of {} bytes received, expected {}", bytes.size(),
              sizeof id);
    std::memcpy(&id, bytes.data(), sizeof id);
    HLM_NCCL_CHECK(ncclCommInitRank(&nccl_[index(CommGroup::kWorld)], host_.size(), id, host_.rank()));
    HLM_NCCL_CHECK(ncclCommSplit(nccl_[index(CommGroup::kWorld)], mapping.tp_rank(), mapping.cp_rank(),
                                 &nccl_[index(CommGroup::kCp)], nullptr));
    HLM_NCCL_CHECK(ncclCommSplit(nccl_[index(CommGroup::kWorld)], mapping.cp_rank(), mapping.tp_rank(),
                                 &nccl_[index(CommGroup::kTp)], nullptr));

    if (options_.ll_all_reduce_max_bytes > 0 || options_.ll_all_to_all_max_bytes > 0) {
      const ll::ChannelOptions co{options_.ll_slot_bytes, options_.ll_flag_period};
      for (CommGroup g : {CommGroup::kWorld, CommGroup::kTp, CommGroup::kCp}) {
        if (sizes_[index(g)] == 1) continue;
        ll_[index(g)] = ll::LlChannel::create(host_, g, co, error);
        HLM_CHECK(ll_[index(g)] != nullptr || !options_.require_peer_memory,
                  "GPU collectives over peer memory were required, but a member of the {} group cannot map "
                  "another's GPU memory (different hosts, no peer access, or CUDA IPC unavailable)",
                  kGroupNames[index(g)]);
      }
    }
    watchdog_ = std::thread([this] { watch(); });
  }

  ~GpuComm() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    for (auto& ch : ll_) ch.reset();
    // A normal end destroys the communicators (flushing their work; every rank does it at the same point);
    // while an error unwinds they are aborted, so that nothing waits for a peer.
    const bool failing = std::uncaught_exceptions() > 0;
    for (CommGroup g : {CommGroup::kTp, CommGroup::kCp, CommGroup::kWorld}) {
      ncclComm_t c = nccl_[index(g)];
      if (c == nullptr) continue;
      if (failing) {
        ncclCommAbort(c);
      } else {
        ncclCommDestroy(c);
      }
    }
    for (auto& [start, stop] : events_) {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
    cudaFree(device_code_);
    cudaFreeHost(const_cast<HostControl*>(control_));
  }

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  int group_size(CommGroup g) const override { return sizes_[index(g)]; }
  int group_rank(CommGroup g) const override { return host_.group_rank(g); }

  void all_reduce_sum(Tensor& t, CommGroup g) override {
    if (t.device() == Device::kCpu) return host_.all_reduce_sum(t, g);
    check();
    HLM_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16,
              "all_reduce_sum: expects an F32 or BF16 device tensor, got {}", t.describe());
    if (group_size(g) == 1 || t.numel() == 0) return;
    const Timed timed(*this);
    const auto bytes = static_cast<int64_t>(t.nbytes());
    ll::LlChannel* ch = ll_[index(g)].get();
    if (ch != nullptr && bytes <= options_.ll_all_reduce_max_bytes && bytes <= ch->slot_bytes()) {
      ch->all_reduce(t.raw(), t.raw(), bytes, t.dtype() == DType::kBF16, stream_);
      return;
    }
    HLM_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), t.numel(),
                                 t.dtype() == DType::kBF16 ? ncclBfloat16 : ncclFloat32, ncclSum,
                                 nccl_[index(g)], stream_));
  }

  Tensor all_gather(const Tensor& t, CommGroup g) override {
    if (t.device() == Device::kCpu) return host_.all_gather(t, g);
    check();
    const int n = group_size(g);
    Shape s = t.shape();
    s.insert(s.begin(), n);
    if (n == 1) return t.reshape(s);
    Tensor out = options_.empty(s, t.dtype());
    const Timed timed(*this);
    if (t.nbytes() > 0) {
      HLM_NCCL_CHECK(ncclAllGather(t.raw(), out.raw(), t.nbytes(), ncclInt8, nccl_[index(g)], stream_));
    }
    return out;
  }

  Tensor all_to_all(const Tensor& t, CommGroup g) override {
    if (t.device() == Device::kCpu) return host_.all_to_all(t, g);
    check();
    const int n = group_size(g);
    HLM_CHECK(t.rank() >= 1 && t.dim(0) == n,
              "all_to_all over {} ranks needs a leading dimension of {}, got {}", n, n, t.describe());
    if (n == 1) return t;
    Tensor out = options_.empty(t.shape(), t.dtype());
    const auto chunk = static_cast<int64_t>(t.nbytes() / n);
    if (chunk == 0) return out;
    const Timed timed(*this);
    ll::LlChannel* ch = ll_[index(g)].get();
    if (ch != nullptr && chunk <= options_.ll_all_to_all_max_bytes && chunk <= ch->slot_bytes()) {
      ch->all_to_all(t.raw(), out.raw(), chunk, stream_);
    } else {
      HLM_NCCL_CHECK(ncclAlltoAll(t.raw(), out.raw(), chunk, ncclInt8, nccl_[index(g)], stream_));
    }
    return out;
  }

  Tensor all_to_all_lse_combine(const Tensor& parts, const Tensor& stats, CommGroup g,
                                const LseCombine& combine) override {
    ll::LlChannel* ch = ll_[index(g)].get();
    const int n = group_size(g);
    const bool fused_layout = parts.device() == Device::kCuda && stats.device() == Device::kCuda &&
                              parts.dtype() == DType::kF32 && stats.dtype() == DType::kF32 &&
                              parts.rank() == 4 && parts.dim(0) == n && parts.dim(3) % 2 == 0 &&
                              stats.shape() == Shape{n, parts.dim(1), parts.dim(2), 2};
    if (ch == nullptr || !fused_layout) return Comm::all_to_all_lse_combine(parts, stats, g, combine);
    const int64_t rows = parts.dim(1) * parts.dim(2);
    const auto v_dim = static_cast<int>(parts.dim(3));
    const int64_t message = ll::combine_lines(rows, v_dim) * 8;
    if (message > options_.ll_all_to_all_max_bytes || message > ch->slot_bytes() || v_dim == 0) {
      return Comm::all_to_all_lse_combine(parts, stats, g, combine);
    }
    check();
    Tensor out = options_.empty({parts.dim(1), parts.dim(2), parts.dim(3)}, DType::kF32);
    const Timed timed(*this);
    ch->all_to_all_combine(static_cast<const float*>(parts.raw()), static_cast<const float*>(stats.raw()),
                           static_cast<float*>(out.raw()), rows, v_dim, stream_);
    return out;
  }

  void broadcast(std::string& bytes, int root) override {
    check();
    host_.broadcast(bytes, root);
  }

  void barrier() override {
    check();
    host_.barrier();
  }

  void set_timeout(double seconds) override {
    HLM_CHECK(seconds > 0, "--comm-timeout must be positive (got {})", seconds);
    host_.set_timeout(seconds);
    set_device_timeout(seconds);
  }
  double timeout() const override { return timeout_s_; }

  void check() override {
    const int code = control_->code;
    if (code == 0) return;
    claimed_ = true;
    HLM_FAIL("{}", describe(code));
  }

  void enable_timing(bool on) override { timing_ = on; }

  double take_collective_seconds() override {
    double seconds = 0;
    for (size_t i = 0; i < timed_; ++i) {
      HLM_CUDA_CHECK(cudaEventSynchronize(events_[i].second));
      float ms = 0;
      HLM_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i].first, events_[i].second));
      seconds += ms * 1e-3;
    }
    timed_ = 0;
    return seconds;
  }

 private:
  void set_device_timeout(double seconds) {
    timeout_s_ = seconds;
    control_->timeout_ns = static_cast<int64_t>(seconds * 1e9);
  }

  // Brackets one collective with events when timing is on and the stream is not being captured.
  class Timed {
   public:
    explicit Timed(GpuComm& c) : c_(c) {
      if (!c_.timing_) return;
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      HLM_CUDA_CHECK(cudaStreamIsCapturing(c_.stream_, &capture));
      if (capture != cudaStreamCaptureStatusNone) return;
      if (c_.timed_ == c_.events_.size()) {
        std::pair<cudaEvent_t, cudaEvent_t> e;
        HLM_CUDA_CHECK(cudaEventCreate(&e.first));
        HLM_CUDA_CHECK(cudaEventCreate(&e.second));
        c_.events_.push_back(e);
      }
      pair_ = &c_.events_[c_.timed_++];
      HLM_CUDA_CHECK(cudaEventRecord(pair_->first, c_.stream_));
    }
    ~Timed() {
      if (pair_ != nullptr) cudaEventRecord(pair_->second, c_.stream_);
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    GpuComm& c_;
    std::pair<cudaEvent_t, cudaEvent_t>* pair_ = nullptr;
  };

  // Every rank uses rank 0's thresholds: a per-call choice that differed between members would leave
  // them in different kernels.
  void agree_on_thresholds() {
    std::array<int64_t, 2> t = {options_.ll_all_reduce_max_bytes, options_.ll_all_to_all_max_bytes};
    std::string bytes(reinterpret_cast<const char*>(t.data()), sizeof t);
    host_.broadcast(bytes, 0);
    HLM_CHECK(bytes.size() == sizeof t, "GPU Comm thresholds of {} bytes received", bytes.size());
    std::memcpy(t.data(), bytes.data(), sizeof t);
    options_.ll_all_reduce_max_bytes = t[0];
    options_.ll_all_to_all_max_bytes = t[1];
  }

  // The world rank of member `member` of this rank's group `g`.
  int world_rank(int g, int member) const {
    switch (static_cast<CommGroup>(g)) {
      case CommGroup::kCp:
        return mapping_.cp_peer(member);
      case CommGroup::kTp:
        return member * mapping_.cp + mapping_.cp_rank();
      case CommGroup::kWorld:
        break;
    }
    return member;
  }

  std::string describe(int code) const {
    static const char* const kKinds[] = {"all_reduce", "all_to_all", "all_to_all + LSE combine"};
    const int kind = (code >> 16) & 0xff, group = (code >> 8) & 0xff, member = code & 0xff;
    return fmt::format(
        "rank {} did not answer within --comm-timeout {} s (this rank waited in a GPU {} of the {} group); "
        "ending every rank",
        world_rank(group, member), timeout_s_, kKinds[kind % 3], kGroupNames[group % kGroups]);
  }

  // Reports a recorded failure the main thread has not picked up within the grace period, and ends this
  // process; mpirun then ends the others (the main thread may be blocked in a CUDA call, so no MPI here).
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    bool seen = false;
    Clock::time_point seen_at;
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(100));
      if (stop_ || control_->code == 0 || claimed_) continue;
      if (!seen) {
        seen = true;
        seen_at = Clock::now();
        continue;
      }
      if (Clock::now() - seen_at < kWatchdogGrace || claimed_.exchange(true)) continue;
      std::fprintf(stderr, "helixlm: rank %d: error: %s\n", host_.rank(), describe(control_->code).c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
  }

  Comm& host_;
  Mapping mapping_;
  GpuCommOptions options_;
  cudaStream_t stream_;
  std::array<int, kGroups> sizes_{};
  std::array<ncclComm_t, kGroups> nccl_{};
  std::array<std::unique_ptr<ll::LlChannel>, kGroups> ll_;
  HostControl* control_ = nullptr;
  int* device_code_ = nullptr;
  double timeout_s_ = 0;
  bool timing_ = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;  // start, stop of each timed collective
  size_t timed_ = 0;                                         // pairs in use since the last take
  std::atomic<bool> claimed_{false};                         // the failure has been (or is being) reported
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Comm> make_gpu_comm(Comm& host, const Mapping& mapping, const GpuCommOptions& options) {
  return std::make_unique<GpuComm>(host, mapping, options);
}

}  // namespace hlm
