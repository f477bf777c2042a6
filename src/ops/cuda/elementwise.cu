// Element-wise and row-wise CUDA ops: embedding, RMSNorm, residual add, GLU (SiLU / SiTU), sigmoid and
// sigmoid gating, the layout movers (slice, concat, gather, transpose), dtype conversion and random fill.
// All are memory-bound: one pass over their bytes, grid-stride loops, fp32 math. Inputs may be F32 or BF16
// (a flag per pointer, uniform across a launch, so the branch costs nothing next to the loads).
#include <cmath>
#include <type_traits>

#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/random_hash.h"

namespace hlm::cuda {

namespace {

constexpr int kThreads = 256;

// A float tensor's data with its dtype: F32 or BF16.
struct In {
  const void* p;
  bool is_bf16;
  __device__ float operator[](int64_t i) const {
    return is_bf16 ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
  }
};
struct Out {
  void* p;
  bool is_bf16;
  __device__ void set(int64_t i, float v) const {
    if (is_bf16) {
      static_cast<bf16*>(p)[i] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(p)[i] = v;
    }
  }
};

In in_of(const Tensor& t) { return In{t.raw(), t.dtype() == DType::kBF16}; }
Out out_of(Tensor& t) { return Out{t.raw(), t.dtype() == DType::kBF16}; }

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks_for(n, kThreads), 1), 132 * 16));
}

#define HLM_GRID_STRIDE(i, n)                                                            \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += gridDim.x * static_cast<int64_t>(blockDim.x))

// --- embedding -------------------------------------------------------------------------------------------
struct EmbeddingParams {
  In table;        // [V, D]
  const int* ids;  // [T]
  float* out;      // [T, D]
  int64_t vocab, dim, tokens;
};

// One thread per output element. An id outside the vocabulary (validated on the host before any step;
// here only as a last line) yields NaN, which the sampler reports as non-finite logits.
__global__ void embedding_kernel(EmbeddingParams p) {
  pdl_wait();
  pdl_trigger();
  HLM_GRID_STRIDE(i, p.tokens * p.dim) {
    const int64_t t = i / p.dim, d = i % p.dim;
    const int id = p.ids[t];
    p.out[i] =
        id >= 0 && id < p.vocab ? p.table[static_cast<int64_t>(id) * p.dim + d] : __int_as_float(0x7fc00000);
  }
}

// --- RMSNorm ---------------------------------------------------------------------------------------------
struct RmsNormParams {
  In x;     // [rows, D]
  In w;     // [D]
  bf16* y;  // [rows, D]
  int64_t rows, dim;
  float eps;
  In add;  // add_rms_norm: [rows, D] added to x first, the sum stored over x (nullptr: plain RMSNorm)
};

// One block per row: the sum of squares is a block reduction, then each thread scales its columns. A
// thread keeps its first kRmsCached columns in registers, so the row is read once with all its loads in
// flight. The kernel is instantiated per dtype of x (XT), w (WT) and the addend (AT; void: plain RMSNorm),
// so no load waits behind a dtype branch (measured in a CUDA graph at a 2304-wide row: 3.8 µs per call with
// one dtype flag per pointer, 2.3 µs like this). With an addend, the residual add comes first
// (add_rms_norm): x + add is stored over x, rounded to x's dtype as add_inplace stores it, and that rounded
// sum is what gets normalized. The normalized value is rounded to bf16 before the weight multiply, as the
// reference does (MODEL.md §4). Rows of any width; rms_norm_vec_kernel below takes the common ones.
constexpr int kRmsCached = 16;  // rows up to 16·blockDim wide stay in registers

