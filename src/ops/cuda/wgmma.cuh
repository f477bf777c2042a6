// Hopper warpgroup MMA (wgmma.mma_async, sm_90a): the shared-memory operand layout, its descriptor and the
// instruction wrappers. A warpgroup (4 warps) multiplies a 64 x N tile from operands in shared memory
// without ldmatrix or register staging, asynchronously, which is what takes the MMA issue cost off an
// attention kernel's critical path (docs/KERNELS.md §5).
//
// The one layout used here is the 128-byte swizzle: a bf16 tile of R rows and C columns (C a multiple of 64)
// is stored as C / 64 blocks of R rows x 128 bytes, block after block; within a block, row r's 16-byte
// chunk j sits at chunk j ^ (r % 8). Blocks must start on 1024-byte boundaries (the hardware swizzles on
// absolute address bits). The same bytes serve as a K-major operand (rows = M or N, columns = K) and, for
// bf16, as an MN-major one (rows = K, columns = M or N), which is how one K tile of MLA's latent cache is
// both the keys of S = Q·Kᵀ and the values of O = P·V.
#pragma once

#include <cstdint>

#include "ops/cuda/async_copy.cuh"

namespace hlm::cuda {

// Byte offset of element (row, col) of a bf16 tile of `rows` rows in the 128-byte-swizzled layout above.
__host__ __device__ constexpr uint32_t sw128_offset(int row, int col, int rows) {
  return static_cast<uint32_t>((col / 64) * rows * 128 + row * 128 + ((((col % 64) / 8) ^ (row % 8)) << 4) +
                               (col % 8) * 2);
}

// The first 1024-byte boundary at or after `p` (shared memory): where a kernel's swizzled tiles start, its
// dynamic shared memory sized with 1024 bytes of slack for it.
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  return p + ((1024u - (smem_addr(p) & 1023u)) & 1023u);
}

// Descriptor of a 128-byte-swizzled operand starting at `p` (shared memory): groups of 8 rows are 1024
// bytes apart (SBO). The leading byte offset is unused by the K-major form and by an MN-major operand of
// 64 columns (one block), the only MN-major use here; it is set to 1024 too, so that either reading of the
// PTX ISA's description of the two fields gives the same operand. A k-step inside a block is the start
// address advanced by 32 bytes (16 bf16), as the hardware applies the swizzle after adding the offsets.
__device__ __forceinline__ uint64_t sw128_desc(const void* p) {
  constexpr uint64_t kStride = 1024 >> 4;
  return ((smem_addr(p) & 0x3FFFFu) >> 4) | (kStride << 16) | (kStride << 32) | (uint64_t{1} << 62);
}

// Orders this thread's earlier register writes to accumulators and its shared-memory writes of operands
// before the warpgroup's next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>  // wait until at most N committed groups of this warpgroup are pending
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy shared-memory writes (st.shared, cp.async) made visible to the async proxy that wgmma reads
// through; each writing thread fences before the barrier that publishes the writes.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving reads of an accumulator above the wgmma_wait that completes it.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The fp32 accumulators of an m64n32 (16 registers) or m64n64 (32) wgmma as read-write asm operands %0...
#define HLM_WGMMA_D16(d)                                                                          \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define HLM_WGMMA_D32(d)                                                                          \
  HLM_WGMMA_D16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define HLM_WGMMA_D64(d)                                                                          \
  HLM_WGMMA_D32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
      "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),  \
      "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),  \
      "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]),  \
      "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d[64 x 32] (+)= a[64 x 16] · b[16 x 32], bf16 in, fp32 accumulators, both operands from shared memory;
// kTransA = 1 reads a MN-major (its 64 columns of M contiguous). Accumulator layout (per warp w of the
// warpgroup, lane l = 4g + t): d[4j + v0 + 2v1] is row 16w + g + 8v1, column 8j + 2t + v0.
template <int kTransA>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, "
      "0;\n}\n"
      : HLM_WGMMA_D16(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransA));
}

// d[64 x 64] (+)= a[64 x 16] · b[16 x 64] with both operands in shared memory, both K-major.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : HLM_WGMMA_D32(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// d[64 x 128] += a[64 x 16] · b[16 x 128] with both operands in shared memory, both K-major (the layout of
// d as for m64n32, with j up to 15).
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : HLM_WGMMA_D64(d)
      : "l"(a), "l"(b));
}

// d[64 x 64] += a[64 x 16] · b[16 x 64] with a in registers (per warp w, rows 16w..16w + 15 in the mma.sync
// m16k16 fragment layout: a0 row g cols 2t.., a1 row g + 8, a2 row g cols 2t + 8.., a3 row g + 8) and b in
// shared memory MN-major (its 64 columns of N contiguous, rows of K 128 bytes apart).
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : HLM_WGMMA_D32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

}  // namespace hlm::cuda
