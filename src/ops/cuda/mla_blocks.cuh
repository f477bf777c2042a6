// What the MLA attention kernel (mla_attention.cu) shares with its host launcher (mla.cu): the launch
// parameters, and the device side of the batch table (which sequence a CTA's row block belongs to, and the
// rows no sequence covers).
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/cuda/cuda_kernels.h"

namespace hlm::cuda {

// Query rows per warpgroup (a row is one (token, head) pair): the N of the wgmma. A CTA's row block is one
// or two warpgroups' rows (MlaParams::block_rows).
constexpr int kMlaRows = 32;

struct MlaParams {
  const void* q;          // [T, H, D] BF16 or F32
  const bf16* cache;      // [pages, P, D]
  const int* page_table;  // [N]
  const int* seqs;        // [S, 4]: token_begin, token_count, page_begin, num_pages
  const int* kv_len;      // [T]
  float* out;             // one split: [T, H, v_dim]; several: partials [splits, T·H, v_dim]
  float* stats;           // one split: [T, H, 2]; several: partials [splits, T·H, 2]
  int64_t cache_pages;
  int tokens, heads, dim, v_dim, page_size, num_seqs, page_table_len, splits;
  int block_rows;  // query rows per CTA: kMlaRows or 2·kMlaRows (one or two warpgroups)
  int page_shift;  // log2(page_size) when it is a power of two (a key's page by a shift), else -1
  float scale;
};

// Launches the attention kernel: grid (row-block slots, splits); bf16_q says q's dtype (else F32), wide
// picks the 576 / 512 instantiation (Kimi Linear, K3) over the 128 / 128 one (the fixtures).
void launch_mla_attention(const MlaParams& p, dim3 grid, bool bf16_q, bool wide, cudaStream_t stream);

struct SeqView {
  int token_begin, token_count, page_begin, num_pages;
};

// Sequence s of the device table, clamped to the tensors so that a bad entry cannot reach outside them
// (the host checks its own copy of the list; under graphs the device table is refilled between replays).
__device__ __forceinline__ SeqView read_seq(const MlaParams& p, int s) {
  const int* e = p.seqs + 4 * static_cast<int64_t>(s);
  SeqView v{e[0], e[1], e[2], e[3]};
  if (v.token_begin < 0 || v.token_begin > p.tokens) v.token_count = 0;
  v.token_count = max(0, min(v.token_count, p.tokens - v.token_begin));
  if (v.page_begin < 0 || v.page_begin > p.page_table_len) v.num_pages = 0;
  v.num_pages = max(0, min(v.num_pages, p.page_table_len - v.page_begin));
  return v;
}

// Row blocks are numbered sequence by sequence (sequence s has ceil(token_count·H / block_rows) of them).
// Warp 0 finds the sequence of block `b` and its index there; a block past the last one (spare) gets seq -1
// and the total count, for zeroing the rows of tokens outside every sequence. Returned in every lane.
struct BlockOf {
  int seq, local, total;
};
__device__ inline BlockOf find_block(const MlaParams& p, int b, int lane) {
  int base = 0;
  for (int s0 = 0; s0 < p.num_seqs; s0 += 32) {
    const int s = s0 + lane;
    const int blocks =
        s < p.num_seqs ? (read_seq(p, s).token_count * p.heads + p.block_rows - 1) / p.block_rows : 0;
    int incl = blocks;  // inclusive scan of the block counts over the lanes
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int first = base + incl - blocks;
    const unsigned mine = __ballot_sync(0xffffffffu, b >= first && b < first + blocks);
    if (mine != 0) {
      const int src = __ffs(mine) - 1;
      return BlockOf{s0 + src, b - __shfl_sync(0xffffffffu, first, src), 0};
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  return BlockOf{-1, 0, base};
}

// A spare CTA (one past the row blocks) writes (-inf, 0) statistics, and with one split zero outputs, for
// the rows of every token no sequence covers (padding of a decode graph, gaps in a batch). Each warp takes
// tokens in turn; with several splits each split's spare CTAs fill that split's partial statistics.
template <int kWarps>
__device__ void zero_uncovered_rows(const MlaParams& p, int spare, int num_spare, int warp, int lane) {
  const int64_t rows = static_cast<int64_t>(p.tokens) * p.heads;
  for (int t = spare * kWarps + warp; t < p.tokens; t += num_spare * kWarps) {
    bool covered = false;
    for (int s0 = 0; s0 < p.num_seqs && !covered; s0 += 32) {
      bool in = false;
      if (s0 + lane < p.num_seqs) {
        const SeqView v = read_seq(p, s0 + lane);
        in = t >= v.token_begin && t < v.token_begin + v.token_count;
      }
      covered = __any_sync(0xffffffffu, in);
    }
    if (covered) continue;
    const int64_t row0 = static_cast<int64_t>(t) * p.heads;
    const int64_t plane = p.splits > 1 ? blockIdx.y * rows : 0;  // this split's partials
    for (int h = lane; h < p.heads; h += 32) {
      p.stats[(plane + row0 + h) * 2] = -INFINITY;
      p.stats[(plane + row0 + h) * 2 + 1] = 0.0f;
    }
    if (p.splits == 1) {
      for (int64_t i = lane; i < static_cast<int64_t>(p.heads) * p.v_dim; i += 32)
        p.out[row0 * p.v_dim + i] = 0.0f;
    }
  }
}
}  // namespace hlm::cuda
