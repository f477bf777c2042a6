// Mapping: the rank layout of one generation group of N = tp·cp ranks (docs/HELIX.md §1), and the single
// place every shard index derives from. cp ranks are consecutive (rank = tp_rank·cp + cp_rank) and the
// repurposed rank r' = tp_rank·cp + cp_rank serves KDA heads, MLA head chunks (the all-to-all
// destination, W_UV, gate and o_proj shards), dense/shared MLP shards and expert slices. Keeping all of
// them here is what prevents the head-chunk/shard mismatch peers shipped (HELIX.md §15.1).
#pragma once

#include <cstdint>
#include <string>

namespace hlm {

// A contiguous range [begin, end) of items (heads, rows, experts) held by one rank.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// Part `index` of `total` items split evenly into `parts`; `total` must be divisible by `parts`.
Range even_shard(int64_t total, int parts, int index);

struct Mapping {
  int tp = 1;
  int cp = 1;
  int rank = 0;
  int moe_ep = 1;  // expert-parallel width of the MoE (moe_ep · moe_tp = N)
  int moe_tp = 1;  // tensor-parallel width inside each expert

  // tp, cp >= 1 and 0 <= rank < tp·cp; moe_ep/moe_tp default to EP over all N ranks when both are 0.
  static Mapping make(int tp, int cp, int rank, int moe_ep = 0, int moe_tp = 0);

  int world() const { return tp * cp; }
  int tp_rank() const { return rank / cp; }
  int cp_rank() const { return rank % cp; }
  // The repurposed rank r' of HELIX.md §1. It equals the global rank; it is named so every shard index
  // visibly comes from it.
  int repurposed_rank() const { return tp_rank() * cp + cp_rank(); }
  // Global rank of the member `cp_index` of this rank's CP group.
  int cp_peer(int cp_index) const { return tp_rank() * cp + cp_index; }
  int moe_ep_rank() const { return repurposed_rank() / moe_tp; }
  int moe_tp_rank() const { return repurposed_rank() % moe_tp; }

  // Heads whose queries this rank projects (MLA q / W_UK): the tp-local heads.
  Range mla_tp_heads(int64_t heads) const;
  // The MLA head chunk this rank owns after the all-to-all: chunk r' of H / N heads.
  Range mla_chunk_heads(int64_t heads) const;
  // KDA heads of this rank: slice r' of Hk / N.
  Range kda_heads(int64_t heads) const;
  // Rows of a dense or shared-expert MLP intermediate held by this rank (TP over N by r').
  Range mlp_rows(int64_t intermediate) const;
  // Routed experts held by this rank (whole, contiguous experts).
  Range experts(int64_t num_experts) const;
  // Intermediate rows of each held expert (all of them unless moe_tp > 1).
  Range expert_rows(int64_t intermediate) const;
  // Vocabulary rows of lm_head held by this rank (vocab-parallel over N).
  Range vocab_rows(int64_t vocab) const;

  std::string describe() const;  // "tp=2 cp=4 rank=5 (tp_rank=1 cp_rank=1)"
};

}  // namespace hlm