template <class XT, class WT, class AT>
__global__ void __launch_bounds__(2 * kThreads) rms_norm_kernel(RmsNormParams p) {
  constexpr bool kAdd = !std::is_void_v<AT>;
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int stride = blockDim.x;
  const int dim = static_cast<int>(p.dim);
  XT* x = static_cast<XT*>(const_cast<void*>(p.x.p)) + r * p.dim;  // written only with an addend
  const WT* w = static_cast<const WT*>(p.w.p);
  bf16* y = p.y + r * p.dim;
  float v[kRmsCached], wv[kRmsCached];
  // The weight before pdl_wait() (rms_norm_vec_kernel says why); the row's loads after it, all before the
  // first store (a store between them would keep the compiler from moving later loads above it) and
  // before the reduction.
#pragma unroll
  for (int i = 0; i < kRmsCached; ++i) {
    const int d = threadIdx.x + i * stride;
    wv[i] = d < dim ? to_float(w[d]) : 0.0f;
  }
  pdl_wait();
  pdl_trigger();
#pragma unroll
  for (int i = 0; i < kRmsCached; ++i) {
    const int d = threadIdx.x + i * stride;
    v[i] = d < dim ? to_float(x[d]) : 0.0f;
  }
  if constexpr (kAdd) {
    const AT* a = static_cast<const AT*>(p.add.p) + r * p.dim;
    float av[kRmsCached];
#pragma unroll
    for (int i = 0; i < kRmsCached; ++i) {
      const int d = threadIdx.x + i * stride;
      av[i] = d < dim ? to_float(a[d]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kRmsCached; ++i) {
      const int d = threadIdx.x + i * stride;
      if (d < dim) {
        const XT sum = from_float<XT>(v[i] + av[i]);
        x[d] = sum;
        v[i] = to_float(sum);
      }
    }
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kRmsCached; ++i) sum_sq += v[i] * v[i];
  for (int d = threadIdx.x + kRmsCached * stride; d < dim; d += stride) {
    float value = to_float(x[d]);
    if constexpr (kAdd) {
      const XT sum = from_float<XT>(value + to_float(static_cast<const AT*>(p.add.p)[r * p.dim + d]));
      x[d] = sum;
      value = to_float(sum);
    }
    sum_sq += value * value;
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float inv = rms_inv(sum_sq, dim, p.eps);
#pragma unroll
  for (int i = 0; i < kRmsCached; ++i) {
    const int d = threadIdx.x + i * stride;
    if (d < dim) y[d] = __float2bfloat16_rn(rms_normed(v[i], inv, wv[i]));
  }
  for (int d = threadIdx.x + kRmsCached * stride; d < dim; d += stride) {
    // With an addend, x already holds this thread's stored sum.
    y[d] = __float2bfloat16_rn(rms_normed(to_float(x[d]), inv, to_float(w[d])));
  }
}

// The same function for rows whose width is a multiple of 8 and at most 8·kVecChunks·kThreads (8,192; both
// models' hidden sizes) with 16-byte aligned rows: a thread owns up to kVecChunks chunks of 8 consecutive
// columns and moves each with one or two 16-byte accesses. ncu put the per-element kernel above at about
// 1,500 issued instructions per warp for a 2,304-wide row (index math, a branch per element), 4.3 µs when
// run alone; a chunk needs one branch and a few address computations. In a CUDA graph (kernel_bench) a
// 2,304-wide row takes 1.5 µs here against 2.3 (4.0 with the residual add, 1.8 here). Sums are taken in a
// different order than the per-element kernel (both fp32).
constexpr int kVecChunks = 4;

__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16* p, float (&v)[8]) {
  bf16x8_to_f32(*reinterpret_cast<const uint4*>(p), v);
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(bf16* p, const float (&v)[8]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]),
                                            pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}

template <class XT, class WT, class AT>
__global__ void __launch_bounds__(kThreads) rms_norm_vec_kernel(RmsNormParams p) {
  constexpr bool kAdd = !std::is_void_v<AT>;
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int chunks = static_cast<int>(p.dim / 8);
  XT* x = static_cast<XT*>(const_cast<void*>(p.x.p)) + r * p.dim;  // written only with an addend
  const WT* w = static_cast<const WT*>(p.w.p);
  bf16* y = p.y + r * p.dim;
  float v[kVecChunks][8], wv[kVecChunks][8];
  // The weight before pdl_wait(): a decode step streams gigabytes of weights through the 50 MB L2, so the
  // norm weight comes from DRAM each step, while the row is fresh in L2. Measured on an H200 (48B, 4K,
  // batch 1, three rounds against the same build with every load after the wait): 2.406-2.446 against
  // 2.442-2.475 ms per step; the residual row loaded before the wait too (legal only while the kernel just
  // before does not write it) gained nothing more (2.423-2.445).
#pragma unroll
  for (int i = 0; i < kVecChunks; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c < chunks) load8(w + 8 * c, wv[i]);
  }
  pdl_wait();
  pdl_trigger();
