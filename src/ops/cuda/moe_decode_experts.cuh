// The routed experts of a decode-sized batch in one kernel (moe_decode_experts.cu), for BF16 experts and
// BF16 tokens: each CTA takes a slice of one active expert's intermediate rows, computes act(gate)·up for
// it and at once that slice's share of the down projection, so no launch boundary (and no h round trip)
// separates gate/up from down; a combine kernel then sums the slices and the slots in a fixed order.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "ops/cuda/device_math.cuh"

namespace hlm::cuda {

struct DecodeExpertsParams {
  const void* gate;      // [E_l, I, D] BF16
  const void* up;        // [E_l, I, D] BF16
  const void* down;      // [E_l, D, I] BF16
  const void* x;         // [T, D] BF16
  const int32_t* idx;    // [T, k] global expert ids
  const float* weights;  // [T, k]
  float* y;              // [S, T·k, D] scratch: each slice's down partial per pair (S = I / slice width)
  float* out;            // [T, D]
  const void* addend;    // [T, D] added to the sum (moe_experts_add), BF16 or F32; nullptr: none
  bool addend_bf16;
  int64_t tokens;  // T
  int64_t hidden;  // D
  int64_t inter;   // I
  int64_t expert_begin;
  int local;  // E_l
  int top_k;
  bool situ;
  float situ_beta, situ_linear_beta;
};

// Float4 d4 of row `row` of the combines' addend [T, D] (BF16 or F32), as floats; shared by both MoE
// combine kernels (moe_experts.cu and moe_decode_experts.cu).
__device__ __forceinline__ float4 load_addend4(const void* addend, bool is_bf16, int64_t row, int64_t D,
                                               int64_t d4) {
  if (is_bf16) {
    const uint2 raw = reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(addend) + row * D)[d4];
    const float2 lo = unpack_bf16x2(raw.x), hi = unpack_bf16x2(raw.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  return reinterpret_cast<const float4*>(static_cast<const float*>(addend) + row * D)[d4];
}

// The (token, slot) pairs a decode batch may have for this path: the CTA finds its expert among them in
// one warp.
constexpr int64_t kDecodeExpertsMaxPairs = 32;
constexpr int kDecodeExpertsMaxTopK = 16;

// Whether these shapes take the decode kernel (T·k and k within the limits above, I a multiple of 32, D
// of 16).
bool decode_experts_fit(int64_t tokens, int64_t top_k, int64_t hidden, int64_t inter);
// The slice width the launch uses for this intermediate size (sizes the y scratch: I / width slices).
int64_t decode_experts_slice(int64_t inter);
// The expert kernel over grid (I / width, min(E_l, T·k)), then the combine into out.
void launch_decode_experts(const DecodeExpertsParams& p, cudaStream_t stream);

}  // namespace hlm::cuda
