#include "parallel/layout_rules.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>

#include "base/error.h"
#include "parallel/placement.h"

namespace hlm {

namespace {

void require_divides(std::vector<std::string>& out, int64_t total, int64_t parts, const char* what,
                     const char* split) {
  if (total % parts != 0) {
    out.push_back(fmt::format("{} ({}) must be divisible by {} ({}): {}", what, total, split, parts,
                              "each rank holds an equal, whole share"));
  }
}

}  // namespace

std::vector<std::string> layout_violations(const ModelConfig& cfg, const LayoutRequest& req) {
  std::vector<std::string> out;
  if (req.tp < 1 || req.cp < 1) {
    out.push_back(fmt::format("--tp and --cp must be at least 1 (got tp={}, cp={})", req.tp, req.cp));
    return out;
  }
  if (req.tokens_per_block <= 0 || req.tokens_per_block > kMaxTokensPerBlock) {
    out.push_back(fmt::format("--tokens-per-block must be in [1, {}] (got {})", kMaxTokensPerBlock,
                              req.tokens_per_block));
  }
  // MPI numbers ranks with an int; a product beyond that is no launch at all (and would wrap below).
  const int64_t world = int64_t{req.tp} * req.cp;
  if (world > std::numeric_limits<int>::max()) {
    out.push_back(fmt::format("--tp {} x --cp {} = {} ranks is more than an MPI launch can have", req.tp,
                              req.cp, world));
    return out;
  }
  const int n = static_cast<int>(world);
  if (cfg.num_kda_layers() > 0) {
    require_divides(out, cfg.kda_heads, n, "the KDA head count", "tp*cp");
  }
  if (cfg.num_mla_layers() > 0) {
    // Head chunks must tile the all-to-all and the o_proj rows exactly (no zero-head padding).
    require_divides(out, cfg.mla_heads, n, "the MLA head count", "tp*cp");
  }
  if (cfg.num_layers > cfg.num_moe_layers()) {
    require_divides(out, cfg.intermediate_size, n, "the dense MLP intermediate size", "tp*cp");
  }
  require_divides(out, cfg.vocab_size, n, "the vocabulary (lm_head is vocab-parallel)", "tp*cp");
  if (cfg.num_moe_layers() > 0) {
    int ep = req.moe_ep, mtp = req.moe_tp;
    if (ep == 0 && mtp == 0) {
      ep = n;
      mtp = 1;
    } else if (ep == 0 || mtp == 0) {
      const int given = ep == 0 ? mtp : ep;
      if (given < 1 || n % given != 0) {
        out.push_back(fmt::format("--moe-{} {} must divide tp*cp ({})", ep == 0 ? "tp" : "ep", given, n));
        return out;
      }
      (ep == 0 ? ep : mtp) = n / given;
    }
    if (ep < 1 || mtp < 1 || int64_t{ep} * mtp != n) {
      out.push_back(fmt::format(
          "--moe-ep ({}) x --moe-tp ({}) must equal tp*cp ({}): the MoE runs on all ranks", ep, mtp, n));
    } else {
      require_divides(out, cfg.num_experts, ep, "the routed expert count", "--moe-ep");
      require_divides(out, cfg.moe_intermediate_size, mtp, "the expert intermediate size", "--moe-tp");
      if (cfg.mxfp4_experts && mtp > 1 && (cfg.moe_intermediate_size / mtp) % 32 != 0) {
        out.push_back(
            fmt::format("with MXFP4 experts each --moe-tp shard of the intermediate size ({} / {}) must hold "
                        "whole groups of "
                        "32 columns",
                        cfg.moe_intermediate_size, mtp));
      }
    }
    if (cfg.num_shared_experts > 0) {
      require_divides(out, cfg.shared_intermediate_size(), n, "the shared-expert intermediate size", "tp*cp");
    }
  }
  return out;
}

std::vector<std::pair<int, int>> valid_layouts(const ModelConfig& cfg, int world, int64_t tokens_per_block) {
  std::vector<std::pair<int, int>> out;
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp != 0) continue;
    const LayoutRequest r{tp, world / tp, 0, 0, tokens_per_block};
    if (layout_violations(cfg, r).empty()) out.emplace_back(tp, world / tp);
  }
  return out;
}

std::string describe_valid_sizes(const ModelConfig& cfg, int64_t tokens_per_block, int max_world) {
  std::vector<int> sizes;
  for (int n = 1; n <= max_world; ++n) {
    if (!valid_layouts(cfg, n, tokens_per_block).empty()) sizes.push_back(n);
  }
  if (sizes.empty()) return "no layout of up to " + std::to_string(max_world) + " ranks works for this model";
  return fmt::format(
      "layouts that work: tp*cp = {} ranks (any --tp x --cp with that product, e.g. --tp 1 --cp {})",
      fmt::join(sizes, ", "), sizes.back());
}

void check_layout(const ModelConfig& cfg, const LayoutRequest& req) {
  const std::vector<std::string> v = layout_violations(cfg, req);
  if (v.empty()) return;
  std::string msg = fmt::format("layout tp={} cp={} is not valid for {}:", req.tp, req.cp, cfg.source);
  for (const std::string& s : v) msg += "\n  - " + s;
  msg += "\n" + describe_valid_sizes(cfg, std::max<int64_t>(1, req.tokens_per_block));
  HLM_FAIL("{}", msg);
}

}  // namespace hlm
