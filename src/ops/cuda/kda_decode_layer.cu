// kda_decode_layer (ops.h) in one kernel: a KDA layer's decode step from its stacked input projection to
// the normed output. It is kda_decode_gated's kernel (kda_decode.cu) with the layer's remaining small ops
// folded in: the short conv of q, k and v with its per-slot cache, and the two low-rank gate products
// (f_a's output · f_bᵀ for the decays, g_a's · g_bᵀ for the output gate). Separately those were three more
// kernels between the input projection and the recurrence (the conv on the main stream, f_b then g_b on a
// side stream; 4.3-4.4 µs each under ncu at batch 1) and a fork and join of the two streams.
//
// Decomposition: the decode tile (kda_decode_tile.cuh), grid (kSplits, H, T) in clusters of the kSplits
// CTAs of a (row, head), CTA s owning value columns [s·kC, (s+1)·kC). The small ops split the same way:
// CTA s convolves channels [s·kC, (s+1)·kC) of each of q, k and v (a thread per channel, so each conv
// cache entry has one reader and writer), computes the decays of key rows [s·kC, (s+1)·kC) from kC rows of
// f_b and the output gate of its own columns from kC rows of g_b (four threads per row, each taking every
// fourth 8-column chunk). The recurrence needs q, k and the decays of all D key rows: behind one cluster
// barrier each thread reads those of its key rows from the slice of the CTA that owns them (distributed
// shared memory), and the norms of q and k come out of recur()'s reduction over all D rows, in the same
// order in every CTA, so the CTAs agree. v and the gate stay in their CTA.
//
// Before pdl_wait() (pdl.cuh): the recurrent state and the conv cache, which only this layer's kernels of
// earlier steps write, the conv taps, a_log, dt_bias and the norm weight, and the CTA's rows of f_b and g_b
// (weights, copied to shared memory with cp.async so that they hold no registers while the kernel waits); at
// K = V = r = 128 that is 16 KB of state and 16 KB of gate weights per CTA.
//
// Where its time goes in a decode step (%globaltimer stamps of CTA 0, thread 0, in a build made for the
// measurement; the 48B at 4K, batch 1, on an H200, 2026-12-04): 3.2-3.5 µs from the kernel's start to its
// wait, which then returns at once (the input projection has ended; its CTAs hold the SMs' registers to
// the end, so these probably start only as they leave, their loads going out into its last DRAM traffic),
// then 0.7-1.1 for the projection's values and the conv, 0.9-1.2 for the gate products, 0.5-1.2 for the
// cluster exchange, 1.1-1.2 for the recurrence, 0.9-1.1 for the norm and 0.1-0.3 for the stores.
// (Measured there and dropped: the slot-independent weights issued before the span lookup and a_log's
// expf moved after the wait: the first span unchanged, 3.2 µs, and kernel_bench --kda-decode 12.77 against
// 9.25 µs at batch 4, 21.76 against 17.94 at 8. And
// the conv cache's stores moved after the cluster barriers, whose release arrive is a GPU-scope fence that
// waits for them: the cluster exchange 0.35-0.42 µs instead of 0.5-1.2, but the stores' span 0.8 instead
// of 0.1-0.3, the 48B step unchanged at batch 1 and kernel_bench 13.7 against 9.3 µs at batch 4, 23.0
// against 18.0 at 8. Both keep values live longer (the kernel has 92 registers as it is); why the larger
// batches lost that much was not found. On 2026-12-05, kernel_bench --kda-decode against 5.3 / 9.2 / 17.9 µs
// at batch 1 / 4 / 8: every CTA computing q, k and the decays of all D rows itself, so that the first
// exchange goes, 7.7 / 21.0 / 35.2; the exchanges pushed into the peers' shared memory before each barrier,
// 5.0 / 13.0 / 22.6; the conv cache's stores between the exchange's arrive and wait, 5.2 / 9.4 / 17.9. None
// moved the 48B step at batch 1 (docs/benchmarks.md, twenty-fifth session).)
//
// Numerics: the conv outputs, graw and the output gate stay fp32, where the separate ops round them to the
// activation dtype (bf16).
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/kda_decode_tile.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {
namespace {

constexpr int kMaxRank = 128;               // r, the width of f_a's and g_a's outputs, at most
constexpr int kRankChunks = kMaxRank / 32;  // 8-column chunks of a gate weight row per thread, at most
constexpr int kMaxConvWidth = 4;            // the models' width; wider convs take the separate ops
constexpr int64_t kLayerMaxHeadRows = 256;  // (row, head) pairs per call, at most (kda_decode_layer)

template <class XT>
struct KdaLayerParams {
  const XT* proj;  // [T, P], the stacked input projection
  int64_t proj_ld;
  KdaProjColumns cols;
  FloatIn conv_w;         // [3·H·D, W]
  FloatInOut conv_state;  // [slots, 3·H·D, W-1], the last W-1 raw inputs of each channel
  int conv_width;
  const bf16* f_b;  // [H·D, r]
  const bf16* g_b;  // [H·D, r], or nullptr: the gate columns of proj are the gate itself [H·D]
  int rank;
  FloatIn a_log;    // [H]
  FloatIn dt_bias;  // [H·D]
  FloatIn o_norm;   // [D]
  float lower_bound;
  float eps;
  float* state;          // [slots, H, D, D]
  bf16* out;             // [T, H, D]
  const int32_t* table;  // [S, 3]
  int num_spans;
  int heads;
};

// The thread's share of a gate row's product: chunks part, part + 4, ... (8 columns each) of the row w
// (shared, bf16) against x (shared), chunks below r / 8.
__device__ __forceinline__ float row_share_dot(const bf16* w, const float* x, int part, int rank) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kRankChunks; ++j) {
    const int c = 8 * (4 * j + part);
    if (c < rank) {
      float wf[8];
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(w + c), wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum = fmaf(wf[e], x[c + e], sum);
    }
  }
  return sum;
}

