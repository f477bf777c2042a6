// The expanded (MHA) form of MLA for long prefill chunks on the GPU (docs/MODEL.md §6.1, docs/KERNELS.md
// §6). Per (query, key, head) the absorbed form (mla_attention.cu) costs 2·(576 + 512) FLOP against
// 2·(192 + 128) here. For a chunk of many queries the layer instead gathers a chunk of the sequence's latent
// rows (mla_gather_keys), expands them per head with two GEMMs (k_nope = c·W_UKᵀ, v = c·W_UVᵀ), and runs
// this FlashAttention-style kernel over them.
//
// A CTA is one warpgroup owning 64 consecutive queries of one head (two CTAs per SM). Tiles of 64 keys (K =
// [k_nope of the head | the shared rope columns], V) stream through a ring of two shared-memory stages with
// cp.async, in the 128-byte swizzle of wgmma's operands; per tile, S = Q·Kᵀ by wgmma from shared memory
// (fp32), the online softmax in registers (a row in one quad of lanes), and O += P·V by wgmma with P rounded
// to bf16 straight from the S accumulators as the register operand. Keys past the CTA's last visible key
// are zero-filled, never read, so padding or stale cache rows cannot turn into NaN; causality is kv_len per
// row. CTAs are ordered longest rows first. With merge the result is combined with the earlier chunks'
// (out, stats) as lse_combine does. (The mma.sync kernel this replaced, FlashAttention-2-style with 256
// rows per CTA, ran the 8K x 8K causal attention of 32 heads at 290 TFLOP/s: docs/benchmarks.md.)
#include <cmath>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/wgmma.cuh"

