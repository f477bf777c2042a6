// MLA on the GPU (docs/MODEL.md §6.2, docs/HELIX.md §3-4, docs/KERNELS.md §5): writing rows of the paged
// latent cache, the launch of the partial attention of this rank's queries over its local pages with (max,
// sum) statistics (the kernel: mla_attention.cu), and the exact LSE merge of partials (across CP ranks, and
// across the KV splits of one rank).
//
// Decode needs more CTAs than it has row blocks (32 or 64 query rows), so the attention splits each block's
// keys: the number of splits is fixed at launch from host shapes (enough CTAs to fill the GPU: 132 splits
// for one decode token of 32 heads, 1 for a prefill of many tokens). With one split the kernel writes the
// result; with several it writes per-split partials (normalized within the split) that the combine kernel
// merges exactly, the same merge lse_combine does across ranks.
#include <algorithm>
#include <cmath>

#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mla_blocks.cuh"
#include "ops/cuda/mla_cache_write.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

constexpr int kMaxCombineSources = 8192;

// --- exact merge of partials (lse_combine, and the splits of mla_attention) --------------------------------
struct CombineParams {
  const float* parts;  // [R, rows, V]
  const float* stats;  // [R, rows, 2]
  float* out;          // [rows, V]
  float* out_stats;    // [rows, 2] (the merged max and sum), or null
  int64_t rows;
  int v_dim, sources;
};

constexpr int kCombineThreads = 256;
constexpr int kCombineGroups = kCombineThreads / 32;  // sources are dealt to 8 warps

