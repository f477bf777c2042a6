// The expanded (MHA) form of MLA for long prefill chunks on the GPU (docs/MODEL.md §6.1, docs/KERNELS.md
// §6). Per (query, key, head) the absorbed form costs 2·(576 + 512) FLOP against 2·(192 + 128) here, and
// the absorbed kernel (mla.cu) is shaped for decode: 32 rows per CTA sharing each key tile, the softmax
// through shared memory. For a chunk of many queries the layer instead gathers a chunk of the sequence's
// latent rows (mla_gather_keys), expands them per head with two GEMMs (k_nope = c·W_UKᵀ, v = c·W_UVᵀ),
// and runs this FlashAttention-2-style kernel over them.
//
// A CTA owns consecutive queries of one head: 8 warps of 32 rows (two m16 tiles per warp share every K and
// V fragment it reads from shared memory, Q read from shared memory per k-step), or for chunks too short
// to fill the GPU with 256-row CTAs, 4 warps of 16 rows with Q held in registers. Tiles of 64 keys (K =
// [k_nope of the head | the shared rope columns], V) stream through a ring of two shared-memory stages with
// cp.async; per tile a warp computes S = Q·Kᵀ (fp32), the online softmax in registers (4 lanes per row), and
// O += P·V with P rounded to bf16 straight from the S accumulators. Keys past the CTA's last visible key are
// zero-filled, never read, so padding or stale cache rows cannot turn into NaN; causality is kv_len per row.
// CTAs are ordered longest rows first. With merge the result is combined with the earlier chunks' (out,
// stats) as lse_combine does.
#include <cmath>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mma.cuh"

namespace hlm::cuda {

namespace {

constexpr int kKeys = 64;  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;

// One head shape: nope, R and V exactly (loops and offsets fold to constants); kQk = nope + R and kV = V
// rounded up to 16 (an mma k-step; a pair of n8 tiles), the columns past them zero in shared memory.
template <int Nope_, int Rope_, int V_, int M_, int Warps_>
struct ExpandedShape {
  static constexpr int kM = M_;  // m16 row tiles per warp
  static constexpr int kWarps = Warps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = 16 * kM * kWarps;  // queries of one head per CTA
  static constexpr int kNope = Nope_;
  static constexpr int kRope = Rope_;
  static constexpr int kVd = V_;
  static constexpr int kQk = (kNope + kRope + 15) / 16 * 16;
  static constexpr int kV = (kVd + 15) / 16 * 16;
  static constexpr int kLdK =
      kQk + 8;  // bf16 row stride of Q and K tiles: +16 B keeps ldmatrix conflict-free
  static constexpr int kLdV = kV + 8;
  static_assert(kNope % 8 == 0 && kRope % 8 == 0 && kVd % 8 == 0, "16-byte rows");
  // Dynamic shared memory: two stages of {K [kKeys][kLdK], V [kKeys][kLdV]} bf16, then Q [kRows][kLdK].
  static constexpr size_t kKBytes = size_t{kKeys} * kLdK * 2;
  static constexpr size_t kStageBytes = kKBytes + size_t{kKeys} * kLdV * 2;
  static constexpr size_t kQOffset = 2 * kStageBytes;
  static constexpr size_t kSmemBytes = kQOffset + size_t{kRows} * kLdK * 2;
};
using ExpandedKimiWide = ExpandedShape<128, 64, 128, 2, 8>;  // Kimi Linear and K3: 256 rows per CTA
using ExpandedKimi = ExpandedShape<128, 64, 128, 1, 4>;      // the same heads, 64 rows per CTA
using ExpandedFixture = ExpandedShape<16, 8, 16, 1, 4>;      // the test fixtures

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

__device__ __forceinline__ void store_zero16(bf16* p) {
  *reinterpret_cast<uint4*>(p) = make_uint4(0, 0, 0, 0);
}

// Q rows [row0, row0 + kRows) of `head` into shared memory as bf16, zero past the tokens and past qk.
template <class Shape, class TQ>
__device__ void load_queries(const ExpandedParams& p, int head, int row0, bf16* q_s) {
  constexpr int kChunks = Shape::kQk / 8, qk = Shape::kNope + Shape::kRope;
#pragma unroll
  for (int i = threadIdx.x; i < Shape::kRows * kChunks; i += Shape::kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8, t = row0 + r;
    bf16* dst = q_s + r * Shape::kLdK + c;
    if (t < p.tokens && c < qk) {
      const TQ* src = static_cast<const TQ*>(p.q) + (static_cast<int64_t>(t) * p.heads + head) * qk + c;
      if constexpr (sizeof(TQ) == 2) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      } else {
        const uint4* s4 = reinterpret_cast<const uint4*>(src);
        *reinterpret_cast<uint4*>(dst) = f32x8_to_bf16(s4[0], s4[1]);
      }
    } else {
      store_zero16(dst);
    }
  }
}

// Keys [kb, kb + kKeys) of `head` into a stage; keys at or past `limit` are zero-filled without a read.
template <class Shape>
__device__ __forceinline__ void load_tile(const ExpandedParams& p, int head, int kb, int limit, bf16* k_s,
                                          bf16* v_s) {
  constexpr int kNopeChunks = Shape::kNope / 8, kRopeChunks = Shape::kRope / 8, kVChunks = Shape::kVd / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kKeys * kNopeChunks; i += Shape::kThreads) {
    const int r = i / kNopeChunks, c = (i % kNopeChunks) * 8, key = kb + r;
    const bool valid = key < limit;
    const bf16* src =
        valid ? p.k_nope + (static_cast<int64_t>(key) * p.heads + head) * Shape::kNope + c : p.k_nope;
    cp_async16(k_s + r * Shape::kLdK + c, src, valid);
  }
#pragma unroll
  for (int i = threadIdx.x; i < kKeys * kRopeChunks; i += Shape::kThreads) {
    const int r = i / kRopeChunks, c = (i % kRopeChunks) * 8, key = kb + r;
    const bool valid = key < limit;
    const bf16* src = valid ? p.keys + static_cast<int64_t>(key) * p.width + p.latent + c : p.keys;
    cp_async16(k_s + r * Shape::kLdK + Shape::kNope + c, src, valid);
  }
#pragma unroll
  for (int i = threadIdx.x; i < kKeys * kVChunks; i += Shape::kThreads) {
    const int r = i / kVChunks, c = (i % kVChunks) * 8, key = kb + r;
    const bool valid = key < limit;
    const bf16* src = valid ? p.v + (static_cast<int64_t>(key) * p.heads + head) * Shape::kVd + c : p.v;
    cp_async16(v_s + r * Shape::kLdV + c, src, valid);
  }
}

