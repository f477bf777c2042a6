// Comm: the collectives layers use (docs/DESIGN.md "Backends"). Three groups per rank: the world (all
// N = tp·cp ranks, the repurposed TP/EP group), the CP group (consecutive ranks sharing a tp_rank) and
// the TP group (ranks sharing a cp_rank). The single-process Comm makes every collective the identity,
// so one-rank runs go through exactly the same layer code.
#pragma once

#include <memory>
#include <string>

#include "base/tensor.h"
#include "parallel/mapping.h"

namespace hlm {

enum class CommGroup { kWorld, kTp, kCp };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;  // in the world
  virtual int size() const = 0;  // of the world
  virtual int group_size(CommGroup g) const = 0;
  virtual int group_rank(CommGroup g) const = 0;

  // In-place elementwise sum over the group (F32 tensors).
  virtual void all_reduce_sum(Tensor& t, CommGroup g) = 0;
  // Every member's t stacked in group order: [n, t.shape...].
  virtual Tensor all_gather(const Tensor& t, CommGroup g) = 0;
  // t [n, ...]: slice j goes to member j; the result [n, ...] holds in slice i what member i sent here.
  virtual Tensor all_to_all(const Tensor& t, CommGroup g) = 0;
  // World broadcast of a byte string from `root`; receivers' strings are replaced.
  virtual void broadcast(std::string& bytes, int root) = 0;
  virtual void barrier() = 0;

  // The deadline of every collective, in seconds from the moment this rank enters it. A collective that
  // has not completed by then ends in an hlm::Error naming the ranks that did not answer (a stalled or
  // dead peer), so one stalled rank cannot hang the job. One rank has nobody to wait for: no-op there.
  virtual void set_timeout(double seconds) {}
  virtual double timeout() const { return 0; }
};

std::unique_ptr<Comm> make_single_comm();

// True when this process was started by an MPI launcher (mpirun / srun with PMI).
bool launched_under_mpi();

// MPI_Init (once) and a Comm over MPI_COMM_WORLD split by `mapping`'s layout. The world size must equal
// mapping.world(): the caller checks that with a message naming --tp and --cp.
std::unique_ptr<Comm> make_mpi_comm(const Mapping& mapping);

// World size and rank as MPI reports them (initializing MPI if needed); 1, 0 outside MPI.
void mpi_world(int* size, int* rank);

// Ends this process and, under MPI, every other rank (MPI_Abort), so one rank's error never leaves the
// others waiting in a collective. The caller prints the message first.
[[noreturn]] void abort_all_ranks(int code);

}  // namespace hlm
