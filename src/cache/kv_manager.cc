#include "cache/kv_manager.h"

#include "base/error.h"

namespace hlm {

KvManager::KvManager(const Placement& placement, int cp_rank, int64_t num_pages, int32_t num_slots)
    : placement_(placement),
      cp_rank_(cp_rank),
      num_pages_(num_pages),
      free_pages_(num_pages),
      free_slots_(num_slots) {
  HLM_CHECK(placement.tokens_per_block > 0, "tokens_per_block must be positive (got {})",
            placement.tokens_per_block);
}

int32_t KvManager::add(int64_t seq_id) {
  HLM_CHECK(!has(seq_id), "sequence {} already exists", seq_id);
  HLM_CHECK(free_slots_.free() > 0,
            "no free KDA state slot for sequence {} (all {} in use); raise --max-batch", seq_id,
            seqs_.size());
  Sequence s;
  s.slot = free_slots_.take();
  seqs_.emplace(seq_id, std::move(s));
  return seqs_.at(seq_id).slot;
}

void KvManager::release(int64_t seq_id) {
  Sequence& s = get(seq_id);
  // Reversed, so the sequence's first page is the next one handed out.
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) free_pages_.give(*it);
  free_slots_.give(s.slot);
  seqs_.erase(seq_id);
}

KvManager::Sequence& KvManager::get(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  HLM_CHECK(it != seqs_.end(), "unknown sequence {}", seq_id);
  return it->second;
}

const KvManager::Sequence& KvManager::get(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  HLM_CHECK(it != seqs_.end(), "unknown sequence {}", seq_id);
  return it->second;
}

int32_t KvManager::slot(int64_t seq_id) const { return get(seq_id).slot; }
int64_t KvManager::global_len(int64_t seq_id) const { return get(seq_id).global_len; }
const std::vector<int32_t>& KvManager::pages(int64_t seq_id) const { return get(seq_id).pages; }

void KvManager::reserve(int64_t seq_id, int64_t n) {
  Sequence& s = get(seq_id);
  const int64_t end = s.global_len + n;
  const int64_t need = placement_.local_pages(end, cp_rank_);
  const int64_t missing = need - static_cast<int64_t>(s.pages.size());
  HLM_CHECK(missing <= free_pages(),
            "KV cache full on CP rank {}: sequence {} needs {} more pages of {} tokens, {} of {} are free; "
            "raise --max-seq-len or --max-batch, or shorten the request",
            cp_rank_, seq_id, missing, placement_.tokens_per_block, free_pages(), num_pages_);
  for (int64_t i = 0; i < missing; ++i) s.pages.push_back(free_pages_.take());
  s.reserved_len = std::max(s.reserved_len, end);
}

int64_t KvManager::cache_index(int64_t seq_id, int64_t pos) const {
  const Sequence& s = get(seq_id);
  HLM_CHECK(pos >= 0 && pos < s.reserved_len, "position {} of sequence {} is not reserved", pos, seq_id);
  if (placement_.owner(pos) != cp_rank_) return -1;
  const int64_t local = placement_.local_slot(pos);
  const int64_t p = placement_.tokens_per_block;
  return static_cast<int64_t>(s.pages[local / p]) * p + local % p;
}

void KvManager::commit(int64_t seq_id, int64_t n) {
  Sequence& s = get(seq_id);
  HLM_CHECK(s.global_len + n <= s.reserved_len, "commit of {} tokens beyond the reservation of sequence {}",
            n, seq_id);
  s.global_len += n;
}

}  // namespace hlm
