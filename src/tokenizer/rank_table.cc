// RankTable storage and BPE merging (see rank_table.h).
#include "tokenizer/rank_table.h"

#include <cstring>
#include <queue>

namespace hlm {

namespace {

constexpr size_t kMinSlots = 1024;

uint64_t mix(uint64_t h) {
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ULL;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t RankTable::hash(uint64_t prefix, std::string_view b) {
  uint64_t h = (prefix ^ (uint64_t(b.size()) << 59)) * 0x9E3779B97F4A7C15ULL;
  for (size_t i = 8; i < b.size(); i += 8) {
    uint64_t block = 0;
    std::memcpy(&block, b.data() + i, b.size() - i < 8 ? b.size() - i : 8);
    h = (h ^ block) * 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  }
  return mix(h);
}

bool RankTable::tail_equal(uint32_t rank, std::string_view b) const {
  const Span& s = offsets_[rank];
  return std::memcmp(arena_.data() + s.offset + 8, b.data() + 8, b.size() - 8) == 0;
}

void RankTable::reserve(size_t tokens) {
  arena_.reserve(tokens * 8);
  if (tokens * 2 > slots_.size()) grow(tokens * 2);
}

void RankTable::grow(size_t capacity) {
  size_t n = kMinSlots;
  while (n < capacity) n *= 2;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(n, Slot{});
  mask_ = n - 1;
  for (const Slot& s : old) {
    if (s.len == 0) continue;
    const Span& span = offsets_[s.rank];
    const std::string_view bytes(arena_.data() + span.offset, span.len);
    for (size_t i = hash(s.prefix, bytes) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].len == 0) {
        slots_[i] = s;
        break;
      }
    }
  }
}

void RankTable::insert_slot(uint64_t prefix, std::string_view bytes, uint32_t rank) {
  for (size_t i = hash(prefix, bytes) & mask_;; i = (i + 1) & mask_) {
    if (slots_[i].len == 0) {
      slots_[i] = Slot{prefix, rank, static_cast<uint32_t>(bytes.size())};
      return;
    }
  }
}

uint32_t RankTable::add(std::string_view bytes, uint32_t rank) {
  if ((count_ + 1) * 2 > slots_.size()) grow((count_ + 1) * 4);
  const uint32_t existing = find(bytes);
  if (existing != kNone) return existing;
  if (rank >= offsets_.size()) offsets_.resize(size_t(rank) + 1);
  offsets_[rank] = Span{static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(bytes.size())};
  arena_.append(bytes);
  if (bytes.size() <= 2) {
    short_rank_[short_index(bytes)] = rank;
  } else {
    insert_slot(load_prefix(bytes), bytes, rank);
  }
  ++count_;
  return kNone;
}

namespace {

// tiktoken's merge loop for short pieces: `parts[i]` is a boundary and the rank of the pair that starts
// there; each step merges the lowest-ranked pair (first on ties) and re-ranks its two neighbours. O(n^2)
// but cache-friendly for the short pieces that dominate text.
void merge_short(std::string_view piece, const RankTable& ranks, std::vector<int32_t>& out) {
  struct Part {
    uint32_t start;
    uint32_t rank;
  };
  constexpr uint32_t kNone = RankTable::kNone;
  Part parts_buf[130];
  const size_t n = piece.size();
  Part* parts = parts_buf;
  size_t len = n + 1;
  for (size_t i = 0; i + 1 < n; ++i) parts[i] = {uint32_t(i), ranks.find(piece.substr(i, 2))};
  parts[n - 1] = {uint32_t(n - 1), kNone};
  parts[n] = {uint32_t(n), kNone};
  // Rank of the bytes from parts[i] to parts[i + 3], i.e. parts[i] merged with parts[i + 1] once
  // parts[i + 1]'s left boundary is removed.
  auto rank_after_merge = [&](size_t i) {
    if (i + 3 >= len) return kNone;
    return ranks.find(piece.substr(parts[i].start, parts[i + 3].start - parts[i].start));
  };
  for (;;) {
    uint32_t best = kNone;
    size_t at = 0;
    for (size_t i = 0; i + 1 < len; ++i) {
      if (parts[i].rank < best) {
        best = parts[i].rank;
        at = i;
      }
    }
    if (best == kNone) break;
    if (at > 0) parts[at - 1].rank = rank_after_merge(at - 1);
    parts[at].rank = rank_after_merge(at);
    std::memmove(parts + at + 1, parts + at + 2, (len - at - 2) * sizeof(Part));
    --len;
  }
  for (size_t i = 0; i + 1 < len; ++i) {
    out.push_back(
        static_cast<int32_t>(ranks.find(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start))));
  }
}

// The same merges in O(n log n) for long pieces (a run of 25,000 letters is one piece): a heap of
// candidate pairs ordered by (rank, start), with stale entries skipped. Popping the smallest
// (rank, start) is exactly the linear scan's "lowest rank, leftmost on ties".
void merge_long(std::string_view piece, const RankTable& ranks, std::vector<int32_t>& out) {
  constexpr uint32_t kNone = RankTable::kNone;
  const size_t n = piece.size();
  // Token starting at i (when alive) spans [i, end[i]); prev[i] is the start of the token before it.
  std::vector<uint32_t> end(n), prev(n), pair_rank(n, kNone), token_rank(n, kNone);
  using Candidate = std::pair<uint32_t, uint32_t>;  // (rank, start)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  for (size_t i = 0; i < n; ++i) {
    end[i] = uint32_t(i + 1);
    prev[i] = i == 0 ? kNone : uint32_t(i - 1);
  }
  auto propose = [&](uint32_t start) {
    const uint32_t right = end[start];
    pair_rank[start] = kNone;
    if (right >= n) return;
    const uint32_t r = ranks.find(piece.substr(start, end[right] - start));
    if (r != kNone) {
      pair_rank[start] = r;
      heap.push({r, start});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) propose(uint32_t(i));
  while (!heap.empty()) {
    const auto [rank, left] = heap.top();
    heap.pop();
    if (pair_rank[left] != rank) continue;  // superseded by a later merge
    const uint32_t right = end[left];
    end[left] = end[right];
    token_rank[left] = rank;
    pair_rank[right] = kNone;
    if (end[left] < n) prev[end[left]] = left;
    propose(left);
    if (prev[left] != kNone) propose(prev[left]);
  }
  for (uint32_t i = 0; i < n; i = end[i]) {
    out.push_back(static_cast<int32_t>(token_rank[i] != kNone ? token_rank[i]
                                                              : ranks.find(piece.substr(i, end[i] - i))));
  }
}

}  // namespace

void byte_pair_encode(std::string_view piece, const RankTable& ranks, std::vector<int32_t>& out) {
  if (piece.size() == 1) {
    out.push_back(static_cast<int32_t>(ranks.find(piece)));
  } else if (piece.size() < 128) {
    merge_short(piece, ranks, out);
  } else {
    merge_long(piece, ranks, out);
  }
}

}  // namespace hlm