namespace hlm::cuda {

namespace {

constexpr int kKeys = 64;      // keys per tile: the N of S
constexpr int kRows = 64;      // queries of one head per CTA: the M of both products
constexpr int kThreads = 128;  // one warpgroup
constexpr float kLog2e = 1.4426950408889634f;

// One head shape: nope, R and V exactly (loops and offsets fold to constants), each held in whole 64-column
// swizzle blocks (columns past them zero-filled): Q and K tiles are [nope blocks | rope blocks] x 64 rows,
// V tiles [V blocks] x 64 keys, 8 KB per block.
template <int Nope_, int Rope_, int V_>
struct ExpandedShape {
  static constexpr int kNope = Nope_;
  static constexpr int kRope = Rope_;
  static constexpr int kVd = V_;
  static constexpr int kNopeBlocks = (kNope + 63) / 64;
  static constexpr int kQkBlocks = kNopeBlocks + (kRope + 63) / 64;
  static constexpr int kVBlocks = (kVd + 63) / 64;
  static constexpr uint32_t kBlockBytes = 64 * 128;
  static_assert(kNope % 8 == 0 && kRope % 8 == 0 && kVd % 8 == 0, "16-byte rows");
  // Dynamic shared memory: Q, then two stages of {K, V}; plus slack to align the base to 1024 bytes.
  static constexpr uint32_t kStageBytes = (kQkBlocks + kVBlocks) * kBlockBytes;
  static constexpr uint32_t kStageOffset = kQkBlocks * kBlockBytes;
  static constexpr size_t kSmemBytes = kStageOffset + 2 * kStageBytes + 1024;
};
using ExpandedKimi = ExpandedShape<128, 64, 128>;  // Kimi Linear and K3
using ExpandedFixture = ExpandedShape<16, 8, 16>;  // the test fixtures

struct ExpandedParams {
  const void* q;       // [T, H, qk] BF16 or F32
  const bf16* k_nope;  // [N, H, nope]
  const bf16* v;       // [N, H, vd]
  const bf16* keys;    // [N, width]; the rope columns are [latent, latent + rope)
  const int* kv_len;   // [T]
  float* out;          // [T, H, vd]
  float* stats;        // [T, H, 2]
  int tokens, heads, n, width, latent, key_begin;
  float scale;
  bool merge;
};

// Grid (heads, ceil(T / kRows)), kThreads threads, two CTAs per SM. A CTA owns queries [row0, row0 + 64) of
// one head, longest rows (causal) first. Per tile of 64 keys: the cp.async ring of two stages (K = [k_nope
// of the head | the shared rope columns] and V, swizzled; keys past the CTA's last visible key and columns
// past the head's widths are zero-filled, never read, so padding or stale cache rows cannot turn into NaN),
// S = Q·Kᵀ by wgmma from shared memory, the online softmax in registers (a row lives in one quad of lanes),
// and O += P·V by wgmma with P straight from the S accumulators as the register operand and V MN-major.
// Thread (warp w, lane 4g + t) holds rows 16w + g and + 8, keys / value columns 8j + 2t (+1).
template <class Shape, class TQ>
__global__ void __launch_bounds__(kThreads, 2) mla_expanded_kernel(const ExpandedParams p) {
  constexpr int kNB = Shape::kNopeBlocks, kQB = Shape::kQkBlocks, kVB = Shape::kVBlocks;
  constexpr uint32_t kBlock = Shape::kBlockBytes;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  unsigned char* q_s = smem;  // [kQB][64 rows][128 B]
  __shared__ int visible_max;

  const int head = blockIdx.x;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * kRows;  // the longest rows (causal) first
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t2 = 2 * (lane & 3);
  const auto visible_of = [&](int t) {
    return t < p.tokens ? min(max(p.kv_len[t] - p.key_begin, 0), p.n) : 0;
  };
  if (tid == 0) visible_max = 0;
  // Q rows of this head as bf16, zero past the tokens and past each part's width.
  {
    const int qk = Shape::kNope + Shape::kRope;
    for (int i = tid; i < kRows * kQB * 8; i += kThreads) {
      const int chunk = i & 7, r = (i >> 3) % kRows, blk = i / (8 * kRows), t = row0 + r;
      const bool nope = blk < kNB;
      const int col = (nope ? blk : blk - kNB) * 64 + chunk * 8;  // within the part
      uint4 v = make_uint4(0, 0, 0, 0);
      if (t < p.tokens && col < (nope ? Shape::kNope : Shape::kRope)) {
        const TQ* src = static_cast<const TQ*>(p.q) + (static_cast<int64_t>(t) * p.heads + head) * qk +
                        (nope ? 0 : Shape::kNope) + col;
        if constexpr (sizeof(TQ) == 2) {
          v = *reinterpret_cast<const uint4*>(src);
        } else {
          const uint4* s4 = reinterpret_cast<const uint4*>(src);
          v = f32x8_to_bf16(s4[0], s4[1]);
        }
      }
      *reinterpret_cast<uint4*>(q_s + sw128_offset(r, blk * 64 + chunk * 8, kRows)) = v;
    }
    fence_proxy_async();
  }
  __syncthreads();
  for (int i = tid; i < kRows; i += kThreads) atomicMax(&visible_max, visible_of(row0 + i));
  int vis[2];  // this lane's rows: 16w + g and + 8
  vis[0] = visible_of(row0 + 16 * warp + g);
  vis[1] = visible_of(row0 + 16 * warp + g + 8);
  const int vis_min = min(vis[0], vis[1]);
  __syncthreads();
  const int limit = visible_max;
  const int tiles = (limit + kKeys - 1) / kKeys;

  // Tile copy: 16-byte chunk tid % 8 of keys tid / 8 + 16i, i < 4, in every block of K and V.
  const int copy_chunk = tid & 7, copy_key = tid >> 3;
  const unsigned copy_dst =
      smem_addr(smem) + Shape::kStageOffset + sw128_offset(copy_key, copy_chunk * 8, kKeys);
  auto load_tile = [&](int tile, int stage) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = tile * kKeys + copy_key + 16 * i;
      const bool valid = key < limit;
      const int64_t kh = static_cast<int64_t>(valid ? key : 0) * p.heads + head;
      const unsigned dst = copy_dst + stage * Shape::kStageBytes + i * 16 * 128;
#pragma unroll
      for (int blk = 0; blk < kQB + kVB; ++blk) {
        const bf16* src;
        bool chunk;
        if (blk < kNB) {
          const int col = blk * 64 + copy_chunk * 8;
          chunk = valid && col < Shape::kNope;
          src = p.k_nope + kh * Shape::kNope + col;
        } else if (blk < kQB) {
          const int col = (blk - kNB) * 64 + copy_chunk * 8;
          chunk = valid && col < Shape::kRope;
          src = p.keys + static_cast<int64_t>(valid ? key : 0) * p.width + p.latent + col;
        } else {
          const int col = (blk - kQB) * 64 + copy_chunk * 8;
          chunk = valid && col < Shape::kVd;
          src = p.v + kh * Shape::kVd + col;
        }
        cp_async16(dst + blk * kBlock, chunk ? src : p.v, chunk);
      }
    }
  };
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    if (s < tiles) load_tile(s, s);
    cp_async_commit();
  }

  float o[kVB][32];  // O [64 rows, 64 value columns of block vb]
