// StepPlan: what one engine step does, decided by rank 0 and broadcast to every rank (docs/DESIGN.md
// "Process model"). Each rank derives its own view (owned pages, local lengths, active flag) from the plan
// with the shared placement functions, so no rank keeps counters that could drift.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hlm {

struct StepEntry {
  int64_t seq_id = 0;
  bool is_new = false;      // the sequence starts with this step (gets a fresh state slot)
  bool all_logits = false;  // return logits for every token of the entry, not only the last
  std::vector<int32_t> tokens;
};

// A sequence that starts already `length` tokens long without running them (benchmarks of long contexts):
// it gets a state slot and the pages of `length` tokens, whose contents are whatever the caches hold.
struct SyntheticSeq {
  int64_t seq_id = 0;
  int64_t length = 0;
};

struct StepPlan {
  std::vector<SyntheticSeq> synthetic;  // registered before the entries run
  std::vector<StepEntry> entries;
  std::vector<int64_t> release;  // sequences to free after the step
  bool stop = false;             // ends the serving loop of the other ranks

  std::string serialize() const;
  static StepPlan deserialize(const std::string& bytes);
};

}  // namespace hlm
