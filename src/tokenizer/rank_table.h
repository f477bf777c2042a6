// RankTable: the BPE vocabulary, token bytes -> rank. An open-addressing hash table whose slots hold the
// first 8 bytes of their key, so most probes of the merge loop touch one cache line and no key memory;
// longer keys are compared against the rank's bytes. Ranks are the token ids and may be sparse.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hlm {

class RankTable {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  void reserve(size_t tokens);
  // Adds a token (non-empty bytes, a rank not yet used); returns the rank `bytes` already has, or kNone
  // when it was new and has been added.
  uint32_t add(std::string_view bytes, uint32_t rank);
  bool has_rank(uint32_t rank) const { return rank < offsets_.size() && offsets_[rank].len != 0; }

  // The rank of `bytes` (non-empty), or kNone.
  uint32_t find(std::string_view bytes) const {
    if (bytes.size() <= 2) return short_rank_[short_index(bytes)];
    const uint64_t prefix = load_prefix(bytes);
    const uint32_t len = static_cast<uint32_t>(bytes.size());
    for (size_t i = hash(prefix, bytes) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.len == 0) return kNone;
      if (s.len == len && s.prefix == prefix && (len <= 8 || tail_equal(s.rank, bytes))) return s.rank;
    }
  }

  size_t size() const { return count_; }
  // The bytes of a rank, or an empty view when the rank is not in the table.
  std::string_view bytes_of(uint32_t rank) const {
    if (rank >= offsets_.size() || offsets_[rank].len == 0) return {};
    return std::string_view(arena_).substr(offsets_[rank].offset, offsets_[rank].len);
  }
  uint32_t max_rank() const { return offsets_.empty() ? 0 : static_cast<uint32_t>(offsets_.size() - 1); }

 private:
  struct Slot {
    uint64_t prefix = 0;
    uint32_t rank = 0;
    uint32_t len = 0;  // 0: empty slot (tokens are never empty)
  };
  struct Span {
    uint32_t offset = 0;
    uint32_t len = 0;
  };

  // Tokens of one or two bytes live in a direct table (the merge loop's first pass asks for every
  // adjacent byte pair): index 0..255 for one byte, 256 + (b0 << 8 | b1) for two.
  static size_t short_index(std::string_view b) {
    const auto b0 = static_cast<unsigned char>(b[0]);
    return b.size() == 1 ? b0 : 256 + ((size_t(b0) << 8) | static_cast<unsigned char>(b[1]));
  }
  static uint64_t load_prefix(std::string_view b) {
    uint64_t v = 0;
    const size_t n = b.size() < 8 ? b.size() : 8;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(static_cast<unsigned char>(b[i])) << (8 * i);
    return v;
  }
  static uint64_t hash(uint64_t prefix, std::string_view b);
  bool tail_equal(uint32_t rank, std::string_view b) const;
  void insert_slot(uint64_t prefix, std::string_view bytes, uint32_t rank);
  void grow(size_t capacity);

  std::string arena_;          // every token's bytes, back to back
  std::vector<Span> offsets_;  // rank -> its bytes in arena_
  std::vector<Slot> slots_;
  std::vector<uint32_t> short_rank_ = std::vector<uint32_t>(256 + 65536, kNone);
  size_t mask_ = 0;  // slots_.size() - 1; slots_ is never more than half full
  size_t count_ = 0;
};

// Encodes one pre-tokenized piece (>= 1 byte) by BPE: start from single bytes and repeatedly merge the
// adjacent pair whose concatenation has the lowest rank (leftmost on ties) until no adjacent pair is a
// token, as tiktoken's byte_pair_encode does. Appends the ranks to `out`. Every single byte must be in
// the table (Tokenizer::load checks this).
void byte_pair_encode(std::string_view piece, const RankTable& ranks, std::vector<int32_t>& out);

}  // namespace hlm