#pragma unroll
  for (int vb = 0; vb < kVB; ++vb) {
#pragma unroll
    for (int e = 0; e < 32; ++e) o[vb][e] = 0.0f;
  }
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // raw-score max; this lane's Σ share
  const float scale_log2 = p.scale * kLog2e;
  const uint64_t q_desc = sw128_desc(q_s);
  for (int j = 0; j < tiles; ++j) {
    const int stage = j & 1;
    unsigned char* k_s = smem + Shape::kStageOffset + stage * Shape::kStageBytes;
    const uint64_t k_desc = sw128_desc(k_s), v_desc = sw128_desc(k_s + kQB * kBlock);
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();

    float s[32];  // S [64 rows, 64 keys]: s[4j + v0 + 2v1] is row 16w + g + 8v1, key 8j + t2 + v0
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQB * 4; ++kk) {
      const uint32_t off = ((kk >> 2) * kBlock + (kk & 3) * 32) >> 4;
      wgmma_m64n64k16_ss(s, q_desc + off, k_desc + off, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s);

    const int kb = j * kKeys;
    if (kb + kKeys > vis_min) {  // the tile reaches past a row's last visible key
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int key = kb + (e >> 2) * 8 + t2 + (e & 1);
        if (key >= vis[(e >> 1) & 1]) s[e] = -INFINITY;
      }
    }
    float alpha[2], base[2];
    bool rescale = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m_run[r];
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) mx = fmaxf(mx, fmaxf(s[4 * jj + 2 * r], s[4 * jj + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with no visible key yet keeps max -inf: subtract 0 instead, so every exp is of -inf (0).
      base[r] = mx == -INFINITY ? 0.0f : mx * scale_log2;
      alpha[r] = exp2_approx(m_run[r] * scale_log2 - base[r]);
      m_run[r] = mx;
      l_run[r] *= alpha[r];
      rescale = rescale || alpha[r] != 1.0f;
    }
    // Past the first tiles a row's max rarely moves: alpha is then exactly 1 and the warp skips the rescale.
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int vb = 0; vb < kVB; ++vb) {
#pragma unroll
        for (int e = 0; e < 32; ++e) o[vb][e] *= alpha[(e >> 1) & 1];
      }
    }
    uint32_t a[4][4];  // P as the A operand of k-step ks (keys 16ks..): S of key groups 2ks and 2ks + 1
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      s[e] = exp2_approx(fmaf(s[e], scale_log2, -base[(e >> 1) & 1]));
      l_run[(e >> 1) & 1] += s[e];
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      a[ks][0] = pack_bf16x2(s[8 * ks + 0], s[8 * ks + 1]);
      a[ks][1] = pack_bf16x2(s[8 * ks + 2], s[8 * ks + 3]);
      a[ks][2] = pack_bf16x2(s[8 * ks + 4], s[8 * ks + 5]);
      a[ks][3] = pack_bf16x2(s[8 * ks + 6], s[8 * ks + 7]);
    }
    wgmma_fence();