#pragma unroll
  for (int i = 0; i < kVecChunks; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c < chunks) load8(x + 8 * c, v[i]);
  }
  if constexpr (kAdd) {
    const AT* a = static_cast<const AT*>(p.add.p) + r * p.dim;
    float av[kVecChunks][8];
#pragma unroll
    for (int i = 0; i < kVecChunks; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (c < chunks) load8(a + 8 * c, av[i]);
    }
#pragma unroll
    for (int i = 0; i < kVecChunks; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (c < chunks) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[i][j] = to_float(from_float<XT>(v[i][j] + av[i][j]));
        store8(x + 8 * c, v[i]);
      }
    }
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kVecChunks; ++i) {
    if (threadIdx.x + i * kThreads < chunks) {
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_sq += v[i][j] * v[i][j];
    }
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float inv = rms_inv(sum_sq, p.dim, p.eps);
#pragma unroll
  for (int i = 0; i < kVecChunks; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c < chunks) {
      float out[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = rms_normed(v[i][j], inv, wv[i][j]);
      store8(y + 8 * c, out);
    }
  }
}

// --- element-wise ----------------------------------------------------------------------------------------
struct BinaryParams {
  Out y;
  In a, b;
  int64_t n;
  int act;  // Activation
  float situ_beta, situ_linear_beta;
  int64_t half = 0;  // glu_packed: I, with a = b = gate_up [T, 2I]; 0: a and b are indexed like y
};

__global__ void add_kernel(BinaryParams p) {
  pdl_wait();
  pdl_trigger();
  HLM_GRID_STRIDE(i, p.n) { p.y.set(i, p.a[i] + p.b[i]); }
}

// act(gate) · up with the CPU backend's formulas (cpu_kernels.h glu_value).
__global__ void glu_kernel(BinaryParams p) {
  pdl_wait();
  pdl_trigger();
  HLM_GRID_STRIDE(i, p.n) {
    const int64_t ia = p.half > 0 ? (i / p.half) * 2 * p.half + i % p.half : i;
    const int64_t ib = p.half > 0 ? ia + p.half : i;
    p.y.set(i, glu_value(p.a[ia], p.b[ib], p.act != static_cast<int>(Activation::kSilu), p.situ_beta,
                         p.situ_linear_beta));
  }
}

// The same with 4 consecutive outputs per thread, for gate and up of one dtype T whose rows (width I, row
// stride ld: I for glu, 2I for glu_packed with up I elements after gate) keep 4-element vectors aligned:
// one vector load of each and an 8-byte store. The scalar kernel's dtype branch and 64-bit division per
// element held it at 1.1-1.3 TB/s (ncu on an H200: the shared experts' GLU of an 8K-token prefill).
struct GluVecParams {
  const void* gate;  // [T, ld], the first I columns of each row used
  const void* up;    // the same layout
  bf16* y;           // [T, I]
  int64_t rows, width, ld;
  bool situ;
  float situ_beta, situ_linear_beta;
};
constexpr int kGluVec = 4;

template <class T>
__global__ void glu_vec_kernel(GluVecParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t per_row = p.width / kGluVec;
  HLM_GRID_STRIDE(v, p.rows * per_row) {
    const int64_t row = v / per_row, col = (v - row * per_row) * kGluVec;
    RawVec<T, kGluVec> gate_raw, up_raw;
    gate_raw.load(static_cast<const T*>(p.gate) + row * p.ld + col);
    up_raw.load(static_cast<const T*>(p.up) + row * p.ld + col);
    float g[kGluVec], u[kGluVec], y[kGluVec];
    gate_raw.to_floats(g);
    up_raw.to_floats(u);
#pragma unroll
    for (int e = 0; e < kGluVec; ++e) y[e] = glu_value(g[e], u[e], p.situ, p.situ_beta, p.situ_linear_beta);
    store_floats(p.y + row * p.width + col, y);
  }
}

