#include "parallel/placement.h"

#include <algorithm>

#include "base/error.h"

namespace hlm {

int Placement::owner(int64_t pos) const { return static_cast<int>((pos / tokens_per_block) % cp); }

int64_t Placement::local_len(int64_t global_len, int r) const {
  int64_t stripe = tokens_per_block * cp;
  int64_t full = global_len / stripe;
  int64_t rem = global_len % stripe;
  return full * tokens_per_block + std::clamp<int64_t>(rem - r * tokens_per_block, 0, tokens_per_block);
}

int64_t Placement::local_slot(int64_t pos) const {
  return (pos / (tokens_per_block * cp)) * tokens_per_block + pos % tokens_per_block;
}

int64_t Placement::global_pos(int r, int64_t i) const {
  return (i / tokens_per_block) * tokens_per_block * cp + r * tokens_per_block + i % tokens_per_block;
}

std::vector<int64_t> Placement::local_lens(int64_t global_len) const {
  std::vector<int64_t> lens(cp);
  for (int r = 0; r < cp; ++r) lens[r] = local_len(global_len, r);
  return lens;
}

int64_t Placement::local_pages(int64_t global_len, int r) const {
  const int64_t len = local_len(global_len, r);
  return len / tokens_per_block + (len % tokens_per_block != 0 ? 1 : 0);  // no len + P - 1 to overflow
}

}  // namespace hlm
