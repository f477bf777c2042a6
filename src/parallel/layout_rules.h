// The validation rules of a Helix layout (docs/HELIX.md §9), checked before any weight is read. Each
// violation names the rule and the numbers that break it; the error also lists the layouts of the same
// size that would work, so a user can fix the command line without reading the docs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/model_config.h"

namespace hlm {

struct LayoutRequest {
  int tp = 1;
  int cp = 1;
  int moe_ep = 0;  // 0: derived (EP over all tp·cp ranks unless moe_tp is set)
  int moe_tp = 0;  // 0: derived
  int64_t tokens_per_block = 64;
};

// Every rule `req` breaks for `cfg`; empty when the layout is valid.
std::vector<std::string> layout_violations(const ModelConfig& cfg, const LayoutRequest& req);

// All (tp, cp) with tp·cp = world that satisfy the rules (default MoE split).
std::vector<std::pair<int, int>> valid_layouts(const ModelConfig& cfg, int world, int64_t tokens_per_block);

// The rules depend on tp·cp (and the MoE split), not on how it factors, so what a user needs after a
// refusal is the list of group sizes that work: "1, 2, 4, 8 ranks (any --tp x --cp with that product)".
std::string describe_valid_sizes(const ModelConfig& cfg, int64_t tokens_per_block, int max_world = 64);

// Throws one hlm::Error listing every violation and the group sizes that work.
void check_layout(const ModelConfig& cfg, const LayoutRequest& req);

}  // namespace hlm
