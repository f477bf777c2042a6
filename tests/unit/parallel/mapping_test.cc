// The rank layout of docs/HELIX.md §1 and the shard indices derived from it: CP groups are consecutive
// ranks, TP groups strided by cp, and the MLA head chunk a rank receives in the all-to-all equals the
// chunk its W_UV / o_proj shard covers (the TensorRT-LLM PR #10350 bug).
#include "parallel/mapping.h"

#include <gtest/gtest.h>

#include <set>

#include "base/error.h"

namespace hlm {
namespace {

TEST(Mapping, RankLayoutMatchesHelixExample) {
  // tp = 4, cp = 2: CP groups [0,1] [2,3] [4,5] [6,7]; TP groups [0,2,4,6] [1,3,5,7].
  for (int r = 0; r < 8; ++r) {
    const Mapping m = Mapping::make(4, 2, r);
    EXPECT_EQ(m.tp_rank(), r / 2);
    EXPECT_EQ(m.cp_rank(), r % 2);
    EXPECT_EQ(m.repurposed_rank(), r);
    EXPECT_EQ(m.cp_peer(0), r / 2 * 2);
    EXPECT_EQ(m.cp_peer(1), r / 2 * 2 + 1);
  }
}

TEST(Mapping, AllToAllChunkIsTheOprojShard) {
  const int64_t heads = 32;
  for (auto [tp, cp] :
       {std::pair{1, 8}, std::pair{2, 4}, std::pair{4, 2}, std::pair{8, 1}, std::pair{2, 2}}) {
    std::set<int64_t> covered;
    for (int r = 0; r < tp * cp; ++r) {
      const Mapping m = Mapping::make(tp, cp, r);
      const Range local = m.mla_tp_heads(heads);
      const int64_t hc = heads / (tp * cp);
      // Chunk j of this rank's tp-local heads is sent to CP peer j; the peer with cp_rank c receives
      // chunk c from every member of its CP group. Those heads must be the peer's own chunk r'.
      for (int j = 0; j < cp; ++j) {
        const Mapping peer = Mapping::make(tp, cp, m.cp_peer(j));
        const Range sent{local.begin + j * hc, local.begin + (j + 1) * hc};
        EXPECT_EQ(sent, peer.mla_chunk_heads(heads)) << "tp " << tp << " cp " << cp << " rank " << r;
      }
      const Range chunk = m.mla_chunk_heads(heads);
      for (int64_t h = chunk.begin; h < chunk.end; ++h) EXPECT_TRUE(covered.insert(h).second);
    }
    EXPECT_EQ(covered.size(), static_cast<size_t>(heads));
  }
}

TEST(Mapping, ShardsTileTheirDimensions) {
  for (auto [tp, cp] : {std::pair{1, 4}, std::pair{2, 2}, std::pair{4, 1}}) {
    int64_t kda = 0, rows = 0, experts = 0, vocab = 0;
    for (int r = 0; r < tp * cp; ++r) {
      const Mapping m = Mapping::make(tp, cp, r);
      EXPECT_EQ(m.kda_heads(32).begin, kda);
      kda = m.kda_heads(32).end;
      EXPECT_EQ(m.mlp_rows(1024).begin, rows);
      rows = m.mlp_rows(1024).end;
      EXPECT_EQ(m.experts(256).begin, experts);
      experts = m.experts(256).end;
      EXPECT_EQ(m.vocab_rows(512).begin, vocab);
      vocab = m.vocab_rows(512).end;
    }
    EXPECT_EQ(kda, 32);
    EXPECT_EQ(rows, 1024);
    EXPECT_EQ(experts, 256);
    EXPECT_EQ(vocab, 512);
  }
}

TEST(Mapping, MoeSplitDefaultsToExpertParallelOverAllRanks) {
  const Mapping m = Mapping::make(2, 4, 5);
  EXPECT_EQ(m.moe_ep, 8);
  EXPECT_EQ(m.moe_tp, 1);
  EXPECT_EQ(m.experts(16), (Range{10, 12}));
  const Mapping t = Mapping::make(2, 4, 5, 4, 2);
  EXPECT_EQ(t.moe_ep_rank(), 2);
  EXPECT_EQ(t.moe_tp_rank(), 1);
  EXPECT_EQ(t.experts(16), (Range{8, 12}));
  EXPECT_EQ(t.expert_rows(32), (Range{16, 32}));
}

TEST(Mapping, RejectsImpossibleRanks) {
  EXPECT_THROW(Mapping::make(0, 1, 0), Error);
  EXPECT_THROW(Mapping::make(2, 2, 4), Error);
  EXPECT_THROW(even_shard(10, 4, 0), Error);
}

}  // namespace
}  // namespace hlm