template <class Shape, class TQ>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kM == 1 ? 2 : 1)
    mla_expanded_kernel(const ExpandedParams p) {
  constexpr int kQk = Shape::kQk, kV = Shape::kV, kLdK = Shape::kLdK, kLdV = Shape::kLdV, kM = Shape::kM;
  constexpr int kThreads = Shape::kThreads, kRows = Shape::kRows;
  constexpr int kKSteps = kQk / 16, kVTiles = kV / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem + Shape::kQOffset);  // [kRows][kLdK]
  auto k_stage = [&](int s) { return reinterpret_cast<bf16*>(smem + s * Shape::kStageBytes); };
  auto v_stage = [&](int s) {
    return reinterpret_cast<bf16*>(smem + s * Shape::kStageBytes + Shape::kKBytes);
  };
  __shared__ int visible_max;

  const int head = blockIdx.x;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * kRows;  // the longest rows (causal) first
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c2 = 2 * (lane & 3);
  const auto visible_of = [&](int t) {
    return t < p.tokens ? min(max(p.kv_len[t] - p.key_begin, 0), p.n) : 0;
  };
  if (tid == 0) visible_max = 0;
  // The padding columns of both stages: cp.async never writes them.
  constexpr int kQkPad = (kQk - Shape::kNope - Shape::kRope) / 8, kVPad = (kV - Shape::kVd) / 8;
  if constexpr (kQkPad > 0) {
    for (int i = tid; i < 2 * kKeys * kQkPad; i += kThreads) {
      const int r = i / kQkPad, c = kQk - (1 + i % kQkPad) * 8;
      store_zero16(k_stage(r / kKeys) + (r % kKeys) * kLdK + c);
    }
  }
  if constexpr (kVPad > 0) {
    for (int i = tid; i < 2 * kKeys * kVPad; i += kThreads) {
      const int r = i / kVPad, c = kV - (1 + i % kVPad) * 8;
      store_zero16(v_stage(r / kKeys) + (r % kKeys) * kLdV + c);
    }
  }
  load_queries<Shape, TQ>(p, head, row0, q_s);
  __syncthreads();
  for (int i = tid; i < kRows; i += kThreads) atomicMax(&visible_max, visible_of(row0 + i));
  // This lane's rows: 2m (row g of m-tile m) and 2m + 1 (row g + 8).
  const int warp_row0 = row0 + warp * 16 * kM;
  int vis[2 * kM];
#pragma unroll
  for (int r = 0; r < 2 * kM; ++r) vis[r] = visible_of(warp_row0 + (r >> 1) * 16 + g + (r & 1) * 8);
  int vis_min = vis[0];
