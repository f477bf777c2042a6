// The sections a decode step is split into for `bench --layer-split` and `plan --layer-times`: the
// embedding, each layer's attention (KDA or MLA) and FFN (dense or MoE), and the head (final norm,
// lm_head). The model marks them (Ops::section), memory_plan counts the bytes each must move, and the
// two commands match them by these names.
#pragma once

#include <array>

#include "config/model_config.h"

namespace hlm {

enum class StepSection { kEmbedding, kKdaAttention, kMlaAttention, kDenseFfn, kMoeFfn, kHead };
constexpr int kNumStepSections = 6;

constexpr std::array<const char*, kNumStepSections> kStepSectionNames = {
    "embedding", "kda_attention", "mla_attention", "dense_ffn", "moe_ffn", "head"};

constexpr const char* step_section_name(StepSection s) { return kStepSectionNames[static_cast<int>(s)]; }

// Sections of each kind in one step of `cfg` (one embedding, one head).
inline std::array<int, kNumStepSections> step_section_counts(const ModelConfig& cfg) {
  const int moe = cfg.num_moe_layers();
  return {1, cfg.num_kda_layers(), cfg.num_mla_layers(), static_cast<int>(cfg.num_layers) - moe, moe, 1};
}

}  // namespace hlm