// Launches glu_vec_kernel where gate and up share a dtype and every row's vectors are aligned; false where
// the scalar kernel must take it.
bool launch_glu_vec(const Tensor& gate, const void* gate_at, const void* up_at, int64_t width, int64_t ld,
                    Tensor& y, const ActivationParams& act, cudaStream_t stream) {
  const size_t vec_bytes = kGluVec * dtype_size(gate.dtype());
  const bool aligned = aligned_to(gate_at, vec_bytes) && aligned_to(up_at, vec_bytes) && aligned16(y.raw());
  if (width % kGluVec != 0 || ld % kGluVec != 0 || !aligned) return false;
  const GluVecParams p{gate_at,
                       up_at,
                       static_cast<bf16*>(y.raw()),
                       y.numel() / width,
                       width,
                       ld,
                       act.kind == Activation::kSitu,
                       act.situ_beta,
                       act.situ_linear_beta};
  const unsigned grid = grid_for(y.numel() / kGluVec);
  if (gate.dtype() == DType::kBF16) {
    launch_pdl(glu_vec_kernel<bf16>, grid, kThreads, 0, stream, p);
  } else {
    launch_pdl(glu_vec_kernel<float>, grid, kThreads, 0, stream, p);
  }
  HLM_CHECK_LAUNCH("glu_vec_kernel");
  return true;
}

__global__ void sigmoid_kernel(BinaryParams p) {
  pdl_wait();
  pdl_trigger();
  HLM_GRID_STRIDE(i, p.n) { p.y.set(i, logistic(p.a[i])); }
}

__global__ void sigmoid_gate_kernel(BinaryParams p) {
  pdl_wait();
  pdl_trigger();
  HLM_GRID_STRIDE(i, p.n) { p.y.set(i, p.a[i] * logistic(p.b[i])); }
}

__global__ void convert_kernel(BinaryParams p) {
  pdl_wait();
  pdl_trigger();
  HLM_GRID_STRIDE(i, p.n) { p.y.set(i, p.a[i]); }
}

// --- layout movers (dtype-agnostic: elements of `Elem` bytes)
// ------------------------------------------------ Copies a [rows, cols] block with row strides (in elements)
// src_ld/dst_ld; one thread per element.
template <class Elem>
struct Copy2dParams {
  const Elem* src;
  Elem* dst;
  const int* rows_index;  // optional gather: source row of each destination row (-1 / out of range: zero)
  int64_t src_rows;
  int64_t rows, cols, src_ld, dst_ld;
};

template <class Elem>
__global__ void copy2d_kernel(Copy2dParams<Elem> p) {
  pdl_wait();
  pdl_trigger();
  HLM_GRID_STRIDE(i, p.rows * p.cols) {
    const int64_t r = i / p.cols, c = i % p.cols;
    int64_t sr = r;
    if (p.rows_index != nullptr) {
      sr = p.rows_index[r];
      if (sr < 0 || sr >= p.src_rows) {
        p.dst[r * p.dst_ld + c] = Elem{};
        continue;
      }
    }
    p.dst[r * p.dst_ld + c] = p.src[sr * p.src_ld + c];
  }
}

template <class Elem>
void launch_copy2d(const Copy2dParams<Elem>& p, cudaStream_t stream) {
  if (p.rows * p.cols == 0) return;
  launch_pdl(copy2d_kernel<Elem>, grid_for(p.rows * p.cols), kThreads, 0, stream, p);
  HLM_CHECK_LAUNCH("copy2d");
}

// Dispatches on the element size; rows/cols/strides are in elements of that size.
void copy2d(CudaContext& ctx, const void* src, void* dst, size_t elem, int64_t rows, int64_t cols,
            int64_t src_ld, int64_t dst_ld, const int* rows_index = nullptr, int64_t src_rows = 0) {
  switch (elem) {
    case 1:
      launch_copy2d(Copy2dParams<uint8_t>{static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst),
                                          rows_index, src_rows, rows, cols, src_ld, dst_ld},
                    ctx.stream());
      return;
    case 2:
      launch_copy2d(Copy2dParams<uint16_t>{static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst),
                                           rows_index, src_rows, rows, cols, src_ld, dst_ld},
                    ctx.stream());
      return;
    case 4:
      launch_copy2d(Copy2dParams<uint32_t>{static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst),
                                           rows_index, src_rows, rows, cols, src_ld, dst_ld},
                    ctx.stream());
      return;
    case 8:
      launch_copy2d(Copy2dParams<uint64_t>{static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst),
                                           rows_index, src_rows, rows, cols, src_ld, dst_ld},
                    ctx.stream());
      return;
    default:
      HLM_FAIL("copy2d: unsupported element size {}", elem);
  }
}

