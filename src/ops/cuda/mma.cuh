// Tensor-core fragments shared by the GEMMs (moe_experts.cu, moe_tiled_gemm.cu, skinny_gemm.cu):
// the mma.sync m16n8k16 wrapper, the shared-memory fragment loads and the streaming weight load.
#pragma once

#include <cstdint>

#include "ops/cuda/async_copy.cuh"

namespace hlm::cuda {

// mma.sync m16n8k16 (bf16 in, fp32 accumulate). Lane l = 4g + t holds A rows g and g + 8 at k = 2t, 2t+1
// (registers a0: row g, a1: row g + 8) and k = 2t + 8, 2t + 9 (a2: row g, a3: row g + 8), B column g at
// the same k (b0, b1), and C rows g, g + 8 at columns 2t, 2t + 1 (c0 c1: row g, c2 c3: row g + 8).
// Any permutation of k applied to A and B alike leaves the product unchanged, and the k a lane holds
// depend only on t; so each lane feeds the mma from columns of its own choosing, the same for A (weight
// rows) and B (token rows): contiguous runs of 8 columns that come in as one 16-byte load.
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices; lane l gives the address of row (l & 7) of matrix (l >> 3); register i holds, in
// each lane, row lane/4 and columns 2·(lane%4) + {0, 1} of matrix i (with .trans: of its transpose).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// Weights are read once: through L2 without allocating in L1, which keeps the token rows there. The
// 256-byte L2 prefetch hint lets a miss bring the rest of its 256 bytes, which the GEMMs' lanes read in
// 64-byte pieces per row at about the same time (neighbour lanes, warps and CTAs).
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

}  // namespace hlm::cuda
