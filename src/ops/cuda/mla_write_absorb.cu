// Ops::mla_write_and_absorb in one launch: an MLA layer's new latent cache rows (mla_cache_write.cuh) and
// its absorbed queries (head_rows.cuh, q_nope · W_UK per head with the rope columns copied). Both read the
// output of the layer's q|kv_a projection and nothing of each other, yet as two launches on one stream the
// absorption's PDL wait waited for the cache write too: in a decode step it started about 1.7 µs after
// q|kv_a ended (bench --kernel-trace, the 48B at 4K, batch 1). In one launch both parts start when q|kv_a
// ends, and the attention after them waits on one kernel: traced on an H200, q|kv_a's end to the
// attention's end 14.6 -> 13.2 µs per MLA layer (medians over one step's 7 layers).
//
// Grid: CTAs [0, T) write cache row blockIdx.x; CTA T + i takes column block i % col_blocks of head
// i / col_blocks of the absorption. Both bodies run 128 threads and issue their weight loads (the norm
// weight; W_UK's rows) before their own pdl_wait().
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/head_rows.cuh"
#include "ops/cuda/mla_cache_write.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

static_assert(kCacheWriteThreads == kHeadThreads, "the two bodies share the launch's CTA shape");

struct WriteAbsorbParams {
  MlaCacheWriteParams write;
  HeadRowsParams absorb;
  int64_t col_blocks;  // the absorption's column blocks per head
};

template <class XT, class WT>
__global__ void __launch_bounds__(kHeadThreads) mla_write_absorb_kernel(const WriteAbsorbParams p) {
  const int64_t b = blockIdx.x;
  if (b < p.write.rows) {
    mla_cache_write_row<XT, WT>(p.write, b);
    return;
  }
  const int64_t i = b - p.write.rows;
  head_rows_block<bf16>(p.absorb, i % p.col_blocks, i / p.col_blocks);
}

}  // namespace

Tensor mla_write_and_absorb(CudaContext& ctx, const Tensor& ckv, int64_t latent, const Tensor& norm_w,
                            float eps, const Tensor& slots, Tensor& cache, const Tensor& q,
                            const Tensor& w_uk) {
  const char* op = "mla_write_and_absorb";
  WriteAbsorbParams p{};
  p.write = mla_cache_write_params(op, ckv, latent, norm_w, eps, slots, cache);
  HLM_CHECK(mla_absorb_queries_applies(q, w_uk), "{}: q {} / w_uk {} outside the absorption kernel's range",
            op, q.describe(), w_uk.describe());
  expect_dim(w_uk, 0, q.dim(1), op, "w_uk [H, nope, L]", "the head count of q [T, H, qk]");
  expect_dim(q, 0, ckv.dim(0), op, "q [T, H, qk]", "the row count of ckv [T, L + R]");
  const int64_t nope = w_uk.dim(1), rope = q.dim(2) - nope;
  Tensor y = ctx.empty({q.dim(0), q.dim(1), w_uk.dim(2) + rope}, DType::kBF16);  // [T, H, L + R]
  p.absorb = head_rows_params(q, w_uk, rope, y);
  p.col_blocks = blocks_for(p.absorb.b, kHeadColThreads * 8);
  const auto grid = static_cast<unsigned>(p.write.rows + p.col_blocks * p.absorb.heads);
  dispatch_float(ckv.dtype(), op, [&](auto x) {
    dispatch_float(norm_w.dtype(), op, [&](auto w) {
      launch_pdl(mla_write_absorb_kernel<typename decltype(x)::type, typename decltype(w)::type>, grid,
                 kHeadThreads, 0, ctx.stream(), p);
    });
  });
  HLM_CHECK_LAUNCH("mla_write_absorb_kernel");
  return y;
}

}  // namespace hlm::cuda
