// Placement of MLA KV pages across the cp ranks (docs/HELIX.md §5): page b of a sequence holds global
// tokens [b·P, (b+1)·P) and lives on CP rank b % cp as that rank's local page b / cp. These closed forms
// are the only implementation of the rule; the cache, the attention metadata, warmup and the tests all
// call them (HELIX.md §15.3: peers kept three drifting copies).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace hlm {

// Bounds on what a Placement is asked to hold. The attention metadata carries page ids and per-query key
// counts as int32, so a sequence and a rank's page pool stay within int32; a page larger than 65,536
// tokens has no use (pages are the unit of CP striping; 64 is the default) and bounding it keeps every
// product of pages, page size and cache width far from int64 overflow.
constexpr int64_t kMaxTokensPerBlock = int64_t{1} << 16;
constexpr int64_t kMaxSeqLen = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxPagesPerRank = std::numeric_limits<int32_t>::max();

struct Placement {
  int64_t tokens_per_block = 64;  // P
  int cp = 1;

  // CP rank owning global position `pos`.
  int owner(int64_t pos) const;
  // How many of the global positions [0, global_len) live on CP rank r.
  int64_t local_len(int64_t global_len, int r) const;
  // Local index of global position `pos` on its owner (= local_len(pos, owner(pos))).
  int64_t local_slot(int64_t pos) const;
  // Inverse of local_slot: the global position of local index i on CP rank r.
  int64_t global_pos(int r, int64_t i) const;
  // local_len for every CP rank.
  std::vector<int64_t> local_lens(int64_t global_len) const;
  // Whether CP rank r receives the token at global position `pos` (exactly one rank does).
  bool is_active(int64_t pos, int r) const { return owner(pos) == r; }
  // Local pages rank r needs to hold global_len tokens.
  int64_t local_pages(int64_t global_len, int r) const;
};

}  // namespace hlm
