#include "parallel/cuda/ll_channel.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/cuda_check.h"
#include "base/log.h"

namespace hlm::ll {

namespace {

// Enough CTAs to keep every message in flight at once up to a few hundred KB; more would only add pollers.
constexpr int kMaxCtas = 64;

// What one member tells the others at set-up.
struct MemberInfo {
  char host[64];
  char bus_id[32];
  cudaIpcMemHandle_t handle;
};

Tensor host_bytes(const void* p, size_t n) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)}, DType::kU8);
  std::memcpy(t.raw(), p, n);
  return t;
}

// Maps `other`'s buffer into this process when this GPU can write it over peer memory; nullptr otherwise
// (another host, a GPU this process cannot see or reach, the same GPU, or IPC refused, as in some VMs).
void* open_peer(const MemberInfo& mine, const MemberInfo& other, int device) {
  if (std::strncmp(mine.host, other.host, sizeof mine.host) != 0) return nullptr;
  int peer = -1;
  if (cudaDeviceGetByPCIBusId(&peer, other.bus_id) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  // Two ranks on one GPU would time-slice their spinning kernels: not a layout for these collectives.
  if (peer == device) return nullptr;
  int can = 0;
  HLM_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
  if (!can) return nullptr;
  void* p = nullptr;
  if (cudaIpcOpenMemHandle(&p, other.handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

const char* group_name(CommGroup g) {
  switch (g) {
    case CommGroup::kCp:
      return "CP";
    case CommGroup::kTp:
      return "TP";
    case CommGroup::kWorld:
      break;
  }
  return "world";
}

}  // namespace

std::unique_ptr<LlChannel> LlChannel::create(Comm& host, CommGroup g, const ChannelOptions& o,
                                             const ErrorState& error) {
  HLM_CHECK(o.slot_bytes > 0 && o.period >= 4 && o.period % 2 == 0,
            "LL channel: slot bytes {} must be positive and the flag period {} even and >= 4", o.slot_bytes,
            o.period);
  const int n = host.group_size(g), me = host.group_rank(g);
  std::unique_ptr<LlChannel> ch(new LlChannel);
  int device = 0, sms = 0;
  HLM_CUDA_CHECK(cudaGetDevice(&device));
  HLM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t slot_lines = ll_lines(o.slot_bytes);
  const size_t buffer_bytes = size_t{2} * n * slot_lines * sizeof(Line);
  HLM_CUDA_CHECK(cudaMalloc(&ch->buffer_, buffer_bytes));
  HLM_CUDA_CHECK(cudaMalloc(&ch->state_, sizeof(ChannelState)));
  HLM_CUDA_CHECK(cudaMemset(ch->buffer_, 0, buffer_bytes));
  HLM_CUDA_CHECK(cudaMemset(ch->state_, 0, sizeof(ChannelState)));
  // Peers may write into the buffer as soon as they hold its handle, so it is zero before it is shared.
  HLM_CUDA_CHECK(cudaDeviceSynchronize());

  MemberInfo mine{};
  gethostname(mine.host, sizeof mine.host - 1);
  HLM_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.bus_id, sizeof mine.bus_id, device));
  HLM_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, ch->buffer_));
  const Tensor gathered = host.all_gather(host_bytes(&mine, sizeof mine), g);  // [n, sizeof(MemberInfo)]
  std::vector<MemberInfo> info(n);
  std::memcpy(info.data(), gathered.raw(), n * sizeof(MemberInfo));

  ch->view_.recv = static_cast<Line*>(ch->buffer_);
  uint8_t reachable = n <= kMaxRanks;
  for (int q = 0; q < n && reachable; ++q) {
    if (q == me) continue;
    void* p = open_peer(mine, info[q], device);
    reachable = p != nullptr;
    if (p != nullptr) ch->peer_buffers_.push_back(p);
    ch->view_.peer_recv[q] = static_cast<Line*>(p);
  }
  const Tensor votes = host.all_gather(host_bytes(&reachable, 1), g);  // [n, 1]
  const auto* v = votes.data<uint8_t>();
  if (!std::all_of(v, v + n, [](uint8_t x) { return x != 0; })) {
    spdlog::info(
        "{} group: a member cannot write another's GPU memory (other hosts or no peer access); its "
        "collectives use NCCL only",
        group_name(g));
    return nullptr;
  }
  ch->view_.peer_recv[me] = ch->view_.recv;
  ch->view_.state = static_cast<ChannelState*>(ch->state_);
  ch->view_.error = error;
  ch->view_.slot_lines = slot_lines;
  ch->view_.period = o.period;
  ch->view_.n = n;
  ch->view_.me = me;
  ch->view_.group = static_cast<int>(g);
  ch->view_.max_ctas = std::min(sms, kMaxCtas);
  spdlog::debug("{} group: LL16 peer-memory channel of {} members, {} per message", group_name(g), n,
                human_bytes(o.slot_bytes));
  return ch;
}

LlChannel::~LlChannel() {
  for (void* p : peer_buffers_) cudaIpcCloseMemHandle(p);
  if (state_ != nullptr) cudaFree(state_);
  if (buffer_ != nullptr) cudaFree(buffer_);
}

void LlChannel::all_reduce(const void* in, void* out, int64_t bytes, bool bf16, cudaStream_t stream) {
  HLM_CHECK(bytes <= slot_bytes(), "LL all_reduce of {} bytes exceeds the {} of a slot", bytes, slot_bytes());
  launch_all_reduce(AllReduceParams{view_, in, out, bytes, bf16}, stream);
}

void LlChannel::all_to_all(const void* in, void* out, int64_t chunk, cudaStream_t stream) {
  HLM_CHECK(chunk <= slot_bytes(), "LL all_to_all chunk of {} bytes exceeds the {} of a slot", chunk,
            slot_bytes());
  launch_all_to_all(AllToAllParams{view_, in, out, chunk}, stream);
}

void LlChannel::all_to_all_combine(const float* parts, const float* stats, float* out, int64_t rows,
                                   int v_dim, cudaStream_t stream) {
  HLM_CHECK(v_dim > 0 && v_dim % 2 == 0 && combine_lines(rows, v_dim) <= view_.slot_lines,
            "LL all_to_all_combine: {} rows of {} values do not fit a slot of {} bytes (or the width is odd)",
            rows, v_dim, slot_bytes());
  launch_all_to_all_combine(AllToAllCombineParams{view_, parts, stats, out, rows, v_dim}, stream);
}

}  // namespace hlm::ll
