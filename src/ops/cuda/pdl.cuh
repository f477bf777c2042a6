// Programmatic dependent launch (PDL, sm_90): a kernel launched with launch_pdl() may be scheduled while
// the kernel before it on the stream is still running, so its launch latency and prologue overlap the
// predecessor's tail instead of following it. Every kernel of a decode step is launched this way (the
// prefill, sampling and random-fill kernels are plain launches) and opens with pdl_wait(); pdl_trigger();.
// Rules for a kernel launched with launch_pdl():
//  - before pdl_wait() it may only read memory that the kernel just before it on the stream does not
//    write, and write nothing. Every kernel before that one has completed by then (that one waited for
//    it before triggering, below), so this covers weights (skinny_gemm.cu issues its first weight loads
//    there), host-written metadata, a layer's own state that only its kernels of earlier steps write
//    (kda_decode.cu loads its recurrent state there), and activations written two or more launches back
//    (moe_experts.cu: the down GEMM reads its work list there, the combine its routing and the shared
//    experts' output), and the keys a paged cache held before the step (mla_attention.cu). Such loads
//    are not free: they compete with the predecessor's last loads, and early
//    weight loads made the routed experts' down GEMM and the router logits slower on an H200
//    (moe_experts.cu, moe_route.cu), so each use is measured. A stream join (Ops::join_side) right
//    before the launch does not make the joined stream's results readable there: inside a captured graph
//    a combine that read the shared experts' output before its wait, with the side stream joined just
//    before it, got wrong sums (CudaGolden.GraphDecodeEqualsEagerDecode, 2026-12-04); joined one launch
//    earlier, as the model does, they are complete before the kernel before it triggers;
//  - every thread calls pdl_wait() before it reads what the kernel just before it writes, and before it
//    writes anything. pdl_wait() returns once the predecessor grid has completed and its writes are
//    visible (and that grid waited for its own predecessor the same way), so everything earlier on the
//    stream is done.
// pdl_trigger() lets the dependent grid be scheduled early (the dependent still waits for this grid's
// completion), and costs nothing when no PDL launch follows. It comes after pdl_wait(): a kernel that
// triggered before waiting would let its dependent trigger too, and a chain of waiting grids piles up on
// the SMs ahead of the one running. Measured on an H200 (2026-12-04): with the RMSNorm kernels and the MoE
// decode combine triggering first, the next layer's input projection launched while the routed experts
// ran, and its early weight loads slowed the experts' kernel (the selection's end to its end 33.5 -> 39.3
// µs, medians over the 48B's 26 MoE layers) more than they shortened the projection (1.5 µs); the 4K
// batch-1 step went 2.34-2.37 -> 2.47-2.50 ms (batch 8 and 32 unchanged).
// Inside stream capture, a launch_pdl() becomes a programmatic edge of the CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include "ops/cuda/cuda_check.h"

namespace hlm::cuda {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// Launches `kernel` (one params argument) as a PDL dependent of the previous kernel on `stream`; with
// cluster_x > 1, in thread-block clusters of cluster_x consecutive CTAs along x.
template <class Params>
void launch_pdl(void (*kernel)(Params), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                const Params& p, unsigned cluster_x = 1) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = cluster_x;
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = cluster_x > 1 ? 2 : 1;
  HLM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
}

}  // namespace hlm::cuda
