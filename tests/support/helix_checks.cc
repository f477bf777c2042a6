#include "helix_checks.h"

#include <gtest/gtest.h>

#include "model/memory_plan.h"

namespace hlm::test {

void expect_each_rank_holds_its_pages(Engine& engine, Comm& host, const Mapping& mapping,
                                      const std::vector<int32_t>& ids) {
  if (host.rank() == 0) {
    // Leave the sequence cached: prefill in two chunks, then a few decode steps.
    StepPlan plan;
    plan.entries.push_back(StepEntry{5, true, false, std::vector<int32_t>(ids.begin(), ids.begin() + 100)});
    engine.step(plan);
    plan.entries[0] = StepEntry{5, false, false, std::vector<int32_t>(ids.begin() + 100, ids.begin() + 150)};
    engine.step(plan);
    for (int64_t j = 150; j < 155; ++j) {
      plan.entries[0] = StepEntry{5, false, false, {ids[j]}};
      engine.step(plan);
    }
    engine.stop();
  } else {
    engine.serve();
  }
  const KvManager& kv = engine.kv();
  const int64_t g = kv.global_len(5);
  EXPECT_EQ(g, 155);
  const Placement& pl = kv.placement();
  EXPECT_EQ(static_cast<int64_t>(kv.pages(5).size()), pl.local_pages(g, mapping.cp_rank()));
  // Gather (local tokens) over the CP group: the CP group of each tp rank holds every token exactly once.
  Tensor local = Tensor::filled({1}, static_cast<float>(pl.local_len(g, mapping.cp_rank())));
  Tensor all = host.all_gather(local, CommGroup::kCp);
  float sum = 0;
  for (int r = 0; r < mapping.cp; ++r) sum += all.data<float>()[r];
  EXPECT_EQ(sum, static_cast<float>(g));
}

void expect_weight_bytes_equal_plan(Runner& runner, const std::string& model_dir, const Mapping& mapping) {
  const Checkpoint ckpt(model_dir);
  const StoredDType stored = [&](const WeightSpec& s) {
    return ckpt.has(s.name) ? ckpt.info(s.name).dtype : ckpt.info(s.alt_names.at(0)).dtype;
  };
  const RankWeightBytes plan = rank_weight_bytes(weight_layout(runner.config()), mapping, stored);
  EXPECT_EQ(static_cast<int64_t>(runner.model().weight_bytes_read()), plan.total) << "rank " << mapping.rank;
  const auto conv = static_cast<int64_t>(dtype_size(runner.ops().weight_dtype(DType::kBF16)));
  const StateBytes state = state_bytes(runner.config(), mapping, conv, conv);
  EXPECT_EQ(runner.model().kda_state_bytes_per_slot(), state.kda_recurrent + state.kda_conv);
}

}  // namespace hlm::test