// q, k and the decays of the thread's key rows from the [3][kCols] slices of the CTAs that own them:
// slice_of(rank) is CTA rank's (rows [rank·kCols, (rank+1)·kCols)).
template <class Tile, class SliceOf>
__device__ __forceinline__ void read_key_rows(RowInputs<Tile>& in, int row_group, SliceOf slice_of) {
  constexpr int kC = Tile::kCols;
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) {
    const int d = row_group + Tile::kRowGroups * i;
    const float* owner = slice_of(d / kC);
    in.q[i] = owner[d % kC];
    in.k[i] = owner[kC + d % kC];
    in.decay[i] = owner[2 * kC + d % kC];
  }
}

template <int D, class XT>
__global__ void __launch_bounds__(DecodeTile<D>::kThreads) kda_decode_layer_kernel(KdaLayerParams<XT> p) {
  using Tile = DecodeTile<D>;
  constexpr int kC = Tile::kCols;
  static_assert(Tile::kThreads == 4 * kC && 3 * kC <= Tile::kThreads);  // 4 threads per gate row
  __shared__ Span span_shared;
  __shared__ float slice_sh[3]
                           [kC];  // this CTA's share of them (rows [s·kC, (s+1)·kC)), which the cluster reads
  __shared__ float v_sh[kC], gate_sh[kC];  // the CTA's columns of v and of the output gate
  __shared__ float fa_sh[kMaxRank], ga_sh[kMaxRank];
  __shared__ __align__(16) bf16 f_b_sh[kC][kMaxRank], g_b_sh[kC][kMaxRank];  // the CTA's rows of f_b, g_b
  __shared__ float4 sum_scratch[Tile::kWarps * Tile::kQuads * kRecurSums];
  __shared__ float sum_sq_sh;

  const int split = blockIdx.x;  // also the CTA's rank in its cluster
  const auto [h, row, quad, row_group, col, token_head] = decode_thread<Tile>(p.heads);
  const int tid = threadIdx.x;
  bf16* out = p.out + token_head * D + col;

  const Span span = block_find_span(p.table, p.num_spans, row, &span_shared);
  if (span.slot < 0) {  // padding or a row of no sequence
    finish_empty_row(out, row_group);
    return;
  }
  float4 s[Tile::kRows];  // rows row_group + kRowGroups·i, columns col .. col+3
  float* state = load_state<Tile, D>(p.state, span.slot, p.heads, h, col, row_group, s);
  // Four threads per gate row: f_b's row for key row s·kC + gate_row and g_b's for value column
  // s·kC + gate_row. Each thread copies, and later reads, the 8-column chunks gate_part, gate_part + 4, ...
  const int gate_row = tid / 4, gate_part = tid % 4;
  const int64_t w_row = (static_cast<int64_t>(h) * D + split * kC + gate_row) * p.rank;
#pragma unroll
  for (int j = 0; j < kRankChunks; ++j) {
    const int c = 8 * (4 * j + gate_part);
    if (c < p.rank) {
      cp_async16(&f_b_sh[gate_row][c], p.f_b + w_row + c, true);
      if (p.g_b != nullptr) cp_async16(&g_b_sh[gate_row][c], p.g_b + w_row + c, true);
    }
  }
  cp_async_commit();
  // The other weights the work after the wait needs, in registers: the head's rate and the gate row's
  // dt_bias (gate_part 0 threads use them) and the norm weight of the thread's columns.
  const float rate = expf(p.a_log.load(h));
  const float dt_bias = p.dt_bias.load(h * D + split * kC + gate_row);
  const float4 norm_w = load4(p.o_norm, col);
  // Conv: thread tid < 3·kC owns channel s·kC + tid % kC of q (tid / kC = 0), k (1) or v (2).
  const int64_t dl = static_cast<int64_t>(p.heads) * D;
  const bool conv_thread = tid < 3 * kC;
  const int conv_part = tid / kC, conv_i = tid % kC;
  const int64_t channel = conv_part * dl + static_cast<int64_t>(h) * D + split * kC + conv_i;
  const int hist = p.conv_width - 1;
  const int64_t cache = (span.slot * 3 * dl + channel) * hist;  // [W-1] raw inputs, oldest first
  float taps[kMaxConvWidth], window[kMaxConvWidth - 1];
#pragma unroll
  for (int j = 0; j < kMaxConvWidth; ++j) {
    taps[j] = conv_thread && j < p.conv_width ? p.conv_w.load(channel * p.conv_width + j) : 0.0f;
    if (j < kMaxConvWidth - 1) window[j] = conv_thread && j < hist ? p.conv_state.load(cache + j) : 0.0f;
  }
  pdl_wait();
  pdl_trigger();

  // Every value this thread takes from the row's projection is requested before any is used: with the
  // beta load beside its sigmoid (a division with a called slow path) and each shared-memory store beside
  // its load, the compiler had issued them as three round trips one after another. Together: this kernel
  // 5.63-5.64 -> 5.33-5.34 µs at batch 1, 18.35-18.40 -> 17.95-17.96 at batch 8 (kernel_bench
  // --kda-decode on an H200).
  const XT* x = p.proj + row * p.proj_ld;  // this row's projection [P]
  const float beta_logit = to_float(x[p.cols.beta + h]);
  constexpr int kRankSteps = (kMaxRank + Tile::kThreads - 1) / Tile::kThreads;
  float fa[kRankSteps], ga[kRankSteps];  // fa_sh and ga_sh entries tid + i·kThreads
#pragma unroll
  for (int i = 0; i < kRankSteps; ++i) {
    const int r = tid + i * Tile::kThreads;
    fa[i] = r < p.rank ? to_float(x[p.cols.fa + r]) : 0.0f;
    ga[i] = r < p.rank && p.g_b != nullptr ? to_float(x[p.cols.gate + r]) : 0.0f;
  }
  const float input = conv_thread ? to_float(x[p.cols.qkv + channel]) : 0.0f;
  const bool own_gate = p.g_b == nullptr && tid < kC;  // the gate columns of proj are the gate itself
  const float gate_in = own_gate ? to_float(x[p.cols.gate + h * D + split * kC + tid]) : 0.0f;
#pragma unroll
  for (int i = 0; i < kRankSteps; ++i) {
    const int r = tid + i * Tile::kThreads;
    if (r < p.rank) {
      fa_sh[r] = fa[i];
      if (p.g_b != nullptr) ga_sh[r] = ga[i];
    }
  }
  if (own_gate) gate_sh[tid] = gate_in;
  if (conv_thread) {
    // The CPU op's order: taps over the cached inputs oldest first, then the new input.
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvWidth; ++j) {
      if (j < hist) {
        acc += taps[j] * window[j];
      } else if (j == hist) {
        acc += taps[j] * input;
      }
    }
#pragma unroll
    for (int j = 0; j < kMaxConvWidth - 1; ++j) {
      if (j < hist) p.conv_state.store(cache + j, j + 1 < hist ? window[j + 1] : input);
    }
    const float y = silu(acc);
    if (conv_part < 2) {
      slice_sh[conv_part][conv_i] = y;
    } else {
      v_sh[conv_i] = y;
    }
  }
  __syncthreads();

  // The decays of key rows s·kC + gate_row and the output gate of column s·kC + gate_row: the four threads
  // of a row add their shares (lanes tid ^ 1, tid ^ 2 of one warp; every lane gets the same sum). A thread
  // reads only the weight chunks it copied, so its own wait suffices.
  cp_async_wait<0>();
  float f_sum = row_share_dot(f_b_sh[gate_row], fa_sh, gate_part, p.rank);
  float g_sum = p.g_b != nullptr ? row_share_dot(g_b_sh[gate_row], ga_sh, gate_part, p.rank) : 0.0f;
  f_sum += __shfl_xor_sync(0xffffffffu, f_sum, 1);
  f_sum += __shfl_xor_sync(0xffffffffu, f_sum, 2);
  g_sum += __shfl_xor_sync(0xffffffffu, g_sum, 1);
  g_sum += __shfl_xor_sync(0xffffffffu, g_sum, 2);
  if (gate_part == 0) {
    slice_sh[2][gate_row] = expf(kda_gate_value(f_sum + dt_bias, rate, p.lower_bound));
    if (p.g_b != nullptr) gate_sh[gate_row] = g_sum;
  }

  // Each thread reads q, k and the decays of its key rows from the slices of the CTAs that own them.
  RowInputs<Tile> in;
  const float* slices = &slice_sh[0][0];
  if constexpr (Tile::kSplits > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster_arrive_release();
    cluster_wait();
    read_key_rows<Tile>(in, row_group, [&](int rank) { return cluster.map_shared_rank(slices, rank); });
  } else {
    __syncthreads();
    read_key_rows<Tile>(in, row_group, [&](int) { return slices; });
  }
  const float4 v = {v_sh[quad * 4], v_sh[quad * 4 + 1], v_sh[quad * 4 + 2], v_sh[quad * 4 + 3]};
  const float4 gate = {gate_sh[quad * 4], gate_sh[quad * 4 + 1], gate_sh[quad * 4 + 2],
                       gate_sh[quad * 4 + 3]};

  // The state goes back after the norm's cluster barrier, which would otherwise wait for those stores.
  const float b = logistic(beta_logit);
  float4 o = recur<Tile, D, false>(s, in, v, b, row_group, state, sum_scratch);
  o = gated_norm<Tile, D>(o, gate, norm_w, p.eps, &sum_sq_sh);
  store_state<Tile, D>(state, row_group, s);
  if (row_group == 0) store4_bf16(out, o);
  if constexpr (Tile::kSplits > 1) cluster_wait();
}

