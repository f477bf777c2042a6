// MoE router (docs/MODEL.md §7.1) on the GPU, in two kernels: fp32 logits x·wᵀ (from cuBLASLt past 32
// tokens), then per token the sigmoid, the biased selection with grouped top-k and the renormalized raw
// weights, with the CPU op's rules (ops/cpu/moe.cc): ties go to the lower index, idx lists experts by
// descending biased score, and the weights are score / (Σ score + 1e-20) · scaling with the sum taken in
// selection order.
#include <climits>

#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/pdl.cuh"

namespace hlm::cuda {

namespace {

constexpr int kLogitWarps = 8;  // per logits CTA: kLogitExperts experts, kLogitSplit warps each
constexpr int kLogitSplit = 4;
constexpr int kLogitExperts = kLogitWarps / kLogitSplit;
constexpr int kSelectWarps = 2;  // tokens per selection CTA, one warp each
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 32;
constexpr int64_t kLogitKernelRows = 32;  // larger batches take their logits from cuBLASLt (moe_route)

// Eight consecutive elements (16-byte aligned) as floats.
__device__ __forceinline__ void load8(const bf16* p, float (&v)[8]) {
  bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(p)), v);
}
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

struct RouterLogitsParams {
  const void* x;  // [T, D]
  const void* w;  // [E, D]
  float* logits;  // [T, E]
  int64_t tokens;
  int64_t hidden;
  int64_t experts;
};