#pragma unroll
  for (int r = 1; r < 2 * kM; ++r) vis_min = min(vis_min, vis[r]);
  // With one m-tile Q stays in registers; with two it is read from shared memory per k-step.
  uint32_t qf[kM == 1 ? kKSteps : 1][4];
  if constexpr (kM == 1) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      ldsm_x4(qf[ks], q_s + (warp * 16 + (lane & 15)) * kLdK + ks * 16 + (lane >> 4) * 8);
    }
  }
  __syncthreads();
  const int limit = visible_max;
  const int tiles = (limit + kKeys - 1) / kKeys;

  float o[kM][kVTiles][4] = {};
  float m_run[2 * kM], l_run[2 * kM];  // running max of the raw scores q·k; this lane's share of Σ exp
#pragma unroll
  for (int r = 0; r < 2 * kM; ++r) {
    m_run[r] = -INFINITY;
    l_run[r] = 0.0f;
  }
  const float scale_log2 = p.scale * kLog2e;
  if (tiles > 0) load_tile<Shape>(p, head, 0, limit, k_stage(0), v_stage(0));
  cp_async_commit();
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles)
      load_tile<Shape>(p, head, (j + 1) * kKeys, limit, k_stage((j + 1) & 1), v_stage((j + 1) & 1));
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* k_s = k_stage(j & 1);
    const bf16* v_s = v_stage(j & 1);

    float s[kM][kKeys / 8][4] = {};  // [m-tile][key n8 tile][row g: 0, 1; row g + 8: 2, 3]
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t a[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if constexpr (kM == 1) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[m][e] = qf[ks][e];
        } else {
          ldsm_x4(a[m], q_s + (warp * 16 * kM + m * 16 + (lane & 15)) * kLdK + ks * 16 + (lane >> 4) * 8);
        }
      }
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t b[4];
        ldsm_x4(b,
                k_s + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kLdK + ks * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          mma_bf16(s[m][2 * np], a[m][0], a[m][1], a[m][2], a[m][3], b[0], b[1]);
          mma_bf16(s[m][2 * np + 1], a[m][0], a[m][1], a[m][2], a[m][3], b[2], b[3]);
        }
      }
    }
    const int kb = j * kKeys;
    if (kb + kKeys > vis_min) {  // the tile reaches past a row's last visible key
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = kb + nt * 8 + c2 + (e & 1);
            if (key >= vis[2 * m + (e >> 1)]) s[m][nt][e] = -INFINITY;
          }
        }
      }
    }
    float alpha[2 * kM], base[2 * kM];
    bool rescale = false;
