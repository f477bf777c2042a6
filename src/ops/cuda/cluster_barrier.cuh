// Halves of a thread-block cluster's barrier (PTX barrier.cluster), for kernels whose CTAs exchange values
// through distributed shared memory (kda_decode_tile.cuh, attn_res.cu): arrive, then wait, so that work can
// go between the two.
#pragma once

namespace hlm::cuda {

// Cluster barrier halves (PTX barrier.cluster). The release arrive orders this CTA's earlier writes (its
// shared-memory values the peers read) before the peers' acquire wait; the relaxed arrive orders nothing,
// which is all the final barrier needs: the peers' reads of this CTA's shared memory have completed (their
// values are in use) when they arrive.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

}  // namespace hlm::cuda
