// One-shot LL16 collectives over NVLink peer memory (docs/KERNELS.md Part B §5): the kernels and the
// plain structs they take. A channel is one group's set of receive buffers, one per member, each mapped
// into every other member's address space (CUDA IPC). A call pushes this rank's data into its peers'
// buffers as LL16 lines and then polls its own buffer: no barrier, no remote load, no host involvement.
//
// Protocol (the same for every kernel here):
//  - An LL16 line is 16 bytes {data0, flag, data1, flag}, written with one 16-byte store. Only 8-byte
//    stores are relied on to be single-copy atomic, so each 4-byte data word travels with its own copy
//    of the flag; a reader that sees both flags equal to the call's flag holds both words.
//  - Receive buffer of a member: [2 sets][n slots][slot_lines] lines; slot s holds what member s sent.
//  - Call number c (ChannelState::calls, in device memory) is read by every CTA at the start and
//    advanced by the last CTA to finish, never by the host, so a CUDA graph replays correctly. Call c
//    uses set c % 2 and flag 2 + c % period. Alternating sets make a fast rank's next call (which can
//    only start after this rank's pushes of the current call) write where this rank is not reading.
//  - Flags repeat every `period` calls; the last call of each parity in a period zeroes its set once
//    every CTA is done, so a stale line can never carry a flag the next period expects. Zero is never a
//    flag, so the zeroed buffers of a fresh channel hold nothing valid.
//  - Every rank sums in fp32 in rank order 0..n-1, so all members get bitwise identical results.
//  - A wait that outlasts the deadline (ErrorState::timeout_ns) records which peer it waited for and
//    gives up; once that happened every later wait gives up at once, so the stream drains and the host
//    reports the error (GpuComm::check).
//  - All CTAs are co-resident (grid <= SMs) and wait only for peers' CTAs, never for each other.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hlm::ll {

constexpr int kMaxRanks = 8;

struct alignas(16) Line {
  uint32_t data0, flag0, data1, flag1;
};

// Per-channel state in device memory, zeroed at creation.
struct ChannelState {
  unsigned long long calls;  // calls completed on this channel
  unsigned int done;         // CTAs of the running call that have finished
};

// What a kernel does when a wait gives up (shared by the channels of one GpuComm).
struct ErrorState {
  int* device_code;                    // device memory: the first failure's code, 0 while none
  volatile int* host_code;             // mapped host memory: the same code, readable without a device sync
  const volatile int64_t* timeout_ns;  // mapped host memory: the deadline of one wait
};

// Failure codes: kErrorBit | kind << 16 | group << 8 | peer (the group rank waited for).
constexpr int kErrorBit = 1 << 30;
enum class CallKind : int { kAllReduce = 0, kAllToAll = 1, kAllToAllCombine = 2 };

struct ChannelView {
  Line* recv;                  // this member's receive buffer
  Line* peer_recv[kMaxRanks];  // every member's receive buffer, mapped here (own entry unused)
  ChannelState* state;
  ErrorState error;
  int64_t slot_lines;
  uint32_t period;  // even, >= 4
  int n, me, group, max_ctas;
};

// In-place or out-of-place sum of `bytes` bytes of F32 or BF16 elements over the channel's members.
struct AllReduceParams {
  ChannelView ch;
  const void* in;
  void* out;
  int64_t bytes;
  bool bf16;
};

// in [n, chunk] bytes -> out [n, chunk]: chunk j of in goes to member j; chunk i of out came from member i.
struct AllToAllParams {
  ChannelView ch;
  const void* in;
  void* out;
  int64_t chunk;
};

// parts [n, rows, v_dim] and stats [n, rows, 2] (F32): slice j goes to member j; the receiver merges the
// n slices it gets exactly (Ops::lse_combine) into out [rows, v_dim] F32. v_dim is even.
struct AllToAllCombineParams {
  ChannelView ch;
  const float* parts;
  const float* stats;
  float* out;
  int64_t rows;
  int v_dim;
};

// LL16 lines one member sends another in each call.
__host__ __device__ inline int64_t ll_lines(int64_t bytes) { return (bytes + 7) / 8; }
__host__ __device__ inline int64_t combine_lines(int64_t rows, int v_dim) { return rows * (1 + v_dim / 2); }

void launch_all_reduce(const AllReduceParams& p, cudaStream_t stream);
void launch_all_to_all(const AllToAllParams& p, cudaStream_t stream);
void launch_all_to_all_combine(const AllToAllCombineParams& p, cudaStream_t stream);

}  // namespace hlm::ll