// x [A, B, inner] -> y [B, A, inner], one thread per element.
template <class Elem>
struct TransposeParams {
  const Elem* src;
  Elem* dst;
  int64_t a, b, inner;
};

template <class Elem>
__global__ void transpose01_kernel(TransposeParams<Elem> p) {
  pdl_wait();
  pdl_trigger();
  HLM_GRID_STRIDE(idx, p.a * p.b * p.inner) {
    const int64_t e = idx % p.inner, ij = idx / p.inner, j = ij % p.b, i = ij / p.b;
    p.dst[(j * p.a + i) * p.inner + e] = p.src[idx];
  }
}

template <class Elem>
void launch_transpose01(const TransposeParams<Elem>& p, cudaStream_t stream) {
  const int64_t n = p.a * p.b * p.inner;
  if (n == 0) return;
  launch_pdl(transpose01_kernel<Elem>, grid_for(n), kThreads, 0, stream, p);
  HLM_CHECK_LAUNCH("transpose01");
}

// --- random fill -----------------------------------------------------------------------------------------
struct RandomParams {
  Out out;
  uint8_t* bytes;  // U8 tensors
  int64_t n;
  RandomFill fill;
};

// The same values as the CPU backend's random_fill (ops/random_hash.h), element by element.
__global__ void random_kernel(RandomParams p) {
  HLM_GRID_STRIDE(i, p.n) {
    if (p.bytes != nullptr) {
      const uint64_t span = static_cast<uint64_t>(p.fill.byte_hi) - p.fill.byte_lo + 1;
      p.bytes[i] =
          static_cast<uint8_t>(p.fill.byte_lo + hash3(p.fill.seed, static_cast<uint64_t>(i), 1) % span);
    } else {
      p.out.set(i, p.fill.offset +
                       p.fill.scale * (2.0f * uniform01(p.fill.seed, static_cast<uint64_t>(i), 0) - 1.0f));
    }
  }
}

void launch_binary(void (*kernel)(BinaryParams), const BinaryParams& p, cudaStream_t stream,
                   const char* name) {
  if (p.n == 0) return;
  launch_pdl(kernel, grid_for(p.n), kThreads, 0, stream, p);
  HLM_CHECK_LAUNCH(name);
}

void expect_float(const Tensor& t, const char* op, const char* name) {
  expect_cuda(t, op, name, {DType::kF32, DType::kBF16}, -1, "tensor");
}

}  // namespace

Tensor embedding(CudaContext& ctx, const Tensor& table, const Tensor& ids) {
  expect_cuda(table, "embedding", "table", {DType::kF32, DType::kBF16}, 2, "[V, D]");
  expect_cuda(ids, "embedding", "ids", {DType::kI32}, 1, "[T]");
  Tensor out = ctx.empty({ids.dim(0), table.dim(1)}, DType::kF32);  // [T, D]
  const EmbeddingParams p{in_of(table),
                          static_cast<const int*>(ids.raw()),
                          static_cast<float*>(out.raw()),
                          table.dim(0),
                          table.dim(1),
                          ids.dim(0)};
  if (out.numel() > 0) {
    launch_pdl(embedding_kernel, grid_for(out.numel()), kThreads, 0, ctx.stream(), p);
    HLM_CHECK_LAUNCH("embedding");
  }
  return out;
}

void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  HLM_CHECK(p.dim <= INT32_MAX, "rms_norm: row width {} exceeds the kernel's int range", p.dim);
  // Rows wider than a 256-thread block keeps in registers (K3's 7168) take 512 threads.
  const int threads = p.dim > kRmsCached * kThreads ? 2 * kThreads : kThreads;
  const auto rows = static_cast<unsigned>(p.rows);
  // Row starts stay 16-byte aligned when the base is and the width is a multiple of 8 elements.
  const bool vec = p.dim % 8 == 0 && p.dim <= 8 * kVecChunks * kThreads && aligned16(p.x.p) &&
                   aligned16(p.w.p) && aligned16(p.y) && (p.add.p == nullptr || aligned16(p.add.p));
  auto dtype = [](const In& in) { return in.is_bf16 ? DType::kBF16 : DType::kF32; };
  dispatch_float(dtype(p.x), "rms_norm", [&](auto xt) {
    dispatch_float(dtype(p.w), "rms_norm", [&](auto wt) {
      using XT = typename decltype(xt)::type;
      using WT = typename decltype(wt)::type;
      if (p.add.p == nullptr) {
        if (vec) {
          launch_pdl(rms_norm_vec_kernel<XT, WT, void>, rows, kThreads, 0, stream, p);
        } else {
          launch_pdl(rms_norm_kernel<XT, WT, void>, rows, threads, 0, stream, p);
        }
      } else {
        dispatch_float(dtype(p.add), "rms_norm", [&](auto at) {
          using AT = typename decltype(at)::type;
          if (vec) {
            launch_pdl(rms_norm_vec_kernel<XT, WT, AT>, rows, kThreads, 0, stream, p);
          } else {
            launch_pdl(rms_norm_kernel<XT, WT, AT>, rows, threads, 0, stream, p);
          }
        });
      }
    });
  });
  HLM_CHECK_LAUNCH("rms_norm");
}

