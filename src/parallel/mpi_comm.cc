// The MPI Comm: the CPU backend's collectives and the host-side control channel (step plans). Groups are
// MPI_Comm_split of the world: CP groups by color tp_rank (key cp_rank), TP groups by color cp_rank (key
// tp_rank), matching docs/HELIX.md §1. Every MPI call goes through HLM_MPI_CHECK, which throws with the
// call, the MPI error string, file and line.
//
// Every collective is non-blocking (MPI_I*) and waited for by polling with a deadline: blocking MPI calls
// cannot time out, so a stalled peer would hang the job forever, and OpenMPI busy-polls inside them, so a
// rank idling between step plans would burn a core. The poll spins for the first few microseconds (a fast
// collective pays no sleep), then sleeps with exponential backoff up to 1 ms. Past the deadline the rank
// asks every peer over a separate communicator whether it is alive (peers answer from their own polling
// loops) and fails naming those that did not answer.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "parallel/comm.h"

#define HLM_MPI_CHECK(call)                                                             \
  do {                                                                                  \
    int hlm_mpi_rc = (call);                                                            \
    if (hlm_mpi_rc != MPI_SUCCESS) {                                                    \
      char hlm_mpi_msg[MPI_MAX_ERROR_STRING];                                           \
      int hlm_mpi_len = 0;                                                              \
      MPI_Error_string(hlm_mpi_rc, hlm_mpi_msg, &hlm_mpi_len);                          \
      HLM_FAIL("MPI call {} failed: {}", #call, std::string(hlm_mpi_msg, hlm_mpi_len)); \
    }                                                                                   \
  } while (0)

namespace hlm {

namespace {

void ensure_mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  HLM_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  // Errors come back as return codes so they become hlm::Error with a message instead of an abort
  // without one.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

using Clock = std::chrono::steady_clock;

// Tags of the liveness probe on the control communicator.
constexpr int kProbeTag = 1;
constexpr int kAliveTag = 2;

class MpiComm final : public Comm {
 public:
  explicit MpiComm(const Mapping& m) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    HLM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, m.tp_rank(), m.cp_rank(), &cp_));
    HLM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, m.cp_rank(), m.tp_rank(), &tp_));
    HLM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &ctrl_));
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&cp_);
    MPI_Comm_free(&tp_);
    MPI_Comm_free(&ctrl_);
  }

  void set_timeout(double seconds) override {
    HLM_CHECK(seconds > 0, "--comm-timeout must be positive (got {})", seconds);
    timeout_s_ = seconds;
  }
  double timeout() const override { return timeout_s_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int group_size(CommGroup g) const override {
    int n = 0;
    MPI_Comm_size(comm(g), &n);
    return n;
  }
  int group_rank(CommGroup g) const override {
    int r = 0;
    MPI_Comm_rank(comm(g), &r);
    return r;
  }

  void all_reduce_sum(Tensor& t, CommGroup g) override {
    check_f32(t, "all_reduce_sum");
    if (group_size(g) == 1) return;
    MPI_Request req;
    HLM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), static_cast<int>(t.numel()), MPI_FLOAT, MPI_SUM,
                                 comm(g), &req));
    wait(req, "all_reduce");
  }

  Tensor all_gather(const Tensor& t, CommGroup g) override {
    int n = group_size(g);
    Shape s = t.shape();
    s.insert(s.begin(), n);
    Tensor out = Tensor::empty(s, t.dtype());
    MPI_Request req;
    HLM_MPI_CHECK(MPI_Iallgather(t.raw(), static_cast<int>(t.nbytes()), MPI_BYTE, out.raw(),
                                 static_cast<int>(t.nbytes()), MPI_BYTE, comm(g), &req));
    wait(req, "all_gather");
    return out;
  }

  Tensor all_to_all(const Tensor& t, CommGroup g) override {
    int n = group_size(g);
    HLM_CHECK(t.rank() >= 1 && t.dim(0) == n,
              "all_to_all over {} ranks needs a leading dimension of {}, got {}", n, n, t.describe());
    Tensor out = Tensor::empty(t.shape(), t.dtype());
    int chunk = static_cast<int>(t.nbytes() / n);
    MPI_Request req;
    HLM_MPI_CHECK(MPI_Ialltoall(t.raw(), chunk, MPI_BYTE, out.raw(), chunk, MPI_BYTE, comm(g), &req));
    wait(req, "all_to_all");
    return out;
  }

  void broadcast(std::string& bytes, int root) override {
    uint64_t len = bytes.size();
    MPI_Request req;
    HLM_MPI_CHECK(MPI_Ibcast(&len, 1, MPI_UINT64_T, root, MPI_COMM_WORLD, &req));
    wait(req, fmt::format("broadcast from rank {}", root).c_str());
    bytes.resize(len);
    HLM_MPI_CHECK(MPI_Ibcast(bytes.data(), static_cast<int>(len), MPI_BYTE, root, MPI_COMM_WORLD, &req));
    wait(req, fmt::format("broadcast from rank {}", root).c_str());
  }

  void barrier() override {
    MPI_Request req;
    HLM_MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req));
    wait(req, "barrier");
  }

 private:
  MPI_Comm comm(CommGroup g) const {
    switch (g) {
      case CommGroup::kCp:
        return cp_;
      case CommGroup::kTp:
        return tp_;
      case CommGroup::kWorld:
        break;
    }
    return MPI_COMM_WORLD;
  }
  static void check_f32(const Tensor& t, const char* op) {
    HLM_CHECK(t.dtype() == DType::kF32 && t.device() == Device::kCpu, "{}: expects a host F32 tensor, got {}",
              op, t.describe());
    HLM_CHECK(t.numel() <= INT32_MAX, "{}: tensor {} too large for one MPI call", op, t.describe());
  }

  // Polls `req` until it completes, answering peers' liveness probes meanwhile; past the deadline, fails
  // naming the peers that do not answer.
  void wait(MPI_Request& req, const char* what) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(timeout_s_);
    auto nap = std::chrono::microseconds(0);
    for (;;) {
      int done = 0;
      HLM_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      answer_probes();
      const auto now = Clock::now();
      if (now >= deadline) report_stall(what);
      if (now - start < std::chrono::microseconds(50)) continue;
      nap = std::clamp(nap * 2, std::chrono::microseconds(10), std::chrono::microseconds(1000));
      std::this_thread::sleep_for(nap);
    }
  }

  void answer_probes() {
    for (;;) {
      int pending = 0;
      MPI_Status status;
      HLM_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kProbeTag, ctrl_, &pending, &status));
      if (!pending) return;
      int ignored = 0;
      HLM_MPI_CHECK(MPI_Recv(&ignored, 1, MPI_INT, status.MPI_SOURCE, kProbeTag, ctrl_, MPI_STATUS_IGNORE));
      MPI_Request reply;
      HLM_MPI_CHECK(MPI_Isend(&alive_, 1, MPI_INT, status.MPI_SOURCE, kAliveTag, ctrl_, &reply));
      MPI_Request_free(&reply);
    }
  }

  // Asks every peer whether it is alive and fails naming those that stay silent for a grace period (live
  // peers answer within milliseconds from their own polling loops; a stopped or dead one never does).
  [[noreturn]] void report_stall(const char* what) {
    std::vector<MPI_Request> probes;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      probes.emplace_back();
      HLM_MPI_CHECK(MPI_Isend(&alive_, 1, MPI_INT, r, kProbeTag, ctrl_, &probes.back()));
    }
    std::vector<bool> answered(size_, false);
    answered[rank_] = true;
    const auto grace_end =
        Clock::now() + std::chrono::duration<double>(std::clamp(timeout_s_ / 10, 1.0, 10.0));
    while (Clock::now() < grace_end && std::count(answered.begin(), answered.end(), false) > 0) {
      answer_probes();
      int pending = 0;
      MPI_Status status;
      HLM_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kAliveTag, ctrl_, &pending, &status));
      if (pending) {
        int ignored = 0;
        HLM_MPI_CHECK(MPI_Recv(&ignored, 1, MPI_INT, status.MPI_SOURCE, kAliveTag, ctrl_, MPI_STATUS_IGNORE));
        answered[status.MPI_SOURCE] = true;
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<int> silent;
    for (int r = 0; r < size_; ++r) {
      if (!answered[r]) silent.push_back(r);
    }
    if (silent.empty()) {
      HLM_FAIL(
          "{} did not complete within --comm-timeout {} s although every rank answers: the ranks are out of "
          "step (a bug); ending every rank",
          what, timeout_s_);
    }
    HLM_FAIL("rank {} did not answer within --comm-timeout {} s (this rank waited in {}); ending every rank",
             fmt::join(silent, ", "), timeout_s_, what);
  }

  int rank_ = 0;
  int size_ = 1;
  MPI_Comm cp_ = MPI_COMM_NULL;
  MPI_Comm tp_ = MPI_COMM_NULL;
  MPI_Comm ctrl_ = MPI_COMM_NULL;  // liveness probes, apart from the collectives' traffic
  double timeout_s_ = 600;
  int alive_ = 1;  // the payload of probes and answers
};

}  // namespace

bool launched_under_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

void mpi_world(int* size, int* rank) {
  if (!launched_under_mpi()) {
    *size = 1;
    *rank = 0;
    return;
  }
  ensure_mpi_initialized();
  MPI_Comm_size(MPI_COMM_WORLD, size);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
}

int local_rank(int rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return rank;
}

void abort_all_ranks(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::unique_ptr<Comm> make_mpi_comm(const Mapping& mapping) {
  ensure_mpi_initialized();
  return std::make_unique<MpiComm>(mapping);
}

}  // namespace hlm