#pragma unroll
    for (int vb = 0; vb < kVB; ++vb) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        wgmma_m64n64k16_rs(o[vb], a[ks], v_desc + ((vb * kBlock + ks * 16 * 128) >> 4));
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int vb = 0; vb < kVB; ++vb) fence_operands(o[vb]);
    __syncthreads();  // every warp is done with this stage before it is refilled
    if (j + 2 < tiles) load_tile(j + 2, stage);
    cp_async_commit();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  // With merge, every lane reads the earlier chunks' stats of its rows before the row's first lane
  // overwrites them.
  float2 old[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + 16 * warp + g + 8 * r;
    old[r] = p.merge && t < p.tokens
                 ? *reinterpret_cast<const float2*>(p.stats + (static_cast<int64_t>(t) * p.heads + head) * 2)
                 : make_float2(-INFINITY, 0.0f);
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + 16 * warp + g + 8 * r;
    if (t >= p.tokens) continue;
    const float sum = l_run[r];
    const float max_logit = sum > 0.0f ? m_run[r] * p.scale : -INFINITY;
    const int64_t row = static_cast<int64_t>(t) * p.heads + head;
    float* dst = p.out + row * Shape::kVd;
    float2* st = reinterpret_cast<float2*>(p.stats + row * 2);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    // lse_combine over (earlier chunks, this chunk); without merge the earlier part has weight 0.
    const float m = fmaxf(old[r].x, max_logit);
    const float w0 = m == -INFINITY ? 0.0f : old[r].y * expf(old[r].x - m);
    const float w1 = m == -INFINITY ? 0.0f : sum * expf(max_logit - m);
    const float denom = w0 + w1;
    if (p.merge && m == -INFINITY) continue;  // no key in either: stays 0, (-inf, 0)
#pragma unroll
    for (int vb = 0; vb < kVB; ++vb) {
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int col = vb * 64 + jj * 8 + t2;
        if (col >= Shape::kVd) continue;
        const float x0 = o[vb][4 * jj + 2 * r] * inv, x1 = o[vb][4 * jj + 2 * r + 1] * inv;
        float2 y;
        if (!p.merge) {
          y = make_float2(x0, x1);
        } else {
          y = make_float2(0.0f, 0.0f);
          if (w0 != 0.0f) {
            const float2 prev = *reinterpret_cast<const float2*>(dst + col);
            y.x += w0 / denom * prev.x;
            y.y += w0 / denom * prev.y;
          }
          if (w1 != 0.0f) {
            y.x += w1 / denom * x0;
            y.y += w1 / denom * x1;
          }
        }
        *reinterpret_cast<float2*>(dst + col) = y;
      }
    }
    if ((lane & 3) == 0) *st = p.merge ? make_float2(m, denom) : make_float2(max_logit, sum);
  }
}

template <class Shape, class TQ>
void launch_mla_expanded(const ExpandedParams& p, cudaStream_t stream) {
  // Above 48 KB a kernel must opt in to its dynamic shared memory; once per instantiation.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      mla_expanded_kernel<Shape, TQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes);
  HLM_CUDA_CHECK(opt_in);
  const dim3 grid(static_cast<unsigned>(p.heads), blocks_for(p.tokens, kRows));
  mla_expanded_kernel<Shape, TQ><<<grid, kThreads, Shape::kSmemBytes, stream>>>(p);
  HLM_CHECK_LAUNCH("mla_expanded_attention");
}

struct GatherParams {
  const bf16* cache;      // [pages, P, D]
  const int* page_table;  // the sequence's entries
  bf16* keys;             // [N, D]
  int64_t cache_pages;
  int page_size, width, key_begin, count;
};

// One warp per key row, 16-byte chunks. A page id outside the cache (the device table is not the host's
// checked copy under every caller) gives a zero row instead of a read outside the cache.
__global__ void gather_keys_kernel(const GatherParams p) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= p.count) return;
  const int key = p.key_begin + row;
  const int page = p.page_table[key / p.page_size];
  const bool valid = page >= 0 && page < p.cache_pages;
  const uint4* src = reinterpret_cast<const uint4*>(
      p.cache + (static_cast<int64_t>(valid ? page : 0) * p.page_size + key % p.page_size) * p.width);
  uint4* dst = reinterpret_cast<uint4*>(p.keys + static_cast<int64_t>(row) * p.width);
  for (int c = threadIdx.x % 32; c < p.width / 8; c += 32) dst[c] = valid ? src[c] : make_uint4(0, 0, 0, 0);
}

}  // namespace

Tensor mla_gather_keys(CudaContext& ctx, const Tensor& cache, const Tensor& page_table, const MlaSeq& seq,
                       int64_t key_begin, int64_t count) {
  const char* op = "mla_gather_keys";
  expect_cuda(cache, op, "cache", {DType::kBF16}, 3, "[pages, P, D]");
  expect_cuda(page_table, op, "page_table", {DType::kI32}, 1, "[N]");
  check_mla_gather_keys(cache, page_table, seq, key_begin, count);
  const int64_t page_size = cache.dim(1), width = cache.dim(2);
  HLM_CHECK(width % 8 == 0, "mla_gather_keys: the row width D = {} must be a multiple of 8 (16-byte rows)",
            width);
  HLM_CHECK(key_begin + count <= INT32_MAX, "mla_gather_keys: key {} exceeds the 32-bit indexing",
            key_begin + count);
  Tensor keys = ctx.empty({count, width}, DType::kBF16);  // [N, D]
  if (count == 0) return keys;
  const GatherParams p{static_cast<const bf16*>(cache.raw()), page_table.data<int32_t>() + seq.page_begin,
                       static_cast<bf16*>(keys.raw()),        cache.dim(0),
                       static_cast<int>(page_size),           static_cast<int>(width),
                       static_cast<int>(key_begin),           static_cast<int>(count)};
  constexpr int kRowsPerBlock = 8;
  gather_keys_kernel<<<blocks_for(count, kRowsPerBlock), kRowsPerBlock * 32, 0, ctx.stream()>>>(p);
  HLM_CHECK_LAUNCH("mla_gather_keys");
  return keys;
}