#pragma unroll
    for (int r = 0; r < 2 * kM; ++r) {
      float mx = m_run[r];
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        mx = fmaxf(mx, fmaxf(s[r >> 1][nt][2 * (r & 1)], s[r >> 1][nt][2 * (r & 1) + 1]));
      }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      // A row with no visible key yet keeps max -inf: subtract 0 instead, so every exp is of -inf (0).
      base[r] = mx == -INFINITY ? 0.0f : mx * scale_log2;
      alpha[r] = exp2f(m_run[r] * scale_log2 - base[r]);
      m_run[r] = mx;
      l_run[r] *= alpha[r];
      rescale = rescale || alpha[r] != 1.0f;
    }
    // Past the first tiles a row's max rarely moves: alpha is then exactly 1 and the warp skips the rescale
    // of O (64·kM multiplies per lane).
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int vt = 0; vt < kVTiles; ++vt) {
          o[m][vt][0] *= alpha[2 * m];
          o[m][vt][1] *= alpha[2 * m];
          o[m][vt][2] *= alpha[2 * m + 1];
          o[m][vt][3] *= alpha[2 * m + 1];
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 2 * m + (e >> 1);
          s[m][nt][e] = exp2f(s[m][nt][e] * scale_log2 - base[r]);
          l_run[r] += s[m][nt][e];
        }
      }
    }
    // O += P·V: the S accumulators of key tiles 2kk and 2kk + 1 are the A fragment of k-step kk.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t a[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        a[m][0] = pack_bf16x2(s[m][2 * kk][0], s[m][2 * kk][1]);
        a[m][1] = pack_bf16x2(s[m][2 * kk][2], s[m][2 * kk][3]);
        a[m][2] = pack_bf16x2(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        a[m][3] = pack_bf16x2(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int vp = 0; vp < kV / 16; ++vp) {
        uint32_t b[4];
        ldsm_x4_trans(
            b, v_s + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kLdV + vp * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          mma_bf16(o[m][2 * vp], a[m][0], a[m][1], a[m][2], a[m][3], b[0], b[1]);
          mma_bf16(o[m][2 * vp + 1], a[m][0], a[m][1], a[m][2], a[m][3], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2 * kM; ++r) {
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], off);
  }
  // With merge, every lane reads the earlier chunks' stats of its rows before the row's first lane
  // overwrites them.
  float2 old[2 * kM];
#pragma unroll
  for (int r = 0; r < 2 * kM; ++r) {
    const int t = warp_row0 + (r >> 1) * 16 + g + (r & 1) * 8;
    old[r] = p.merge && t < p.tokens
                 ? *reinterpret_cast<const float2*>(p.stats + (static_cast<int64_t>(t) * p.heads + head) * 2)
                 : make_float2(-INFINITY, 0.0f);
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2 * kM; ++r) {
    const int t = warp_row0 + (r >> 1) * 16 + g + (r & 1) * 8, m_tile = r >> 1, half = r & 1;
    if (t >= p.tokens) continue;
    const float sum = l_run[r];
    const float max_logit = sum > 0.0f ? m_run[r] * p.scale : -INFINITY;
    const int64_t row = static_cast<int64_t>(t) * p.heads + head;
    float* dst = p.out + row * Shape::kVd;
    float2* st = reinterpret_cast<float2*>(p.stats + row * 2);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    if (!p.merge) {
#pragma unroll
      for (int vt = 0; vt < kVTiles; ++vt) {
        const int col = vt * 8 + c2;
        if (col < Shape::kVd) {
          *reinterpret_cast<float2*>(dst + col) =
              make_float2(o[m_tile][vt][2 * half] * inv, o[m_tile][vt][2 * half + 1] * inv);
        }
      }
      if ((lane & 3) == 0) *st = make_float2(max_logit, sum);
      continue;
    }
    // lse_combine over (earlier chunks, this chunk).
    const float m = fmaxf(old[r].x, max_logit);
    if (m == -INFINITY) continue;  // no key in either: stays 0, (-inf, 0)
    const float w0 = old[r].y * expf(old[r].x - m), w1 = sum * expf(max_logit - m);
    const float denom = w0 + w1;
#pragma unroll
    for (int vt = 0; vt < kVTiles; ++vt) {
      const int col = vt * 8 + c2;
      if (col >= Shape::kVd) continue;
      float2 y = make_float2(0.0f, 0.0f);
      if (w0 != 0.0f) {
        const float2 prev = *reinterpret_cast<const float2*>(dst + col);
        y.x += w0 / denom * prev.x;
        y.y += w0 / denom * prev.y;
      }
      if (w1 != 0.0f) {
        y.x += w1 / denom * (o[m_tile][vt][2 * half] * inv);
        y.y += w1 / denom * (o[m_tile][vt][2 * half + 1] * inv);
      }
      *reinterpret_cast<float2*>(dst + col) = y;
    }
    if ((lane & 3) == 0) *st = make_float2(m, denom);
  }
}

template <class Shape, class TQ>
void launch_mla_expanded(const ExpandedParams& p, cudaStream_t stream) {
  // Above 48 KB a kernel must opt in to its dynamic shared memory; once per instantiation.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      mla_expanded_kernel<Shape, TQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes);
  HLM_CUDA_CHECK(opt_in);
  const dim3 grid(static_cast<unsigned>(p.heads), blocks_for(p.tokens, Shape::kRows));
  mla_expanded_kernel<Shape, TQ><<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(p);
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
    HLM_CHECK(reinterpret_cast<uintptr_t>(t->raw()) % 16 == 0,
              "mla_expanded_attention: {} must start on a 16-byte boundary", t->describe());
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
  // 32 rows per warp halve the shared-memory reads per mma and ran 24% faster on an H200 (docs/benchmarks.md,
  // "MLA prefill: the expanded form"); their 256-row CTAs need a chunk long enough to fill the GPU.
  const bool kimi = nope == ExpandedKimi::kNope, bf16_q = q.dtype() == DType::kBF16;
  const bool wide =
      kimi && static_cast<int64_t>(blocks_for(tokens, ExpandedKimiWide::kRows)) * heads >= ctx.sm_count();
  switch ((kimi ? (wide ? 4 : 2) : 0) + (bf16_q ? 1 : 0)) {
    case 0:
      launch_mla_expanded<ExpandedFixture, float>(p, ctx.stream());
      break;
    case 1:
      launch_mla_expanded<ExpandedFixture, bf16>(p, ctx.stream());
      break;
    case 2:
      launch_mla_expanded<ExpandedKimi, float>(p, ctx.stream());
      break;
    case 3:
      launch_mla_expanded<ExpandedKimi, bf16>(p, ctx.stream());
      break;
    case 4:
      launch_mla_expanded<ExpandedKimiWide, float>(p, ctx.stream());
      break;
    default:
      launch_mla_expanded<ExpandedKimiWide, bf16>(p, ctx.stream());
      break;
  }
}

}  // namespace hlm::cuda