// logits[t, e] = Σ_d x[t, d]·w[e, d] in fp32. Grid (ceil(E / 2), ceil(T / kTok)), 8 warps: warps
// 4i .. 4i + 3 take expert blockIdx.x·2 + i for the kTok tokens of blockIdx.y, warp 4i + s the 256-column
// steps s, s + 4, ... of the hidden dimension (lane l: 8 columns at 8l of each step, one 16-byte load), so
// even one token keeps enough expert rows streaming. Each lane keeps a partial sum per token; the warp
// adds its lanes, and the four slices meet in shared memory, added in slice order. The token rows are
// shared by the CTA's warps through L1. (Measured on an H200 and dropped: the first four steps' weight
// loads issued before pdl_wait(): the router took 6.89 µs against 6.57 in kernel_bench --small-ops; and
// (2026-12-04) each lane's weight loads of four steps issued before their products, after the wait: 6.44
// against 5.97-6.01 µs. And one step per warp, 2 experts x 9 warps or 1 expert x 16 warps per CTA: moe_route
// 4.58-4.60 -> 4.34-4.35 or 4.28-4.31 µs alone, but the 48B's 4K batch-1 step 2.451-2.480 -> 2.534-2.555
// or 2.552-2.602 ms, the larger CTAs beside the shared experts' GEMMs on the other stream.)
template <class XT, class WT, int kTok>
__global__ void __launch_bounds__(kLogitWarps * 32) router_logits_kernel(RouterLogitsParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ float partial[kLogitWarps][kTok];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, slice = warp % kLogitSplit;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kLogitExperts + warp / kLogitSplit;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;
  const int64_t left = p.tokens - t0;
  const int count = left < kTok ? static_cast<int>(left) : kTok;
  float acc[kTok];
#pragma unroll
  for (int i = 0; i < kTok; ++i) acc[i] = 0.0f;
  if (e < p.experts) {
    const XT* x = static_cast<const XT*>(p.x) + t0 * p.hidden;  // [count, D]
    const WT* w = static_cast<const WT*>(p.w) + e * p.hidden;   // [D]
    for (int64_t c = (slice * 32 + lane) * 8; c < p.hidden; c += kLogitSplit * 256) {
      float wv[8];
      load8(w + c, wv);
#pragma unroll
      for (int i = 0; i < kTok; ++i) {
        if (i < count) {
          float xv[8];
          load8(x + i * p.hidden + c, xv);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i] = fmaf(xv[j], wv[j], acc[i]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kTok; ++i) {
    if (i < count) {
      const float v = warp_sum(acc[i]);
      if (lane == 0) partial[warp][i] = v;
    }
  }
  __syncthreads();
  if (e < p.experts && slice == 0 && lane < count) {
    float v = partial[warp][lane];
#pragma unroll
    for (int s = 1; s < kLogitSplit; ++s) v += partial[warp + s][lane];
    p.logits[(t0 + lane) * p.experts + e] = v;
  }
}

template <class XT, class WT>
void launch_router_logits(const RouterLogitsParams& p, cudaStream_t stream) {
  const unsigned expert_blocks = blocks_for(p.experts, kLogitExperts);
  // Decode batches take one token tile; up to 32 tokens share each expert row.
  if (p.tokens <= 8) {
    launch_pdl(router_logits_kernel<XT, WT, 8>, dim3(expert_blocks, blocks_for(p.tokens, 8)),
               kLogitWarps * 32, 0, stream, p);
  } else {
    launch_pdl(router_logits_kernel<XT, WT, 32>, dim3(expert_blocks, blocks_for(p.tokens, 32)),
               kLogitWarps * 32, 0, stream, p);
  }
  HLM_CHECK_LAUNCH("router_logits_kernel");
}

struct RouterSelectParams {
  const float* logits;  // [T, E]
  const void* bias;     // [E] F32 or BF16
  bool bias_bf16;
  int32_t* idx;    // [T, k]
  float* weights;  // [T, k]
  int64_t tokens;
  int experts;
  int groups;     // num_expert_group
  int per_group;  // E / groups
  int topk_group;
  int top_k;
  bool renormalize;
  float scaling;
};

// Shared floats per warp of the selection kernel, used only with expert groups: choice [E], group score
// [G], kept [G].
__host__ __device__ int select_smem_floats(const RouterSelectParams& p) {
  return p.groups > 1 ? p.experts + 2 * p.groups : 0;
}

// The index of the warp's best candidate (v, i): the largest value, ties to the lower index (an empty
// candidate is (-inf, INT_MAX); v is never NaN, see ranked()). Two warp reductions (redux.sync): the max of
// an order-preserving unsigned key of v, then the min index among the lanes holding it; -0 and +0 share a
// key, as they compare equal. A butterfly of 5 shuffle pairs and compare-selects per round took longer:
// the top-k rounds are a serial chain of these (moe_route at the 48B's batch-1 shape, kernel_bench
// --small-ops on an H200: 6.21 against 6.57 µs).
__device__ __forceinline__ int warp_argmax(float v, int i) {
  const unsigned bits = __float_as_uint(v + 0.0f);  // -0 -> +0
  const unsigned key = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  const unsigned best = __reduce_max_sync(0xffffffffu, key);
  return static_cast<int>(__reduce_min_sync(
      0xffffffffu, key == best ? static_cast<unsigned>(i) : static_cast<unsigned>(INT_MAX)));
}

// NaN never wins a comparison, so it is ranked as -inf; every round then has a real winner.
__device__ __forceinline__ float ranked(float v) { return isnan(v) ? -INFINITY : v; }

// The bias of the experts a thread owns (j·stride + first, j < kVpl); the bias is a weight, so its loads
// may go out before the wait for the logits.
template <int kVpl>
__device__ __forceinline__ void load_bias(const RouterSelectParams& p, int first, int stride,
                                          float (&bias)[kVpl]) {
#pragma unroll
  for (int j = 0; j < kVpl; ++j) {
    const int e = j * stride + first;
    bias[j] = 0.0f;
    if (e < p.experts) {
      bias[j] = p.bias_bf16 ? __bfloat162float(static_cast<const bf16*>(p.bias)[e])
                            : static_cast<const float*>(p.bias)[e];
    }
  }
}

// The same experts' scores sigmoid(logit) and biased scores ranked(score + bias) of token row `logits`, and
// the mask of those that exist (bit j: expert j·stride + first).
template <int kVpl>
__device__ __forceinline__ uint32_t load_choices(const RouterSelectParams& p, const float* logits, int first,
                                                 int stride, const float (&bias)[kVpl], float (&score)[kVpl],
                                                 float (&c)[kVpl]) {
  // Every logit is loaded before any is used: with each load beside its sigmoid, whose division calls a
  // slow path, the compiler issued them one after another, each a full L2 round trip (the selection at 8
  // experts per lane: 2.1-2.8 µs from the dependency wait to the last choice, globaltimer stamps on an
  // H200). Loaded together: moe_route 5.59 -> 4.59 µs at the 48B's batch-1 shape (kernel_bench
  // --small-ops), the 4K batch-1 step 2.486-2.525 -> 2.472-2.505 ms.
  float logit[kVpl];
#pragma unroll
  for (int j = 0; j < kVpl; ++j) {
    const int e = j * stride + first;
    logit[j] = e < p.experts ? logits[e] : 0.0f;
  }
  uint32_t exists = 0;
#pragma unroll
  for (int j = 0; j < kVpl; ++j) {
    const int e = j * stride + first;
    score[j] = 0.0f;
    c[j] = -INFINITY;
    if (e < p.experts) {
      score[j] = logistic(logit[j]);
      c[j] = ranked(score[j] + bias[j]);
      exists |= 1u << j;
    }
  }
  return exists;
}

// Lane r < top_k of the selecting warp writes round r's expert and its weight, score / (Σ score + 1e-20) ·
// scaling (renormalized) or score · scaling.
__device__ __forceinline__ void write_selection(const RouterSelectParams& p, int64_t t, int lane, int expert,
                                                float score, float sum) {
  const float denom = p.renormalize ? sum + 1e-20f : 1.0f;
  if (lane < p.top_k) {
    p.idx[t * p.top_k + lane] = expert;
    p.weights[t * p.top_k + lane] = score / denom * p.scaling;
  }
}

// Step 3 of select_token below for up to kSortedVpl experts per lane: each lane sorts its candidates once,
// by descending choice (odd-even transposition with a strict compare, so equal choices keep their
// ascending expert order; experts past E or outside the kept groups sort last as (-inf, INT_MAX)), and a
// round is
// then the warp argmax of the lanes' first candidates and a shift in the winner's lane, not a scan of
// every candidate. The same winners in the same order as the scan (its lane best is the lane's first
// sorted candidate). Measured on an H200 at the 48B's 256 experts, top 8, batch 1: moe_route 5.95-5.96 ->
// 5.56-5.59 µs (kernel_bench --small-ops); in the decode step the selection ends 4.3 µs after the logits
// instead of 4.6 (bench --kernel-trace), the step unchanged within its noise, since the shared experts'
// GEMMs beside the router end only 0.8 µs earlier (docs/benchmarks.md, the nineteenth session).
constexpr int kSortedVpl = 8;

template <int kVpl>
__device__ void select_sorted(const RouterSelectParams& p, int64_t t, int lane, const float (&score)[kVpl],
                              const float (&c)[kVpl], uint32_t exists) {
  float v[kVpl], s[kVpl];
  int id[kVpl];
#pragma unroll
  for (int j = 0; j < kVpl; ++j) {
    const bool e = (exists >> j) & 1u;
    v[j] = e ? c[j] : -INFINITY;
    id[j] = e ? j * 32 + lane : INT_MAX;
    s[j] = score[j];
  }
#pragma unroll
  for (int pass = 0; pass < kVpl; ++pass) {
#pragma unroll
    for (int i = pass & 1; i + 1 < kVpl; i += 2) {
      const bool swap = v[i] < v[i + 1];
      const float vi = v[i], si = s[i];
      const int ii = id[i];
      v[i] = swap ? v[i + 1] : vi, s[i] = swap ? s[i + 1] : si, id[i] = swap ? id[i + 1] : ii;
      v[i + 1] = swap ? vi : v[i + 1], s[i + 1] = swap ? si : s[i + 1], id[i + 1] = swap ? ii : id[i + 1];
    }
  }
  float sum = 0.0f, my_score = 0.0f;  // sum: every lane, in selection order (the CPU op's order)
  int my_expert = 0;
  for (int r = 0; r < p.top_k; ++r) {
    const int bi = warp_argmax(v[0], id[0]);
    const int owner = bi & 31;
    const float won = __shfl_sync(0xffffffffu, s[0], owner);
    const bool shift = owner == lane;
#pragma unroll
    for (int j = 0; j + 1 < kVpl; ++j) {
      v[j] = shift ? v[j + 1] : v[j], s[j] = shift ? s[j + 1] : s[j], id[j] = shift ? id[j + 1] : id[j];
    }
    if (shift) v[kVpl - 1] = -INFINITY, id[kVpl - 1] = INT_MAX;
    sum += won;
    if (r == lane) my_expert = bi, my_score = won;
  }
  write_selection(p, t, lane, my_expert, my_score, sum);
}

// The selection for token t by one warp (smem: the warp's select_smem_floats). Lane l owns experts
// j·32 + l for j < kVpl and keeps their scores and biased scores (`choice`) in registers, with a bit mask
// of the ones still selectable. Steps:
//  1. score = sigmoid(logit) and choice = score + bias.
//  2. Groups (G > 1): choice goes to the warp's shared array; the warp takes the groups one after another,
//     each lane keeping the top two of its strided members, merged across lanes; then topk_group rounds of
//     warp argmax keep the best groups and the experts of the other groups leave the mask.
//  3. top_k rounds of warp argmax over the lanes' best remaining experts (each lane's sorted list,
//     select_sorted, up to kSortedVpl experts per lane; a scan per round past that); the winner's owner
//     removes it and passes its raw score to every lane, which add it to the sum in selection order; lane
//     r keeps round r's expert and score, so nothing goes through memory before the outputs.
template <int kVpl>
__device__ void select_token(const RouterSelectParams& p, int64_t t, int lane, const float (&bias)[kVpl],
                             float* smem) {
  float* choice = smem;                                        // [E] (groups only)
  float* group_score = choice + p.experts;                     // [G]
  int* kept = reinterpret_cast<int*>(group_score + p.groups);  // [G]
  const float* logits = p.logits + t * p.experts;

  float score[kVpl], c[kVpl];
  uint32_t selectable = load_choices<kVpl>(p, logits, lane, 32, bias, score, c);
  if (p.groups > 1) {
#pragma unroll
    for (int j = 0; j < kVpl; ++j) {
      const int e = j * 32 + lane;
      if (e < p.experts) choice[e] = c[j];
    }
    __syncwarp();
    for (int g = 0; g < p.groups; ++g) {
      // The top two of the lane's members (a multiset: equal values count twice).
      float m1 = -INFINITY, m2 = -INFINITY;
      for (int i = lane; i < p.per_group; i += 32) {
        const float v = choice[g * p.per_group + i];
        if (v > m1) {
          m2 = m1;
          m1 = v;
        } else if (v > m2) {
          m2 = v;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float o1 = __shfl_xor_sync(0xffffffffu, m1, o);
        const float o2 = __shfl_xor_sync(0xffffffffu, m2, o);
        m2 = fmaxf(fminf(m1, o1), fmaxf(m2, o2));
        m1 = fmaxf(m1, o1);
      }
      if (lane == 0) {
        group_score[g] = ranked(m1 + m2);
        kept[g] = 0;
      }
    }
    __syncwarp();
    for (int r = 0; r < p.topk_group; ++r) {
      float bv = -INFINITY;
      int bi = INT_MAX;
      for (int g = lane; g < p.groups; g += 32) {
        if (!kept[g] && (bi == INT_MAX || group_score[g] > bv)) bv = group_score[g], bi = g;
      }
      bi = warp_argmax(bv, bi);
      if (lane == 0) kept[bi] = 1;
      __syncwarp();
    }
#pragma unroll
    for (int j = 0; j < kVpl; ++j) {
      const int e = j * 32 + lane;
      if (e < p.experts && !kept[e / p.per_group]) selectable &= ~(1u << j);
    }
  }
  if constexpr (kVpl <= kSortedVpl) {
    select_sorted<kVpl>(p, t, lane, score, c, selectable);
    return;
  }

  // More than kSortedVpl experts per lane (over 256 experts, in groups): each round scans them.
  float sum = 0.0f, my_score = 0.0f;  // sum: every lane, in selection order (the CPU op's order)
  int my_expert = 0;
  for (int r = 0; r < p.top_k; ++r) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int j = 0; j < kVpl; ++j) {  // ascending experts: a strict > keeps the lower index on ties
      if (((selectable >> j) & 1u) && (bi == INT_MAX || c[j] > bv)) bv = c[j], bi = j * 32 + lane;
    }
    bi = warp_argmax(bv, bi);
    const int owner = bi & 31, slot = bi >> 5;
    float won = 0.0f;
#pragma unroll
    for (int j = 0; j < kVpl; ++j) won = j == slot ? score[j] : won;
    won = __shfl_sync(0xffffffffu, won, owner);
    if (owner == lane) selectable &= ~(1u << slot);
    sum += won;
    if (r == lane) my_expert = bi, my_score = won;
  }
  write_selection(p, t, lane, my_expert, my_score, sum);
}

// Grid ceil(T / kSelectWarps), one warp per token, no CTA-wide sync. (Measured on an H200 and dropped:
// selecting in the last logits CTA to finish, counted through an atomic, instead of this second launch:
// 3.19 against 3.17 ms per batch-1 step, 8.47 against 8.45 at batch 8. And (2026-12-04) every CTA of the
// routed experts' decode kernel selecting in its prologue (moe_decode_experts.cu; the shared experts then
// joined before its combine): the 48B's 4K batch-1 step 2.497-2.504 ms against 2.472-2.505 with this
// kernel, 128K 2.857 against 2.791, batch 4 4.835 against 4.769 (bench --random-weights, both with the
// loads of load_choices above), and 2.62 ms while its early-launched CTAs shared SMs with the logits and
// shared-expert CTAs, unless held to one per SM with padding shared memory; its timestamps showed the
// selection itself, not the launch, as the cost.)
template <int kVpl>
__global__ void __launch_bounds__(kSelectWarps * 32) router_select_kernel(RouterSelectParams p) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float bias[kVpl];
  load_bias<kVpl>(p, lane, 32, bias);
  pdl_wait();
  pdl_trigger();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kSelectWarps + warp;
  if (t < p.tokens) select_token<kVpl>(p, t, lane, bias, smem + warp * select_smem_floats(p));
}

// Without expert groups and past 256 experts (K3's 896: 28 per lane), one warp's top_k rounds each
// scanned up to 32 values per lane: 15.4 µs per call, against 11.0 for this kernel (K3's decode step at
// batch 1, ncu on an H200; the rounds' warp reductions are the rest of the chain). Here a token
// takes a CTA of kWideWarps warps: thread i owns experts j·kWideThreads + i, so warp w's lanes hold a
// strided share of at most kWidePerThread experts each. Every warp ranks its share as select_token does
// (top_k rounds of warp_argmax) and lists its winners in shared memory; warp 0 then takes top_k rounds over
// the kWideWarps·top_k listed candidates. Any expert of the token's top_k is among its warp's top_k, and both
// stages order by (biased score descending, index ascending), so the selection, its order and the sum's
// order are select_token's.
constexpr int kWideWarps = 8;
constexpr int kWideThreads = kWideWarps * 32;
constexpr int kWidePerThread = kMaxExperts / kWideThreads;
constexpr int kWideListPerLane = kWideWarps * kMaxTopK / 32;  // listed candidates per lane of warp 0

__global__ void __launch_bounds__(kWideThreads) router_select_wide_kernel(RouterSelectParams p) {
  __shared__ float list_choice[kWideWarps * kMaxTopK];  // warp w's round-r winner at w·top_k + r
  __shared__ float list_score[kWideWarps * kMaxTopK];
  __shared__ int list_expert[kWideWarps * kMaxTopK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float bias[kWidePerThread];
  load_bias<kWidePerThread>(p, threadIdx.x, kWideThreads, bias);
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const float* logits = p.logits + t * p.experts;

  // Stage 1: the warp's top_k of its share.
  float score[kWidePerThread], c[kWidePerThread];
  uint32_t selectable = load_choices<kWidePerThread>(p, logits, threadIdx.x, kWideThreads, bias, score, c);
  for (int r = 0; r < p.top_k; ++r) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int j = 0; j < kWidePerThread; ++j) {  // ascending experts: a strict > keeps the lower index
      if (((selectable >> j) & 1u) && (bi == INT_MAX || c[j] > bv))
        bv = c[j], bi = j * kWideThreads + threadIdx.x;
    }
    bi = warp_argmax(bv, bi);
    const int owner = bi & 31, slot = bi / kWideThreads;
    float won_c = -INFINITY, won_s = 0.0f;
#pragma unroll
    for (int j = 0; j < kWidePerThread; ++j) {
      if (j == slot) won_c = c[j], won_s = score[j];
    }
    won_c = __shfl_sync(0xffffffffu, won_c, owner);
    won_s = __shfl_sync(0xffffffffu, won_s, owner);
    if (owner == lane) selectable &= ~(1u << slot);
    if (lane == 0) {
      list_choice[warp * p.top_k + r] = won_c;
      list_score[warp * p.top_k + r] = won_s;
      list_expert[warp * p.top_k + r] = bi;
    }
  }
  __syncthreads();
  if (warp != 0) return;

  // Stage 2: top_k rounds over the listed candidates (entry i·32 + lane of the list for lane `lane`).
  const int listed = kWideWarps * p.top_k;
  float lc[kWideListPerLane], ls[kWideListPerLane];
  int le[kWideListPerLane];
  uint32_t open = 0;
#pragma unroll
  for (int i = 0; i < kWideListPerLane; ++i) {
    const int q = i * 32 + lane;
    lc[i] = -INFINITY, ls[i] = 0.0f, le[i] = INT_MAX;
    if (q < listed) lc[i] = list_choice[q], ls[i] = list_score[q], le[i] = list_expert[q], open |= 1u << i;
  }
  float sum = 0.0f, my_score = 0.0f;  // sum: every lane, in selection order (the CPU op's order)
  int my_expert = 0;
  for (int r = 0; r < p.top_k; ++r) {
    float bv = -INFINITY;
    int bi = INT_MAX, bslot = 0;
#pragma unroll
    for (int i = 0; i < kWideListPerLane; ++i) {
      // The lower expert index wins a tie, whatever the entries' order in the list.
      if (((open >> i) & 1u) && (bi == INT_MAX || lc[i] > bv || (lc[i] == bv && le[i] < bi)))
        bv = lc[i], bi = le[i], bslot = i;
    }
    const int winner = warp_argmax(bv, bi);
    const unsigned holders = __ballot_sync(0xffffffffu, bi == winner && bi != INT_MAX);
    const int owner = __ffs(holders) - 1;
    float won = 0.0f;
#pragma unroll
    for (int i = 0; i < kWideListPerLane; ++i) won = i == bslot ? ls[i] : won;
    won = __shfl_sync(0xffffffffu, won, owner);
    if (owner == lane) open &= ~(1u << bslot);
    sum += won;
    if (r == lane) my_expert = winner, my_score = won;
  }
  write_selection(p, t, lane, my_expert, my_score, sum);
}

