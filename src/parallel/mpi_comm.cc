// The MPI Comm: the CPU backend's collectives and the host-side control channel (step plans). Groups are
// MPI_Comm_split of the world: CP groups by color tp_rank (key cp_rank), TP groups by color cp_rank (key
// tp_rank), matching docs/HELIX.md §1. Every MPI call goes through HLM_MPI_CHECK, which throws with the
// call, the MPI error string, file and line.
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <vector>

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

class MpiComm final : public Comm {
 public:
  explicit MpiComm(const Mapping& m) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    HLM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, m.tp_rank(), m.cp_rank(), &cp_));
    HLM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, m.cp_rank(), m.tp_rank(), &tp_));
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&cp_);
    MPI_Comm_free(&tp_);
  }

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
    HLM_MPI_CHECK(
        MPI_Allreduce(MPI_IN_PLACE, t.raw(), static_cast<int>(t.numel()), MPI_FLOAT, MPI_SUM, comm(g)));
  }

  Tensor all_gather(const Tensor& t, CommGroup g) override {
    int n = group_size(g);
    Shape s = t.shape();
    s.insert(s.begin(), n);
    Tensor out = Tensor::empty(s, t.dtype());
    HLM_MPI_CHECK(MPI_Allgather(t.raw(), static_cast<int>(t.nbytes()), MPI_BYTE, out.raw(),
                                static_cast<int>(t.nbytes()), MPI_BYTE, comm(g)));
    return out;
  }

  Tensor all_to_all(const Tensor& t, CommGroup g) override {
    int n = group_size(g);
    HLM_CHECK(t.rank() >= 1 && t.dim(0) == n,
              "all_to_all over {} ranks needs a leading dimension of {}, got {}", n, n, t.describe());
    Tensor out = Tensor::empty(t.shape(), t.dtype());
    int chunk = static_cast<int>(t.nbytes() / n);
    HLM_MPI_CHECK(MPI_Alltoall(t.raw(), chunk, MPI_BYTE, out.raw(), chunk, MPI_BYTE, comm(g)));
    return out;
  }

  void broadcast(std::string& bytes, int root) override {
    uint64_t len = bytes.size();
    HLM_MPI_CHECK(MPI_Bcast(&len, 1, MPI_UINT64_T, root, MPI_COMM_WORLD));
    bytes.resize(len);
    HLM_MPI_CHECK(MPI_Bcast(bytes.data(), static_cast<int>(len), MPI_BYTE, root, MPI_COMM_WORLD));
  }

  void barrier() override { HLM_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }

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

  int rank_ = 0;
  int size_ = 1;
  MPI_Comm cp_ = MPI_COMM_NULL;
  MPI_Comm tp_ = MPI_COMM_NULL;
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