void mla_expanded_attention(CudaContext& ctx, const Tensor& q, const Tensor& k_nope, const Tensor& v,
                            const Tensor& keys, int64_t latent, const Tensor& kv_len, int64_t key_begin,
                            float scale, bool merge, Tensor& out, Tensor& stats) {
  const char* op = "mla_expanded_attention";
  expect_cuda(q, op, "q", {DType::kBF16, DType::kF32}, 3, "[T, H, nope + R]");
  expect_cuda(k_nope, op, "k_nope", {DType::kBF16}, 3, "[N, H, nope]");
  expect_cuda(v, op, "v", {DType::kBF16}, 3, "[N, H, V]");
  expect_cuda(keys, op, "keys", {DType::kBF16}, 2, "[N, L + R]");
  expect_cuda(kv_len, op, "kv_len", {DType::kI32}, 1, "[T]");
  const int64_t tokens = q.dim(0), heads = q.dim(1), qk = q.dim(2), n = k_nope.dim(0), nope = k_nope.dim(2);
  const int64_t vd = v.dim(2), rope = qk - nope;
  check_mla_expanded_attention(q, k_nope, v, keys, latent, kv_len, key_begin, merge, out, stats);
  HLM_CHECK(
      mla_expanded_heads_supported(nope, rope, vd),
      "mla_expanded_attention: heads (nope, R, V) = ({}, {}, {}) are not supported ((128, 64, 128) or (16, "
      "8, 16))",
      nope, rope, vd);
  HLM_CHECK(latent % 8 == 0, "mla_expanded_attention: L = {} must be a multiple of 8 (16-byte rows)", latent);
  HLM_CHECK(key_begin >= 0 && key_begin + n <= INT32_MAX && tokens * heads <= INT32_MAX,
            "mla_expanded_attention: keys [{}, {}) or {} query rows exceed the 32-bit indexing", key_begin,
            key_begin + n, tokens * heads);
  for (const Tensor* t : {&q, &k_nope, &v, &keys}) {
    HLM_CHECK(aligned16(t->raw()), "mla_expanded_attention: {} must start on a 16-byte boundary",
              t->describe());
  }
  prepare_output(ctx, out, {tokens, heads, vd}, DType::kF32, op, "out");
  prepare_output(ctx, stats, {tokens, heads, 2}, DType::kF32, op, "stats");
  if (tokens == 0 || heads == 0) return;

  ExpandedParams p{};
  p.q = q.raw();
  p.k_nope = static_cast<const bf16*>(k_nope.raw());
  p.v = static_cast<const bf16*>(v.raw());
  p.keys = static_cast<const bf16*>(keys.raw());
  p.kv_len = kv_len.data<int32_t>();
  p.out = out.data<float>();
  p.stats = stats.data<float>();
  p.tokens = static_cast<int>(tokens);
  p.heads = static_cast<int>(heads);
  p.n = static_cast<int>(n);
  p.width = static_cast<int>(keys.dim(1));
  p.latent = static_cast<int>(latent);
  p.key_begin = static_cast<int>(key_begin);
  p.scale = scale;
  p.merge = merge;
  const bool kimi = nope == ExpandedKimi::kNope, bf16_q = q.dtype() == DType::kBF16;
  switch ((kimi ? 2 : 0) + (bf16_q ? 1 : 0)) {
    case 0:
      launch_mla_expanded<ExpandedFixture, float>(p, ctx.stream());
      break;
    case 1:
      launch_mla_expanded<ExpandedFixture, bf16>(p, ctx.stream());
      break;
    case 2:
      launch_mla_expanded<ExpandedKimi, float>(p, ctx.stream());
      break;
    default:
      launch_mla_expanded<ExpandedKimi, bf16>(p, ctx.stream());
      break;
  }
}

}  // namespace hlm::cuda