void launch_router_select(const RouterSelectParams& p, cudaStream_t stream) {
  const int per_lane = (p.experts + 31) / 32;
  if (p.groups == 1 && per_lane > 8) {
    launch_pdl(router_select_wide_kernel, static_cast<unsigned>(p.tokens), kWideThreads, 0, stream, p);
    HLM_CHECK_LAUNCH("router_select_wide_kernel");
    return;
  }
  const unsigned blocks = blocks_for(p.tokens, kSelectWarps);
  const size_t smem = sizeof(float) * kSelectWarps * select_smem_floats(p);
  switch (per_lane <= 1    ? 1
          : per_lane <= 2  ? 2
          : per_lane <= 4  ? 4
          : per_lane <= 8  ? 8
          : per_lane <= 16 ? 16
                           : 32) {
    case 1:
      launch_pdl(router_select_kernel<1>, blocks, kSelectWarps * 32, smem, stream, p);
      break;
    case 2:
      launch_pdl(router_select_kernel<2>, blocks, kSelectWarps * 32, smem, stream, p);
      break;
    case 4:
      launch_pdl(router_select_kernel<4>, blocks, kSelectWarps * 32, smem, stream, p);
      break;
    case 8:
      launch_pdl(router_select_kernel<8>, blocks, kSelectWarps * 32, smem, stream, p);
      break;
    case 16:
      launch_pdl(router_select_kernel<16>, blocks, kSelectWarps * 32, smem, stream, p);
      break;
    default:
      launch_pdl(router_select_kernel<32>, blocks, kSelectWarps * 32, smem, stream, p);
      break;
  }
  HLM_CHECK_LAUNCH("router_select_kernel");
}

}  // namespace

