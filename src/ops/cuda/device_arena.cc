#include "ops/cuda/device_arena.h"

#include "base/log.h"
#include "ops/cuda/cuda_check.h"

namespace hlm::cuda {

namespace {
constexpr size_t kAlign = 256;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

DeviceArena::DeviceArena(size_t bytes) : capacity_(round_up(bytes)), alive_(std::make_shared<bool>(true)) {
  if (capacity_ > 0) {
    void* p = nullptr;
    HLM_CUDA_CHECK(cudaMalloc(&p, capacity_));
    base_ = static_cast<std::byte*>(p);
    free_.emplace(0, capacity_);
  }
}

DeviceArena::~DeviceArena() {
  *alive_ = false;
  if (base_ != nullptr) cudaFree(base_);
}

std::shared_ptr<void> DeviceArena::allocate(size_t bytes) {
  const size_t size = round_up(bytes == 0 ? 1 : bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const size_t offset = it->first, left = it->second - size;
    free_.erase(it);
    if (left > 0) free_.emplace(offset + size, left);
    in_use_ += size;
    peak_ = std::max(peak_, in_use_);
    std::shared_ptr<bool> alive = alive_;
    return std::shared_ptr<void>(base_ + offset, [this, offset, size, alive](void*) {
      if (*alive) release(offset, size);
    });
  }
  HLM_FAIL(
      "GPU step workspace exhausted: a step needs {} more with {} of {} in use; this step is larger than the "
      "workspace was planned for (lower --prefill-chunk or --max-batch)",
      human_bytes(static_cast<int64_t>(size)), human_bytes(static_cast<int64_t>(in_use_)),
      human_bytes(static_cast<int64_t>(capacity_)));
}

void DeviceArena::resume_releases() {
  holding_ = false;
  for (const auto& [offset, bytes] : held_) release(offset, bytes);
  held_.clear();
}

void DeviceArena::release(size_t offset, size_t bytes) {
  if (holding_) {
    held_.emplace_back(offset, bytes);
    return;
  }
  in_use_ -= bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_.emplace(offset, bytes);
}

}  // namespace hlm::cuda
