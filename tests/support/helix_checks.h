// Per-rank Helix checks shared by the parity tests on CPU ranks (tests/parallel) and on GPUs (tests/gpu).
// Every rank calls them at the same point: they run engine steps and gather over the host Comm.
#pragma once

#include <string>
#include <vector>

#include "fixtures.h"

namespace hlm::test {

// Rank 0 prefills `ids` (at least 155 tokens) as sequence 5 in two chunks and decodes five more tokens,
// the other ranks serve the steps; then each rank must hold exactly the pages Placement gives it, and the
// CP group every token once (gathered over `host`, a Comm for host tensors).
void expect_each_rank_holds_its_pages(Engine& engine, Comm& host, const Mapping& mapping,
                                      const std::vector<int32_t>& ids);

// This rank read exactly the checkpoint bytes the shard plan gives it, and sized its KDA state per slot by
// its own heads (conv state in the backend's activation dtype).
void expect_weight_bytes_equal_plan(Runner& runner, const std::string& model_dir, const Mapping& mapping);

}  // namespace hlm::test
