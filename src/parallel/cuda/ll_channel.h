// LlChannel: the LL16 receive buffers of one group (protocol in ll_kernels.h), set up once over the host
// Comm and used by the GPU Comm for calls below its size thresholds. Set-up is collective over the
// group: each member allocates and zeroes its buffer, then the members exchange host names, PCI bus ids
// and CUDA IPC handles and map each other's buffers. The channel exists only if every member can write
// every other member's memory (same host, peer access, distinct GPUs, at most ll::kMaxRanks members);
// all members agree on that, so they all take the same path for every call.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "parallel/comm.h"
#include "parallel/cuda/ll_kernels.h"

namespace hlm::ll {

struct ChannelOptions {
  int64_t slot_bytes = 0;  // payload capacity of one member's message per call
  uint32_t period = 0;     // flag period (even, >= 4)
};

class LlChannel {
 public:
  // Every member of group `g` of `host` calls it; returns nullptr on every member when the group cannot
  // use peer memory. `error` is the GPU Comm's failure record.
  static std::unique_ptr<LlChannel> create(Comm& host, CommGroup g, const ChannelOptions& options,
                                           const ErrorState& error);
  ~LlChannel();
  LlChannel(const LlChannel&) = delete;
  LlChannel& operator=(const LlChannel&) = delete;

  int64_t slot_bytes() const { return view_.slot_lines * 8; }

  // `bytes` of F32 or BF16 data (in may equal out).
  void all_reduce(const void* in, void* out, int64_t bytes, bool bf16, cudaStream_t stream);
  // in, out [n, chunk] bytes.
  void all_to_all(const void* in, void* out, int64_t chunk, cudaStream_t stream);
  // parts [n, rows, v_dim], stats [n, rows, 2] -> out [rows, v_dim] (F32; v_dim even).
  void all_to_all_combine(const float* parts, const float* stats, float* out, int64_t rows, int v_dim,
                          cudaStream_t stream);

 private:
  LlChannel() = default;

  ChannelView view_{};
  void* buffer_ = nullptr;           // this member's receive buffer (cudaMalloc)
  void* state_ = nullptr;            // ChannelState (cudaMalloc)
  std::vector<void*> peer_buffers_;  // the others' buffers, opened from their IPC handles
};

}  // namespace hlm::ll
