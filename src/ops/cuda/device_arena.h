// DeviceArena: the step scratch of a device backend. One cudaMalloc'd block, carved by a first-fit free
// list with coalescing on the host. A step's allocations happen in the same order every time the same
// step shape runs, so they land at the same addresses (what a captured CUDA graph relies on), and no
// allocation inside a step ever reaches the driver. Blocks are 256-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace hlm::cuda {

class DeviceArena {
 public:
  explicit DeviceArena(size_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // A block of at least `bytes`, freed when the returned owner is released. Throws hlm::Error naming the
  // request and the arena's size and use when it does not fit.
  std::shared_ptr<void> allocate(size_t bytes);
  size_t capacity() const { return capacity_; }
  // While held, released blocks stay allocated until resume_releases(): with work on two streams the host
  // releases a block when its last op is enqueued, and the other stream must not get it while that op may
  // still run. Deterministic like the rest, so graph addresses still repeat.
  void hold_releases() { holding_ = true; }
  void resume_releases();
  size_t in_use() const { return in_use_; }
  size_t peak() const { return peak_; }

 private:
  void release(size_t offset, size_t bytes);

  std::byte* base_ = nullptr;
  size_t capacity_ = 0;
  size_t in_use_ = 0;
  size_t peak_ = 0;
  std::map<size_t, size_t> free_;  // offset -> size, coalesced
  bool holding_ = false;
  std::vector<std::pair<size_t, size_t>> held_;  // (offset, size) released while holding
  // Shared by the deleters of the blocks handed out, so a block released after the arena is gone (a
  // tensor outliving its backend) does not touch freed host state.
  std::shared_ptr<bool> alive_;
};

}  // namespace hlm::cuda