Tensor rms_norm(CudaContext& ctx, const Tensor& x, const Tensor& w, float eps) {
  expect_float(x, "rms_norm", "x [..., D]");
  HLM_CHECK(x.rank() >= 1, "rms_norm: x must have at least one dimension, got {}", x.describe());
  expect_cuda(w, "rms_norm", "w", {DType::kF32, DType::kBF16}, 1, "[D]");
  expect_dim(w, 0, x.dim(-1), "rms_norm", "w [D]", "the last dimension of x");
  Tensor y = ctx.empty(x.shape(), DType::kBF16);
  const RmsNormParams p{in_of(x),  in_of(w), static_cast<bf16*>(y.raw()), leading_rows(x),
                        x.dim(-1), eps,      In{nullptr, false}};
  launch_rms_norm(p, ctx.stream());
  return y;
}

Tensor add_rms_norm(CudaContext& ctx, Tensor& h, const Tensor& a, const Tensor& w, float eps) {
  expect_float(h, "add_rms_norm", "h [..., D]");
  expect_float(a, "add_rms_norm", "a [..., D]");
  expect_same_shape(h, a, "add_rms_norm", "h", "a");
  HLM_CHECK(h.rank() >= 1, "add_rms_norm: h must have at least one dimension, got {}", h.describe());
  expect_cuda(w, "add_rms_norm", "w", {DType::kF32, DType::kBF16}, 1, "[D]");
  expect_dim(w, 0, h.dim(-1), "add_rms_norm", "w [D]", "the last dimension of h");
  Tensor y = ctx.empty(h.shape(), DType::kBF16);
  const RmsNormParams p{in_of(h), in_of(w), static_cast<bf16*>(y.raw()), leading_rows(h), h.dim(-1),
                        eps,      in_of(a)};
  launch_rms_norm(p, ctx.stream());
  return y;
}

void add_inplace(CudaContext& ctx, Tensor& y, const Tensor& x) {
  expect_float(y, "add_inplace", "y");
  expect_float(x, "add_inplace", "x");
  expect_same_shape(y, x, "add_inplace", "y", "x");
  launch_binary(add_kernel, BinaryParams{out_of(y), in_of(y), in_of(x), y.numel(), 0, 0, 0}, ctx.stream(),
                "add_inplace");
}

Tensor glu(CudaContext& ctx, const Tensor& gate, const Tensor& up, const ActivationParams& act) {
  expect_float(gate, "glu", "gate [T, I]");
  expect_float(up, "glu", "up [T, I]");
  expect_same_shape(gate, up, "glu", "gate", "up");
  Tensor y = ctx.empty(gate.shape(), DType::kBF16);  // [T, I]
  if (y.numel() == 0) return y;
  const int64_t width = gate.dim(gate.rank() - 1);
  if (gate.dtype() == up.dtype() &&
      launch_glu_vec(gate, gate.raw(), up.raw(), width, width, y, act, ctx.stream())) {
    return y;
  }
  launch_binary(glu_kernel,
                BinaryParams{out_of(y), in_of(gate), in_of(up), y.numel(), static_cast<int>(act.kind),
                             act.situ_beta, act.situ_linear_beta},
                ctx.stream(), "glu");
  return y;
}