// Grid (rows, ceil(V / (32·kVec))). The CTA forms the weights w_i = s_i·exp(m_i − M) / Σ of its row once
// (block reductions, so every CTA of a row gets the same bits), then lane l of warp g sums w_i·part_i for
// its kVec columns over sources g, g+8, ... (so a long source list is read by 8 chains in parallel, each
// load kVec·4 bytes), kBatch sources at a time with all their loads issued before the first product, and
// the warps are added in shared memory, in warp order. Sources of weight 0 (empty: (-inf, 0)) add nothing
// and are not read: a split without keys wrote no partial. (Measured on an H200 and dropped, 2026-12-04: a
// warp's first 16 sources' parts loaded before the weights are formed, so that their round trip overlaps
// the stats' loads and the reductions. kernel_bench --mla at 64K keys, batch 1: 36.7 -> 34.9 µs at 32
// heads, but 149.3 -> 154.3 at batch 8; with the loads fitted to the sources per warp and skipped for
// splits without keys, 36.6 -> 35.8 at batch 1, 148.8 -> 150.1 at batch 8, 63.7 -> 64.7-65.4 at 96 heads,
// and the 48B's 4K batch-1 step 2.492-2.494 -> 2.501 ms.)
template <int kVec, int kBatch>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const CombineParams p) {
  pdl_wait();
  pdl_trigger();
  constexpr int kCols = 32 * kVec;
  extern __shared__ float weight[];  // [sources]
  __shared__ float scratch[32];
  __shared__ float group_sum[kCombineGroups][kCols];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  float m = -INFINITY;
  for (int i = tid; i < p.sources; i += kCombineThreads) m = fmaxf(m, p.stats[(i * p.rows + row) * 2]);
  const float global_max = block_max(m, scratch);
  float denom = 0.0f;
  if (global_max != -INFINITY) {
    for (int i = tid; i < p.sources; i += kCombineThreads) {
      const float mi = p.stats[(i * p.rows + row) * 2], si = p.stats[(i * p.rows + row) * 2 + 1];
      weight[i] = si * expf(mi - global_max);  // 0 for an empty source (-inf, 0)
      denom += weight[i];
    }
  }
  denom = block_sum(denom, scratch);   // its barriers also publish the weights
  const bool empty = !(denom > 0.0f);  // no keys anywhere: output 0
  // The weights are divided by the sum here, each by the thread that formed it, not in the loop below:
  // there the division's called slow path kept the compiler from issuing a source's load before the one
  // before it had arrived, so a warp's sources were read one L2 round trip after another.
  if (!empty) {
    for (int i = tid; i < p.sources; i += kCombineThreads) weight[i] = weight[i] / denom;
  }
  __syncthreads();
  const int lane = tid & 31, group = tid >> 5;
  const int col = blockIdx.y * kCols + lane * kVec;  // kVec > 1 only when kVec divides V
  float acc[kVec] = {};
  if (!empty && col < p.v_dim) {
    // kBatch of the warp's sources at a time: their parts are all requested before the first is added.
    for (int i0 = group; i0 < p.sources; i0 += kBatch * kCombineGroups) {
      float w[kBatch], v[kBatch][kVec];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u * kCombineGroups;
        w[u] = i < p.sources ? weight[i] : 0.0f;  // normalized; 0: a split without keys wrote no partial
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[u][e] = 0.0f;
        if (w[u] != 0.0f) {  // uniform: a warp shares i
          const float* src = p.parts + (static_cast<int64_t>(i) * p.rows + row) * p.v_dim + col;
          if constexpr (kVec == 4) {
            const float4 x = *reinterpret_cast<const float4*>(src);
            v[u][0] = x.x, v[u][1] = x.y, v[u][2] = x.z, v[u][3] = x.w;
          } else {
            v[u][0] = *src;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (w[u] == 0.0f) continue;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] += w[u] * v[u][e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) group_sum[group][lane * kVec + e] = acc[e];
  __syncthreads();
  const int out_col = blockIdx.y * kCols + tid;
  if (tid < kCols && out_col < p.v_dim) {
    float y = 0.0f;
    for (int k = 0; k < kCombineGroups; ++k) y += group_sum[k][tid];
    p.out[row * p.v_dim + out_col] = y;
  }
  if (p.out_stats != nullptr && blockIdx.y == 0 && tid == 0) {
    p.out_stats[row * 2] = empty ? -INFINITY : global_max;
    p.out_stats[row * 2 + 1] = empty ? 0.0f : denom;
  }
}

void launch_combine(const CombineParams& p, int sm_count, cudaStream_t stream) {
  if (p.rows == 0 || p.v_dim == 0) return;
  const bool vec4 = p.v_dim % 4 == 0 && aligned16(p.parts);
  const size_t smem = p.sources * sizeof(float);
  if (vec4) {
    const dim3 grid(static_cast<unsigned>(p.rows), blocks_for(p.v_dim, 128));
    // Eight sources' loads in flight per warp take 62 registers, four CTAs per SM: a decode token's grid
    // (32 or 96 heads) fits one wave and its chains of round trips get shorter, but batch 8's grids took a
    // second wave (kernel_bench --mla at 64K keys on an H200, against one source at a time with the
    // division in the loop: batch 1 36.8-37.2 -> 34.5-34.7 µs at 32 heads, 63.9-64.1 -> 60.6-61.0 at 96;
    // all grids batched, batch 8 152.2-152.6 -> 153.7-154.1 and 376.1-376.2 -> 383.2-387.9), so larger
    // grids take one source at a time (32 registers; batch 8 151.3-151.9 -> 151.8-152.4 and 376.7-380.2
    // -> 377.8-384.0).
    if (static_cast<int64_t>(grid.x) * grid.y <= 4 * static_cast<int64_t>(sm_count)) {
      launch_pdl(combine_kernel<4, 8>, grid, kCombineThreads, smem, stream, p);
    } else {
      launch_pdl(combine_kernel<4, 1>, grid, kCombineThreads, smem, stream, p);
    }
  } else {
    launch_pdl(combine_kernel<1, 8>, dim3(static_cast<unsigned>(p.rows), blocks_for(p.v_dim, 32)),
               kCombineThreads, smem, stream, p);
  }
  HLM_CHECK_LAUNCH("lse_combine");
}

// --- cache write -------------------------------------------------------------------------------------------
struct CacheWriteParams {
  const void* entries;  // [T, D] BF16 or F32
  bool entries_bf16;
  const int64_t* slots;  // [T]
  bf16* cache;           // [pages·P, D]
  int64_t rows, width, capacity;
};

// One warp per row; a negative slot (another rank's token) skips the row, and so does a slot past the
// cache (the host cannot see device slots; writing there would corrupt other memory).
__global__ void cache_write_kernel(const CacheWriteParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= p.rows) return;
  const int64_t slot = p.slots[row];
  if (slot < 0 || slot >= p.capacity) return;
  bf16* dst = p.cache + slot * p.width;
  for (int64_t d = threadIdx.x & 31; d < p.width; d += 32) {
    const int64_t i = row * p.width + d;
    dst[d] = p.entries_bf16 ? static_cast<const bf16*>(p.entries)[i]
                            : __float2bfloat16_rn(static_cast<const float*>(p.entries)[i]);
  }
}

// --- the fused cache write: mla_cache_write.cuh's row body, one CTA per row
// ----------------------------------
template <class XT, class WT>
__global__ void __launch_bounds__(kCacheWriteThreads) mla_cache_write_kernel(const MlaCacheWriteParams p) {
  mla_cache_write_row<XT, WT>(p, blockIdx.x);
}

}  // namespace

MlaCacheWriteParams mla_cache_write_params(const char* op, const Tensor& ckv, int64_t latent,
                                           const Tensor& norm_w, float eps, const Tensor& slots,
                                           Tensor& cache) {
  expect_cuda(ckv, op, "ckv", {DType::kBF16, DType::kF32}, 2, "[T, L + R]");
  expect_cuda(norm_w, op, "norm_w", {DType::kBF16, DType::kF32}, 1, "[L]");
  expect_cuda(slots, op, "slots", {DType::kI64}, 1, "[T]");
  expect_cuda(cache, op, "cache", {DType::kBF16}, 3, "[pages, P, L + R]");
  HLM_CHECK(latent >= 1 && latent <= ckv.dim(1), "{}: latent width {} outside [1, {}] of ckv {}", op, latent,
            ckv.dim(1), ckv.describe());
  expect_dim(norm_w, 0, latent, op, "norm_w [L]", "the latent width");
  expect_dim(slots, 0, ckv.dim(0), op, "slots [T]", "the row count of ckv [T, L + R]");
  expect_dim(cache, 2, ckv.dim(1), op, "cache [pages, P, L + R]", "the width of ckv [T, L + R]");
  return MlaCacheWriteParams{ckv.raw(),
                             norm_w.raw(),
                             slots.data<int64_t>(),
                             static_cast<bf16*>(cache.raw()),
                             ckv.dim(0),
                             latent,
                             ckv.dim(1),
                             cache.dim(0) * cache.dim(1),
                             eps};
}

void mla_cache_write(CudaContext& ctx, const Tensor& ckv, int64_t latent, const Tensor& norm_w, float eps,
                     const Tensor& slots, Tensor& cache) {
  const MlaCacheWriteParams p =
      mla_cache_write_params("mla_cache_write", ckv, latent, norm_w, eps, slots, cache);
  if (p.rows == 0) return;
  dispatch_float(ckv.dtype(), "mla_cache_write", [&](auto x) {
    dispatch_float(norm_w.dtype(), "mla_cache_write", [&](auto w) {
      launch_pdl(mla_cache_write_kernel<typename decltype(x)::type, typename decltype(w)::type>,
                 static_cast<unsigned>(p.rows), kCacheWriteThreads, 0, ctx.stream(), p);
    });
  });
  HLM_CHECK_LAUNCH("mla_cache_write");
}

void cache_write(CudaContext& ctx, const Tensor& entries, const Tensor& slots, Tensor& cache) {
  const char* op = "cache_write";
  expect_cuda(entries, op, "entries", {DType::kBF16, DType::kF32}, 2, "[T, D]");
  expect_cuda(slots, op, "slots", {DType::kI64}, 1, "[T]");
  expect_cuda(cache, op, "cache", {DType::kBF16}, 3, "[pages, P, D]");
  expect_dim(slots, 0, entries.dim(0), op, "slots [T]", "the row count of entries [T, D]");
  expect_dim(cache, 2, entries.dim(1), op, "cache [pages, P, D]", "the width of entries [T, D]");
  CacheWriteParams p{entries.raw(),
                     entries.dtype() == DType::kBF16,
                     slots.data<int64_t>(),
                     static_cast<bf16*>(cache.raw()),
                     entries.dim(0),
                     entries.dim(1),
                     cache.dim(0) * cache.dim(1)};
  if (p.rows == 0) return;
  constexpr int kRowsPerBlock = 8;
  launch_pdl(cache_write_kernel, blocks_for(p.rows, kRowsPerBlock), kRowsPerBlock * 32, 0, ctx.stream(), p);
  HLM_CHECK_LAUNCH("cache_write");
}

void mla_attention(CudaContext& ctx, const Tensor& q, const Tensor& cache, const Tensor& page_table,
                   const MlaBatch& seqs, const Tensor& kv_len, float scale, int64_t v_dim, Tensor& out,
                   Tensor& stats) {
  const char* op = "mla_attention";
  expect_cuda(q, op, "q", {DType::kBF16, DType::kF32}, 3, "[T, H, D]");
  expect_cuda(cache, op, "cache", {DType::kBF16}, 3, "[pages, P, D]");
  expect_cuda(page_table, op, "page_table", {DType::kI32}, 1, "[N]");
  expect_cuda(kv_len, op, "kv_len", {DType::kI32}, 1, "[T]");
  const int64_t tokens = q.dim(0), heads = q.dim(1), dim = q.dim(2);
  const int64_t num_seqs = static_cast<int64_t>(seqs.seqs.size());
  expect_dim(cache, 2, dim, op, "cache [pages, P, D]", "the query width of q [T, H, D]");
  expect_dim(kv_len, 0, tokens, op, "kv_len [T]", "the query count of q [T, H, D]");
  HLM_CHECK(v_dim >= 1 && v_dim <= dim, "mla_attention: v_dim {} must be in [1, {}] (the cache row width)",
            v_dim, dim);
  HLM_CHECK(dim % 8 == 0, "mla_attention: the row width D = {} must be a multiple of 8 (16-byte cache rows)",
            dim);
  HLM_CHECK(cache.dim(1) >= 1, "mla_attention: the cache {} has empty pages", cache.describe());
  // The kernel ranks raw scores (q·k) and scales them afterwards, which needs a positive scale.
  HLM_CHECK(scale > 0.0f && std::isfinite(scale),
            "mla_attention: the softmax scale must be positive and finite, got {}", scale);
  HLM_CHECK(aligned16(q.raw()) && aligned16(cache.raw()),
            "mla_attention: q and the cache must start on 16-byte boundaries");
  HLM_CHECK(tokens * heads <= (int64_t{1} << 30) && cache.dim(0) * cache.dim(1) <= INT32_MAX &&
                page_table.dim(0) <= INT32_MAX,
            "mla_attention: {} query rows of {} heads or a cache of {} slots exceed the 32-bit indexing",
            tokens, heads, cache.dim(0) * cache.dim(1));
  // The kernel's two instantiations: the fixtures' widths, and Kimi Linear's / K3's.
  const bool wide = dim > 128 || v_dim > 128;
  HLM_CHECK(!wide || (dim <= 576 && v_dim <= 512),
            "mla_attention: D = {}, v_dim = {} is not supported (D <= 128 and v_dim <= 128, or D <= 576 and "
            "v_dim <= 512)",
            dim, v_dim);
  for (int64_t i = 0; i < num_seqs; ++i) {
    const MlaSeq& s = seqs.seqs[i];
    HLM_CHECK(s.token_begin >= 0 && s.token_count >= 0 && s.token_begin + s.token_count <= tokens,
              "mla_attention: sequence {} covers query rows [{}, {}), outside the {} rows of q", i,
              s.token_begin, s.token_begin + s.token_count, tokens);
    HLM_CHECK(s.page_begin >= 0 && s.num_pages >= 0 && s.page_begin + s.num_pages <= page_table.dim(0),
              "mla_attention: sequence {} lists page_table entries [{}, {}), outside the {} entries", i,
              s.page_begin, s.page_begin + s.num_pages, page_table.dim(0));
  }
  if (num_seqs > 0) {
    expect_cuda(seqs.table, op, "the batch table", {DType::kI32}, 2, "[S, 4]");
    expect_dim(seqs.table, 0, num_seqs, op, "the batch table [S, 4]", "the number of sequences");
    expect_dim(seqs.table, 1, 4, op, "the batch table [S, 4]",
               "token_begin, token_count, page_begin, num_pages");
  }
  prepare_output(ctx, out, {tokens, heads, v_dim}, DType::kF32, op, "out");
  prepare_output(ctx, stats, {tokens, heads, 2}, DType::kF32, op, "stats");
  if (tokens == 0) return;

  // Row blocks of two warpgroups (64 rows) where a sequence may have more than 32 rows: more than 32 heads
  // (K3), or more tokens than sequences (prefill chunks); each key tile is then loaded once for 64 rows.
  // Measured on an H200 against 32-row blocks (kernel_bench, one call): the absorbed prefill of 8,192
  // queries 8.51 -> 6.19 ms; K3's 96 heads over 64K keys 423 -> 388 µs at batch 8, but 62.5 -> 65.8 at batch
  // 1 (66 splits instead of 44, so half again the partials to combine); K3's first 4 layers at 128K and 1M
  // keys, batch 1 and 8, 2-4% faster per step.
  const int64_t block_rows = heads > kMlaRows || tokens > num_seqs ? 2 * kMlaRows : kMlaRows;
  // Row-block slots: an upper bound on Σ_s ceil(count_s·H / block_rows) from host shapes only (a sequence's
  // blocks cover at most ceil(H / block_rows) per token, and Σ_s ceil(x_s) < Σ_s x_s + S). Whenever a token
  // is outside every sequence the bound leaves at least one spare slot to zero it. Splits fill the SMs, even
  // when a short context leaves some of them without a tile: measured on an H200 and dropped, each split
  // taking at least 2, 4 or 8 of the 64-key tiles (fewer partials for the combine): the 48B's MLA layer at
  // 4K, batch 1, 50.6 µs with one tile against 50.6 / 54.3 / 62.2 (--layer-split), at 16K 58.9 against
  // 57.4 / 57.3 / 64.0, the 4K batch-8 step unchanged.
  const int64_t per_token = (heads + block_rows - 1) / block_rows;
  const int64_t slots =
      std::min(tokens * per_token, num_seqs + (tokens * heads + block_rows - 1) / block_rows);
  const int64_t splits = std::max<int64_t>(1, ctx.sm_count() / slots);
  HLM_CHECK(slots <= INT32_MAX, "mla_attention: {} row blocks exceed the grid", slots);

  MlaParams p{};
  p.q = q.raw();
  p.cache = static_cast<const bf16*>(cache.raw());
  p.page_table = page_table.data<int32_t>();
  p.seqs = num_seqs > 0 ? seqs.table.data<int32_t>() : nullptr;
  p.kv_len = kv_len.data<int32_t>();
  p.cache_pages = cache.dim(0);
  p.tokens = static_cast<int>(tokens);
  p.heads = static_cast<int>(heads);
  p.dim = static_cast<int>(dim);
  p.v_dim = static_cast<int>(v_dim);
  p.page_size = static_cast<int>(cache.dim(1));
  p.page_shift = -1;
  for (int b = 0; b < 31 && p.page_shift < 0; ++b) {
    if (p.page_size == 1 << b) p.page_shift = b;
  }
  p.num_seqs = static_cast<int>(num_seqs);
  p.page_table_len = static_cast<int>(page_table.dim(0));
  p.splits = static_cast<int>(splits);
  p.block_rows = static_cast<int>(block_rows);
  p.scale = scale;
  Tensor part_out, part_stats;  // [splits, T·H, v_dim], [splits, T·H, 2]
  if (splits > 1) {
    part_out = ctx.empty({splits, tokens * heads, v_dim}, DType::kF32);
    part_stats = ctx.empty({splits, tokens * heads, 2}, DType::kF32);
    p.out = part_out.data<float>();
    p.stats = part_stats.data<float>();
  } else {
    p.out = out.data<float>();
    p.stats = stats.data<float>();
  }
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(splits));
  const bool bf16_q = q.dtype() == DType::kBF16;
  launch_mla_attention(p, grid, bf16_q, wide, ctx.stream());
  if (splits > 1) {
    launch_combine(CombineParams{p.out, p.stats, out.data<float>(), stats.data<float>(), tokens * heads,
                                 p.v_dim, p.splits},
                   ctx.sm_count(), ctx.stream());
  }
}

