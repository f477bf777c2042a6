// The GPU Comm: Comm over device tensors of the CUDA backend, for one process per GPU under mpirun.
// Every collective is enqueued on the backend's stream, in order with its ops and capturable into its CUDA
// graphs. Small ones go over NVLink peer memory as one-shot LL16 pushes (parallel/cuda/ll_kernels.h: a
// few microseconds where NCCL takes about fifteen), larger ones and groups without peer access (other
// hosts) go through NCCL. Host tensors, broadcasts and barriers go to the MPI Comm beneath it.
// Only CUDA builds define make_gpu_comm (HLM_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "parallel/comm.h"

namespace hlm {

struct GpuCommOptions {
  void* stream = nullptr;                            // the backend's cudaStream_t (Ops::native_stream)
  std::function<Tensor(const Shape&, DType)> empty;  // allocates outputs (the backend's Ops::empty)
  // Peer-memory (LL16) collectives up to these sizes, NCCL above: the tensor's bytes for an all-reduce;
  // the bytes one member sends another for an all-to-all (the fused MLA exchange: stats and partials).
  // 0 turns the peer-memory path off. Rank 0's values hold for every rank.
  int64_t ll_all_reduce_max_bytes = 64 << 10;
  int64_t ll_all_to_all_max_bytes = 1 << 20;
  // The largest message of one member in the LL buffers; each group holds 2·n·2 times this per rank.
  int64_t ll_slot_bytes = 1 << 20;
  // Calls between two reuses of a flag value (even, >= 4); tests shorten it to exercise the wrap.
  uint32_t ll_flag_period = 0xfffffffeu;
  // Fail (on every rank) instead of falling back to NCCL when a group cannot use peer memory: for tests and
  // benchmarks of the peer-memory path.
  bool require_peer_memory = false;
};

// Collective over every rank of `host`, which must outlive the result. The backend's GPU must be the
// current device. Builds the NCCL communicators of the world and, split from it, of the CP and TP groups
// (docs/HELIX.md §1), and the peer-memory channel of every group with more than one member.
std::unique_ptr<Comm> make_gpu_comm(Comm& host, const Mapping& mapping, const GpuCommOptions& options);

}  // namespace hlm
