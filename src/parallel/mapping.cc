#include "parallel/mapping.h"

#include <fmt/format.h>

#include <limits>

#include "base/error.h"

namespace hlm {

Range even_shard(int64_t total, int parts, int index) {
  HLM_CHECK(parts > 0 && index >= 0 && index < parts, "shard {} of {} is out of range", index, parts);
  HLM_CHECK(total % parts == 0, "{} items do not split evenly over {} ranks", total, parts);
  int64_t size = total / parts;
  return {index * size, (index + 1) * size};
}

Mapping Mapping::make(int tp, int cp, int rank, int moe_ep, int moe_tp) {
  HLM_CHECK(tp >= 1 && cp >= 1, "--tp and --cp must be at least 1 (got tp={}, cp={})", tp, cp);
  HLM_CHECK(int64_t{tp} * cp <= std::numeric_limits<int>::max(), "--tp {} x --cp {} overflows the rank count",
            tp, cp);
  HLM_CHECK(rank >= 0 && rank < tp * cp, "rank {} outside the group of tp*cp = {} ranks", rank, tp * cp);
  Mapping m;
  m.tp = tp;
  m.cp = cp;
  m.rank = rank;
  if (moe_ep == 0 && moe_tp == 0) {
    m.moe_ep = tp * cp;
    m.moe_tp = 1;
  } else {
    m.moe_ep = moe_ep == 0 ? tp * cp / moe_tp : moe_ep;
    m.moe_tp = moe_tp == 0 ? tp * cp / moe_ep : moe_tp;
  }
  return m;
}

Range Mapping::mla_tp_heads(int64_t heads) const { return even_shard(heads, tp, tp_rank()); }

Range Mapping::mla_chunk_heads(int64_t heads) const { return even_shard(heads, world(), repurposed_rank()); }

Range Mapping::kda_heads(int64_t heads) const { return even_shard(heads, world(), repurposed_rank()); }

Range Mapping::mlp_rows(int64_t intermediate) const {
  return even_shard(intermediate, world(), repurposed_rank());
}

Range Mapping::experts(int64_t num_experts) const { return even_shard(num_experts, moe_ep, moe_ep_rank()); }

Range Mapping::expert_rows(int64_t intermediate) const {
  return even_shard(intermediate, moe_tp, moe_tp_rank());
}

Range Mapping::vocab_rows(int64_t vocab) const { return even_shard(vocab, world(), repurposed_rank()); }

std::string Mapping::describe() const {
  return fmt::format("tp={} cp={} rank={} (tp_rank={} cp_rank={}) moe_ep={} moe_tp={}", tp, cp, rank,
                     tp_rank(), cp_rank(), moe_ep, moe_tp);
}

}  // namespace hlm