Tensor glu_packed(CudaContext& ctx, const Tensor& gate_up, const ActivationParams& act) {
  expect_float(gate_up, "glu_packed", "gate_up [T, 2I]");
  HLM_CHECK(gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0,
            "glu_packed: gate_up must be [T, 2I] with an even width, got {}", gate_up.describe());
  const int64_t inter = gate_up.dim(1) / 2;
  Tensor y = ctx.empty({gate_up.dim(0), inter}, DType::kBF16);  // [T, I]
  if (y.numel() == 0) return y;
  const void* up_at = static_cast<const char*>(gate_up.raw()) + inter * dtype_size(gate_up.dtype());
  if (launch_glu_vec(gate_up, gate_up.raw(), up_at, inter, 2 * inter, y, act, ctx.stream())) return y;
  BinaryParams p{out_of(y),     in_of(gate_up),      in_of(gate_up), y.numel(), static_cast<int>(act.kind),
                 act.situ_beta, act.situ_linear_beta};
  p.half = inter;
  launch_binary(glu_kernel, p, ctx.stream(), "glu_packed");
  return y;
}

Tensor sigmoid(CudaContext& ctx, const Tensor& x) {
  expect_float(x, "sigmoid", "x");
  Tensor y = ctx.empty(x.shape(), DType::kF32);
  launch_binary(sigmoid_kernel, BinaryParams{out_of(y), in_of(x), in_of(x), y.numel(), 0, 0, 0}, ctx.stream(),
                "sigmoid");
  return y;
}

void sigmoid_gate_inplace(CudaContext& ctx, Tensor& y, const Tensor& gate) {
  expect_float(y, "sigmoid_gate_inplace", "y");
  expect_float(gate, "sigmoid_gate_inplace", "gate");
  expect_same_shape(y, gate, "sigmoid_gate_inplace", "y", "gate");
  launch_binary(sigmoid_gate_kernel, BinaryParams{out_of(y), in_of(y), in_of(gate), y.numel(), 0, 0, 0},
                ctx.stream(), "sigmoid_gate_inplace");
}

void convert(CudaContext& ctx, const Tensor& src, Tensor& dst) {
  expect_float(src, "convert", "src");
  expect_float(dst, "convert", "dst");
  HLM_CHECK(src.numel() == dst.numel(), "convert: {} and {} differ in size", src.describe(), dst.describe());
  if (src.dtype() == dst.dtype()) {
    if (src.nbytes() > 0) {
      HLM_CUDA_CHECK(
          cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, ctx.stream()));
    }
    return;
  }
  launch_binary(convert_kernel, BinaryParams{out_of(dst), in_of(src), in_of(src), src.numel(), 0, 0, 0},
                ctx.stream(), "convert");
}

Tensor slice_last(CudaContext& ctx, const Tensor& x, int64_t begin, int64_t end) {
  expect_cuda(x, "slice_last", "x", {x.dtype()}, -1, "[..., C]");
  HLM_CHECK(x.rank() >= 1, "slice_last: x must have at least one dimension");
  const int64_t cols = x.dim(-1);
  HLM_CHECK(0 <= begin && begin <= end && end <= cols,
            "slice_last: columns [{}, {}) are outside [0, {}) of {}", begin, end, cols, x.describe());
  Shape shape = x.shape();
  shape.back() = end - begin;
  // One row (a batch-1 decode step): the columns are contiguous, so the slice is a view and costs no
  // kernel.
  if (leading_rows(x) == 1) return x.reshape({cols}).slice(begin, end).reshape(shape);
  Tensor y = ctx.empty(shape, x.dtype());  // [..., end - begin]
  const size_t elem = dtype_size(x.dtype());
  copy2d(ctx, static_cast<const std::byte*>(x.raw()) + begin * elem, y.raw(), elem, leading_rows(x),
         end - begin, cols, end - begin);
  return y;
}