template <int D, class XT>
void launch_kda_decode_layer(const KdaLayerParams<XT>& p, int64_t rows, cudaStream_t stream) {
  using Tile = DecodeTile<D>;
  const dim3 grid(Tile::kSplits, p.heads, static_cast<unsigned>(rows));
  launch_pdl(kda_decode_layer_kernel<D, XT>, grid, Tile::kThreads, 0, stream, p, Tile::kSplits);
  HLM_CHECK_LAUNCH("kda_decode_layer_kernel");
}

}  // namespace

bool kda_decode_layer(CudaContext& ctx, const Tensor& proj, const KdaProjColumns& cols, const Tensor& conv_w,
                      const Tensor& f_b, const Tensor& g_b, const KdaHeadParams& hp, const SeqBatch& seqs,
                      Tensor& conv_state, Tensor& state, Tensor& out) {
  const char* op = "kda_decode_layer";
  check_kda_decode_layer(proj, cols, conv_w, f_b, g_b, conv_state, state, op);
  expect_cuda(proj, op, "proj", {DType::kBF16, DType::kF32}, 2, "[T, P]");
  expect_cuda(state, op, "state", {DType::kF32}, 4, "[slots, H, K, V]");
  expect_cuda(conv_w, op, "conv_w", {DType::kBF16, DType::kF32}, 2, "[3·H·K, W]");
  expect_cuda(conv_state, op, "conv_state", {DType::kBF16, DType::kF32}, 3, "[slots, 3·H·K, W-1]");
  expect_cuda(f_b, op, "f_b", {DType::kBF16, DType::kF32}, 2, "[H·K, r]");
  if (g_b.defined()) expect_cuda(g_b, op, "g_b", {DType::kBF16, DType::kF32}, 2, "[H·V, r]");
  const int64_t rows = proj.dim(0), heads = state.dim(1), kd = state.dim(2), rank = f_b.dim(1);
  HLM_CHECK(heads <= 65535, "{}: {} heads; the kernels take at most 65535", op, heads);
  check_kda_head_params(op, hp, heads, kd);
  check_seq_batch(seqs, rows, state.dim(0), op);
  check_kda_decode_batch(op, rows, kd, seqs, state);

  // The kernel's shapes; anything else takes the separate ops (the caller's fallback): a tiled head size,
  // bf16 gate weights of one rank r (a multiple of 32, at most kMaxRank, 16-byte aligned rows), conv widths
  // up to kMaxConvWidth.
  const bool weights_fit =
      f_b.dtype() == DType::kBF16 && rank % 32 == 0 && rank <= kMaxRank && aligned16(f_b.raw()) &&
      (!g_b.defined() || (g_b.dtype() == DType::kBF16 && g_b.dim(1) == rank && aligned16(g_b.raw())));
  if (!dispatch_head_dim(kd, [](auto) {}) || !weights_fit || conv_w.dim(1) > kMaxConvWidth) return false;
  // So do batches of more than kLayerMaxHeadRows (row, head) pairs, where the kernel's registers (the
  // state and the conv window: 76 at K = 128, 6 CTAs per SM, when this was measured; 92 and 5 on 2026-12-04)
  // make the grid run in many waves, each repeating the kernel's chain of latencies. Measured on an H200 with
  // 32 heads of K = V = r = 128 (kernel_bench --kda-decode, one call): this kernel against the separate ops
  // took 6.65 against 9.77 µs at batch 1, 7.85 against 14.89 at 2, 11.1 against 17.8 at 4, 20.3 against 25.6
  // at 8, and 154 against 105 at 64. (Measured there and dropped: 8 CTAs per SM through __launch_bounds__, 64
  // registers and 28 bytes of spills, so that batch 8 runs in one wave: 22.4 µs at batch 8, 6.8 at 1.)
  if (rows * heads > kLayerMaxHeadRows) return false;

  out = ctx.empty({rows, heads, kd}, DType::kBF16);  // [T, H, V]
  if (out.numel() == 0) return true;
  dispatch_float(proj.dtype(), op, [&](auto tag) {
    using XT = typename decltype(tag)::type;
    const KdaLayerParams<XT> p{static_cast<const XT*>(proj.raw()),
                               proj.dim(1),
                               cols,
                               float_in(conv_w),
                               float_in_out(conv_state),
                               static_cast<int>(conv_w.dim(1)),
                               static_cast<const bf16*>(f_b.raw()),
                               g_b.defined() ? static_cast<const bf16*>(g_b.raw()) : nullptr,
                               static_cast<int>(rank),
                               float_in(hp.a_log),
                               float_in(hp.dt_bias),
                               float_in(hp.o_norm),
                               hp.lower_bound,
                               hp.eps,
                               state.data<float>(),
                               static_cast<bf16*>(out.raw()),
                               seqs.table.data<int32_t>(),
                               static_cast<int>(seqs.spans.size()),
                               static_cast<int>(heads)};
    dispatch_head_dim(
        kd, [&](auto dim) { launch_kda_decode_layer<decltype(dim)::value, XT>(p, rows, ctx.stream()); });
  });
  return true;
}

}  // namespace hlm::cuda