Tensor lse_combine(CudaContext& ctx, const Tensor& parts, const Tensor& stats) {
  const char* op = "lse_combine";
  expect_cuda(parts, op, "parts", {DType::kF32}, 4, "[R, T, H, V]");
  expect_cuda(stats, op, "stats", {DType::kF32}, 4, "[R, T, H, 2]");
  for (int i = 0; i < 3; ++i) {
    expect_dim(stats, i, parts.dim(i), op, "stats [R, T, H, 2]", "the same dimension of parts [R, T, H, V]");
  }
  expect_dim(stats, 3, 2, op, "stats [R, T, H, 2]", "the (max, sum) pair");
  const int64_t sources = parts.dim(0), rows = parts.dim(1) * parts.dim(2), v_dim = parts.dim(3);
  HLM_CHECK(sources <= kMaxCombineSources && v_dim <= int64_t{65535} * 32,
            "lse_combine: {} sources of width {} (at most {} sources of width {})", sources, v_dim,
            kMaxCombineSources, 65535 * 32);
  if (sources == 0) return ctx.zeros({parts.dim(1), parts.dim(2), v_dim}, DType::kF32);
  Tensor y = ctx.empty({parts.dim(1), parts.dim(2), v_dim}, DType::kF32);  // [T, H, V]
  launch_combine(CombineParams{parts.data<float>(), stats.data<float>(), y.data<float>(), nullptr, rows,
                               static_cast<int>(v_dim), static_cast<int>(sources)},
                 ctx.sm_count(), ctx.stream());
  return y;
}

}  // namespace hlm::cuda