void moe_route(CudaContext& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const RouterParams& p,
               Tensor& idx, Tensor& weights) {
  const char* op = "moe_route";
  expect_cuda(x, op, "x", {DType::kBF16, DType::kF32}, 2, "[T, D]");
  expect_cuda(w, op, "w", {DType::kBF16, DType::kF32}, 2, "[E, D]");
  expect_cuda(bias, op, "bias", {DType::kF32, DType::kBF16}, 1, "[E]");
  expect_dim(w, 1, x.dim(1), op, "w [E, D]", "the hidden size of x [T, D]");
  const int64_t rows = x.dim(0), hidden = x.dim(1), experts = w.dim(0);
  expect_dim(bias, 0, experts, op, "bias [E]", "the expert count of w [E, D]");
  check_router_params(p, experts, op);
  const int64_t groups = p.num_expert_group, per_group = experts / groups;
  // One warp ranks a token's experts from registers, at most 32 per lane, and lane r keeps round r.
  HLM_CHECK(experts <= kMaxExperts, "moe_route: the CUDA router takes at most {} experts, got {}",
            kMaxExperts, experts);
  HLM_CHECK(p.top_k <= kMaxTopK,
            "moe_route: the CUDA router selects at most {} experts per token, got top_k {}", kMaxTopK,
            p.top_k);
  // The logits kernel reads 8 columns per 16-byte load.
  HLM_CHECK(hidden % 8 == 0 && aligned16(x.raw()) && aligned16(w.raw()),
            "moe_route: the CUDA router needs a hidden size divisible by 8 and 16-byte aligned x and w, got "
            "x {} and w {}",
            x.describe(), w.describe());
  prepare_output(ctx, idx, {rows, p.top_k}, DType::kI32, op, "idx");
  prepare_output(ctx, weights, {rows, p.top_k}, DType::kF32, op, "weights");
  if (rows == 0) return;

  Tensor logits;  // [T, E] F32
  // A prefill-sized batch is a real GEMM: cuBLASLt, fp32 accumulation and output (a BF16 x with an F32
  // router weight is widened to F32, exactly). The CUDA-core kernel below took 50 ms of an 8K-token
  // prefill of Kimi-Linear-48B (5.6% of its kernel time, measured with ncu on an H200). A BF16 router weight
  // (K3's) at 2 to 16 tokens takes the skinny GEMM's tensor-core stream (through linear): there the kernel
  // below reloads every token's row for each expert's row: K3's [896, 7168] at 8 tokens took 24.3 µs per
  // call (0.5 TB/s) there, 12.3 here (ncu on an H200; 56 row tiles, under half the SMs).
  if (rows > kLogitKernelRows || (rows > 1 && skinny_gemm_applies(x, w))) {
    logits = linear(ctx, x, w, true);
  } else {
    logits = ctx.empty({rows, experts}, DType::kF32);
    const RouterLogitsParams lp{x.raw(), w.raw(), logits.data<float>(), rows, hidden, experts};
    const bool x_bf16 = x.dtype() == DType::kBF16, w_bf16 = w.dtype() == DType::kBF16;
    switch ((x_bf16 ? 2 : 0) + (w_bf16 ? 1 : 0)) {
      case 3:
        launch_router_logits<bf16, bf16>(lp, ctx.stream());
        break;
      case 2:
        launch_router_logits<bf16, float>(lp, ctx.stream());
        break;
      case 1:
        launch_router_logits<float, bf16>(lp, ctx.stream());
        break;
      default:
        launch_router_logits<float, float>(lp, ctx.stream());
        break;
    }
  }

  RouterSelectParams sp{};
  sp.logits = logits.data<float>();
  sp.bias = bias.raw();
  sp.bias_bf16 = bias.dtype() == DType::kBF16;
  sp.idx = idx.data<int32_t>();
  sp.weights = weights.data<float>();
  sp.tokens = rows;
  sp.experts = static_cast<int>(experts);
  sp.groups = static_cast<int>(groups);
  sp.per_group = static_cast<int>(per_group);
  sp.topk_group = static_cast<int>(p.topk_group);
  sp.top_k = static_cast<int>(p.top_k);
  sp.renormalize = p.renormalize;
  sp.scaling = p.scaling;
  launch_router_select(sp, ctx.stream());
}

}  // namespace hlm::cuda
