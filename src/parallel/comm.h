// Comm: the collectives layers use (docs/DESIGN.md "Backends"). Three groups per rank: the world (all
// N = tp·cp ranks, the repurposed TP/EP group), the CP group (consecutive ranks sharing a tp_rank) and
// the TP group (ranks sharing a cp_rank). The single-process Comm makes every collective the identity,
// so one-rank runs go through exactly the same layer code.
//
// Tensors live where the backend keeps them. The MPI Comm takes host tensors (the CPU backend); the GPU
// Comm (gpu_comm.h) takes device tensors of the CUDA backend, enqueues each collective on the backend's
// stream in order with its ops (so a decode step's collectives are captured into its CUDA graph), and
// hands host tensors to the MPI Comm beneath it. Sums are taken in fp32 whatever the float dtype.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/tensor.h"
#include "parallel/mapping.h"

namespace hlm {

enum class CommGroup { kWorld, kTp, kCp };

// The exact merge of partial attentions (Ops::lse_combine): parts [R, T, H, V], stats [R, T, H, 2] ->
// [T, H, V]. Supplied by the caller, because parallel/ sits below ops/.
using LseCombine = std::function<Tensor(const Tensor& parts, const Tensor& stats)>;

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;  // in the world
  virtual int size() const = 0;  // of the world
  virtual int group_size(CommGroup g) const = 0;
  virtual int group_rank(CommGroup g) const = 0;

  // In-place elementwise sum over the group: F32 tensors, or BF16 on a device.
  virtual void all_reduce_sum(Tensor& t, CommGroup g) = 0;
  // Every member's t stacked in group order: [n, t.shape...].
  virtual Tensor all_gather(const Tensor& t, CommGroup g) = 0;
  // t [n, ...]: slice j goes to member j; the result [n, ...] holds in slice i what member i sent here.
  virtual Tensor all_to_all(const Tensor& t, CommGroup g) = 0;
  // The Helix MLA exchange (docs/HELIX.md §3 steps 6-7): parts [n, T, H, V] and stats [n, T, H, 2] (F32),
  // slice j for member j, then `combine` of the n slices that arrived -> [T, H, V] F32. This is the
  // reference; the GPU Comm fuses the merge into the receive of the exchange, so the gathered partials
  // are never written out.
  virtual Tensor all_to_all_lse_combine(const Tensor& parts, const Tensor& stats, CommGroup g,
                                        const LseCombine& combine) {
    return combine(all_to_all(parts, g), all_to_all(stats, g));
  }
  // World broadcast of a byte string from `root`; receivers' strings are replaced.
  virtual void broadcast(std::string& bytes, int root) = 0;
  virtual void barrier() = 0;

  // The deadline of every collective, in seconds from the moment this rank enters it. A collective that
  // has not completed by then ends in an hlm::Error naming the ranks that did not answer (a stalled or
  // dead peer), so one stalled rank cannot hang the job. One rank has nobody to wait for: no-op there.
  virtual void set_timeout(double seconds) {}
  virtual double timeout() const { return 0; }
  // Throws the error of a collective that failed after it was enqueued (a GPU collective that gave up
  // waiting for a peer at its deadline); the engine calls it after every step. No-op where collectives
  // complete before they return.
  virtual void check() {}
  // For a compute/communication split of eager steps: after enable_timing(true), take_collective_seconds()
  // returns the device time spent inside the collectives enqueued since its previous call outside graph
  // capture (waiting for them), including any wait for slower peers. 0 where the Comm does not measure.
  virtual void enable_timing(bool on) {}
  virtual double take_collective_seconds() { return 0; }
};

std::unique_ptr<Comm> make_single_comm();

// True when this process was started by an MPI launcher (mpirun / srun with PMI).
bool launched_under_mpi();

// MPI_Init (once) and a Comm over MPI_COMM_WORLD split by `mapping`'s layout. The world size must equal
// mapping.world(): the caller checks that with a message naming --tp and --cp.
std::unique_ptr<Comm> make_mpi_comm(const Mapping& mapping);

// World size and rank as MPI reports them (initializing MPI if needed); 1, 0 outside MPI.
void mpi_world(int* size, int* rank);

// This rank's index among the ranks on its host, as the launcher reports it (OpenMPI, MPICH/PMI, Slurm);
// `rank` where none does. A GPU rank uses the GPU of this index.
int local_rank(int rank);

// Ends this process and, under MPI, every other rank (MPI_Abort), so one rank's error never leaves the
// others waiting in a collective. The caller prints the message first.
[[noreturn]] void abort_all_ranks(int code);

}  // namespace hlm
