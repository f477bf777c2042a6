// KvManager: per-sequence bookkeeping of the caches on one rank. It owns the single authoritative global
// length G of each sequence (docs/HELIX.md §5: positions, owners, slots and masks all derive from it and
// it advances only when tokens are committed), the sequence's KDA state slot, and the list of MLA pages
// this rank holds for it (page b of the sequence is here iff placement.owner says so). Running out of
// pages or slots is an orderly error, never corruption.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "cache/id_pool.h"
#include "parallel/placement.h"

namespace hlm {

class KvManager {
 public:
  KvManager(const Placement& placement, int cp_rank, int64_t num_pages, int32_t num_slots);

  // Registers a new sequence with G = 0 and gives it a free state slot.
  int32_t add(int64_t seq_id);
  void release(int64_t seq_id);
  bool has(int64_t seq_id) const { return seqs_.count(seq_id) != 0; }

  int32_t slot(int64_t seq_id) const;
  int64_t global_len(int64_t seq_id) const;
  // This rank's pages of the sequence, in local order.
  const std::vector<int32_t>& pages(int64_t seq_id) const;

  // Allocates the local pages that positions [G, G + n) need on this rank.
  void reserve(int64_t seq_id, int64_t n);
  // Flat cache index (page·P + offset) of global position `pos` on this rank, or -1 when another CP
  // rank owns it. The position must be reserved.
  int64_t cache_index(int64_t seq_id, int64_t pos) const;
  // Advances G by n once the step that wrote those tokens has run.
  void commit(int64_t seq_id, int64_t n);

  const Placement& placement() const { return placement_; }
  int cp_rank() const { return cp_rank_; }
  int64_t free_pages() const { return free_pages_.free(); }
  int32_t free_slots() const { return static_cast<int32_t>(free_slots_.free()); }

 private:
  struct Sequence {
    int32_t slot = 0;
    int64_t global_len = 0;
    int64_t reserved_len = 0;
    std::vector<int32_t> pages;
  };
  Sequence& get(int64_t seq_id);
  const Sequence& get(int64_t seq_id) const;

  Placement placement_;
  int cp_rank_;
  int64_t num_pages_;
  IdPool free_pages_;
  IdPool free_slots_;
  std::map<int64_t, Sequence> seqs_;
};

}  // namespace hlm
