// The routed experts' expert-major work list (built by moe_experts.cu) and the tiled expert GEMMs that
// consume it for prefill-sized batches (moe_tiled_gemm.cu).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace hlm::cuda {

// Fixed-capacity device buffers: max_active = min(E_l, T·k) slots, T·k entries.
struct WorkList {
  int32_t* num_active;     // [1]
  int32_t* active_expert;  // [max_active] local expert of each active slot, ascending
  int32_t* active_begin;   // [max_active] first entry of its segment
  int32_t* active_count;   // [max_active] entries in its segment (>= 1)
  int32_t* entries;        // [T·k] pairs t·k + j, grouped by local expert
};

// What the tiled GEMMs need besides the list: the experts gate, up [E_l, I, D] and down [E_l, D, I] as BF16,
// or as MXFP4 codes (bytes [E_l, rows, cols/2]) with scales (bytes [E_l, rows, cols/32]), x [T, D] BF16, and
// the outputs h [T·k, I] BF16 (act(gate)·up per pair) and y [T·k, D] F32 (down per pair).
struct TiledExpertsParams {
  const void* gate;
  const void* up;
  const void* down;
  const uint8_t* gate_scale;  // MXFP4 only; nullptr for BF16 experts
  const uint8_t* up_scale;
  const uint8_t* down_scale;
  const void* x;
  void* h;
  void* y;
  WorkList list;
  int64_t pairs;  // T·k
  int64_t max_active;
  int64_t hidden;  // D
  int64_t inter;   // I
  int top_k;
  bool situ;
  float situ_beta, situ_linear_beta;
};

// Whether the tiled GEMMs take these shapes (BF16 or MXFP4 weights, BF16 x; D a multiple of 128, I of 64).
bool tiled_experts_fit(int64_t hidden, int64_t inter);
// The gate/up and down GEMMs over the list, tiled 128 pairs x 128 weight rows (after a one-CTA kernel that
// numbers the tiles), writing h and then y. Needs scratch for the tile table: tile_table_ints(p) ints.
int64_t tile_table_ints(int64_t pairs, int64_t max_active);
void launch_tiled_experts(const TiledExpertsParams& p, int32_t* tile_table, cudaStream_t stream);

}  // namespace hlm::cuda