Tensor concat_last(CudaContext& ctx, const Tensor& a, const Tensor& b) {
  expect_cuda(a, "concat_last", "a", {a.dtype()}, -1, "[..., Ca]");
  expect_cuda(b, "concat_last", "b", {b.dtype()}, -1, "[..., Cb]");
  if (a.dtype() != b.dtype()) {
    // F32 and BF16 parts (K3's routed latent sum next to the shared experts' partial): join in F32.
    expect_float(a, "concat_last", "a");
    expect_float(b, "concat_last", "b");
    Tensor a32 = ctx.empty(a.shape(), DType::kF32), b32 = ctx.empty(b.shape(), DType::kF32);
    convert(ctx, a, a32);
    convert(ctx, b, b32);
    return concat_last(ctx, a32, b32);
  }
  Shape lead_a(a.shape().begin(), a.shape().end() - 1), lead_b(b.shape().begin(), b.shape().end() - 1);
  HLM_CHECK(lead_a == lead_b, "concat_last: a and b must agree in all but the last dimension, got {} and {}",
            a.describe(), b.describe());
  const int64_t ca = a.dim(-1), cb = b.dim(-1), rows = shape_numel(lead_a);
  Shape shape = a.shape();
  shape.back() = ca + cb;
  Tensor y = ctx.empty(shape, a.dtype());  // [..., Ca + Cb]
  const size_t elem = dtype_size(a.dtype());
  copy2d(ctx, a.raw(), y.raw(), elem, rows, ca, ca, ca + cb);
  copy2d(ctx, b.raw(), static_cast<std::byte*>(y.raw()) + ca * elem, elem, rows, cb, cb, ca + cb);
  return y;
}

Tensor gather_rows(CudaContext& ctx, const Tensor& x, const Tensor& rows) {
  expect_cuda(x, "gather_rows", "x", {x.dtype()}, -1, "[T, ...]");
  HLM_CHECK(x.rank() >= 1, "gather_rows: x must have at least one dimension");
  expect_cuda(rows, "gather_rows", "rows", {DType::kI32}, 1, "[N]");
  Shape shape = x.shape();
  shape[0] = rows.dim(0);
  Tensor y = ctx.empty(shape, x.dtype());  // [N, ...]
  const int64_t row_elems = x.dim(0) == 0 ? 0 : x.numel() / x.dim(0);
  copy2d(ctx, x.raw(), y.raw(), dtype_size(x.dtype()), rows.dim(0), row_elems, row_elems, row_elems,
         static_cast<const int*>(rows.raw()), x.dim(0));
  return y;
}

Tensor transpose01(CudaContext& ctx, const Tensor& x) {
  expect_cuda(x, "transpose01", "x", {x.dtype()}, -1, "[A, B, ...]");
  HLM_CHECK(x.rank() >= 2, "transpose01: x must have at least two dimensions, got {}", x.describe());
  const int64_t a = x.dim(0), b = x.dim(1);
  Shape shape = x.shape();
  std::swap(shape[0], shape[1]);
  Tensor y = ctx.empty(shape, x.dtype());  // [B, A, ...]
  const int64_t inner = a * b == 0 ? 0 : x.numel() / (a * b);
  switch (dtype_size(x.dtype())) {
    case 1:
      launch_transpose01(TransposeParams<uint8_t>{static_cast<const uint8_t*>(x.raw()),
                                                  static_cast<uint8_t*>(y.raw()), a, b, inner},
                         ctx.stream());
      break;
    case 2:
      launch_transpose01(TransposeParams<uint16_t>{static_cast<const uint16_t*>(x.raw()),
                                                   static_cast<uint16_t*>(y.raw()), a, b, inner},
                         ctx.stream());
      break;
    case 4:
      launch_transpose01(TransposeParams<uint32_t>{static_cast<const uint32_t*>(x.raw()),
                                                   static_cast<uint32_t*>(y.raw()), a, b, inner},
                         ctx.stream());
      break;
    default:
      launch_transpose01(TransposeParams<uint64_t>{static_cast<const uint64_t*>(x.raw()),
                                                   static_cast<uint64_t*>(y.raw()), a, b, inner},
                         ctx.stream());
      break;
  }
  return y;
}

void random_fill(CudaContext& ctx, Tensor& t, const RandomFill& fill) {
  expect_cuda(t, "random_fill", "t", {DType::kF32, DType::kBF16, DType::kU8}, -1, "tensor");
  const bool bytes = t.dtype() == DType::kU8;
  RandomParams p{bytes ? Out{nullptr, false} : out_of(t), bytes ? static_cast<uint8_t*>(t.raw()) : nullptr,
                 t.numel(), fill};
  if (p.n == 0) return;
  random_kernel<<<grid_for(p.n), kThreads, 0, ctx.stream()>>>(p);
  HLM_CHECK_LAUNCH("random_fill");
}

}  // namespace hlm::cuda
