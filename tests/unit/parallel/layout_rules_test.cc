// Layout validation (docs/HELIX.md §9): every rule produces its own message, and the error lists the
// layouts of the same size that work.
#include "parallel/layout_rules.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "parallel/mapping.h"

namespace hlm {
namespace {

// Kimi-Linear-48B-A3B's dimensions, built directly so the test needs no file.
ModelConfig kimi_48b() {
  ModelConfig c;
  c.source = "48b/config.json";
  c.vocab_size = 163840;
  c.hidden_size = 2304;
  c.num_layers = 27;
  for (int i = 0; i < 27; ++i) {
    c.attn.push_back(i % 4 == 3 || i == 26 ? AttnKind::kMla : AttnKind::kKda);
    c.ffn.push_back(i == 0 ? FfnKind::kDense : FfnKind::kMoe);
  }
  c.kda_heads = 32;
  c.kda_head_dim = 128;
  c.kda_conv_kernel = 4;
  c.mla_heads = 32;
  c.intermediate_size = 9216;
  c.num_experts = 256;
  c.moe_intermediate_size = 1024;
  c.num_shared_experts = 1;
  return c;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x + "\n";
  return s;
}

TEST(LayoutRules, ValidWidthsOf48BAreDivisorsOf32) {
  const ModelConfig c = kimi_48b();
  for (int n : {1, 2, 4, 8, 16, 32}) {
    EXPECT_FALSE(valid_layouts(c, n, 64).empty()) << n;
    EXPECT_TRUE(layout_violations(c, LayoutRequest{1, n, 0, 0, 64}).empty()) << n;
  }
  EXPECT_TRUE(valid_layouts(c, 64, 64).empty());
  EXPECT_TRUE(valid_layouts(c, 3, 64).empty());
  EXPECT_EQ(valid_layouts(c, 4, 64), (std::vector<std::pair<int, int>>{{1, 4}, {2, 2}, {4, 1}}));
}

TEST(LayoutRules, EachRuleHasItsOwnMessage) {
  ModelConfig c = kimi_48b();
  c.kda_heads = 24;  // 24 % 16 != 0
  c.mla_heads = 40;
  c.num_experts = 200;
  c.intermediate_size = 9000;
  c.moe_intermediate_size = 1000;
  c.vocab_size = 163841;
  const std::string all = joined(layout_violations(c, LayoutRequest{2, 8, 0, 0, 64}));
  for (const char* rule :
       {"KDA head count (24)", "MLA head count (40)", "routed expert count (200)",
        "dense MLP intermediate size (9000)", "shared-expert intermediate size (1000)", "vocabulary"}) {
    EXPECT_NE(all.find(rule), std::string::npos) << rule << " missing from:\n" << all;
  }
}

TEST(LayoutRules, MoeSplitMustCoverAllRanks) {
  const ModelConfig c = kimi_48b();
  EXPECT_TRUE(layout_violations(c, LayoutRequest{1, 8, 4, 2, 64}).empty());
  EXPECT_TRUE(layout_violations(c, LayoutRequest{1, 8, 0, 2, 64}).empty());  // moe_ep derived: 4
  const std::string bad = joined(layout_violations(c, LayoutRequest{1, 8, 4, 4, 64}));
  EXPECT_NE(bad.find("--moe-ep (4) x --moe-tp (4) must equal tp*cp (8)"), std::string::npos) << bad;
  const std::string bad_tp = joined(layout_violations(c, LayoutRequest{1, 8, 0, 3, 64}));
  EXPECT_NE(bad_tp.find("--moe-tp 3 must divide tp*cp (8)"), std::string::npos) << bad_tp;
  ModelConfig odd = c;
  odd.moe_intermediate_size = 1022;  // not divisible by moe_tp 4
  const std::string bad_inter = joined(layout_violations(odd, LayoutRequest{1, 8, 2, 4, 64}));
  EXPECT_NE(bad_inter.find("expert intermediate size (1022)"), std::string::npos) << bad_inter;
}

TEST(LayoutRules, RejectsNonPositiveWidthsAndPages) {
  const ModelConfig c = kimi_48b();
  EXPECT_FALSE(layout_violations(c, LayoutRequest{0, 1, 0, 0, 64}).empty());
  const std::string p = joined(layout_violations(c, LayoutRequest{1, 2, 0, 0, 0}));
  EXPECT_NE(p.find("--tokens-per-block must be in [1, 65536] (got 0)"), std::string::npos) << p;
}

// Regression (issue 12): a page size without an upper bound let pages x page size wrap, and tp*cp was
// multiplied in int, so --tp 65536 --cp 65536 wrapped to 0.
TEST(LayoutRules, BoundsPageSizeAndRankCount) {
  const ModelConfig c = kimi_48b();
  std::string p = joined(layout_violations(c, LayoutRequest{1, 2, 0, 0, 115292150460684698}));
  EXPECT_NE(p.find("--tokens-per-block must be in [1, 65536] (got 115292150460684698)"), std::string::npos)
      << p;
  p = joined(layout_violations(c, LayoutRequest{65536, 65536, 0, 0, 64}));
  EXPECT_NE(p.find("--tp 65536 x --cp 65536 = 4294967296 ranks"), std::string::npos) << p;
  p = joined(layout_violations(c, LayoutRequest{1, 2, 65536, 65536, 64}));
  EXPECT_NE(p.find("must equal tp*cp (2)"), std::string::npos) << p;
  EXPECT_THROW(Mapping::make(65536, 65536, 0), Error);
}

TEST(LayoutRules, ErrorListsTheLayoutsThatWork) {
  ModelConfig c = kimi_48b();
  c.mla_heads = 24;  // divisible by 1, 2, 4, 8 only... and KDA by 32: common widths 1, 2, 4, 8
  try {
    check_layout(c, LayoutRequest{1, 16, 0, 0, 64});
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("48b/config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("MLA head count (24) must be divisible by tp*cp (16)"), std::string::npos) << m;
    EXPECT_NE(m.find("tp*cp = 1, 2, 4, 8 ranks"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(check_layout(c, LayoutRequest{2, 4, 0, 0, 64}));
  c.vocab_size = 7;  // prime: only one rank works
  EXPECT_NE(describe_valid_sizes(c, 64).find("tp*cp = 1 ranks"), std::string::npos);
}

TEST(LayoutRules, KimiK3ValidWidths) {
  const ModelConfig c = load_model_config(std::string(HLM_FIXTURES_DIR) + "/configs/kimi-k3.json");
  // 96 MLA and KDA heads and 896 experts share the divisors 1, 2, 4, 8, 16, 32.
  EXPECT_NE(describe_valid_sizes(c, 64).find("tp*cp = 1, 2, 4, 8, 16, 32 ranks"), std::string::npos)
      << describe_valid_sizes(c, 64);
  for (int cp : {8, 16, 32}) EXPECT_TRUE(layout_violations(c, LayoutRequest{1, cp, 0, 0, 64}).empty()) << cp;
  const std::string k3_12 = joined(layout_violations(c, LayoutRequest{1, 12, 0, 0, 64}));
  EXPECT_NE(k3_12.find("routed expert count (896) must be divisible by --moe-ep (12)"), std::string::npos)
      << k3_12;
  const std::string k3_64 = joined(layout_violations(c, LayoutRequest{2, 32, 0, 0, 64}));
  EXPECT_NE(k3_64.find("MLA head count (96) must be divisible by tp*cp (64)"), std::string::npos) << k3_64;
  EXPECT_NE(k3_64.find("KDA head count (96)"), std::string::npos) << k3_64;
}

TEST(LayoutRules, Mxfp4ExpertShardsKeepWholeScaleGroups) {
  const ModelConfig c = load_model_config(std::string(HLM_FIXTURES_DIR) + "/configs/kimi-k3.json");
  // 3072 / 32 = 96 columns per moe_tp shard: whole groups. 3072 / 64 = 48: no.
  EXPECT_TRUE(layout_violations(c, LayoutRequest{1, 32, 1, 32, 64}).empty());
  const std::string bad = joined(layout_violations(c, LayoutRequest{2, 32, 1, 64, 64}));
  EXPECT_NE(bad.find("MXFP4 experts each --moe-tp shard"), std::string::npos) << bad;
}

}  // namespace
}  // namespace hlm
