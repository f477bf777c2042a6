// KvManager: the one global length per sequence, pages allocated only for owned positions, cache indices
// consistent with the placement functions, and orderly refusals when pages or slots run out.
#include "cache/kv_manager.h"

#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <set>

#include "base/error.h"

namespace hlm {
namespace {

TEST(KvManager, PagesFollowPlacementOnEveryRank) {
  const Placement pl{4, 3};
  const int64_t len = 50;
  std::set<std::pair<int, int64_t>> used;  // (rank, flat index)
  for (int r = 0; r < 3; ++r) {
    KvManager kv(pl, r, 16, 2);
    kv.add(7);
    kv.reserve(7, 20);  // a prefill chunk
    kv.commit(7, 20);
    for (int64_t i = 20; i < len; ++i) {  // then decode one by one
      kv.reserve(7, 1);
      kv.commit(7, 1);
    }
    EXPECT_EQ(kv.global_len(7), len);
    EXPECT_EQ(static_cast<int64_t>(kv.pages(7).size()), pl.local_pages(len, r));
    int64_t owned = 0;
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t idx = kv.cache_index(7, pos);
      if (pl.owner(pos) != r) {
        EXPECT_EQ(idx, -1);
        continue;
      }
      ++owned;
      EXPECT_GE(idx, 0);
      EXPECT_EQ(idx % 4, pl.local_slot(pos) % 4);
      EXPECT_TRUE(used.insert({r, idx}).second) << "two positions share a cache row";
    }
    EXPECT_EQ(owned, pl.local_len(len, r));
  }
}

TEST(KvManager, ReleaseReturnsPagesAndSlots) {
  KvManager kv(Placement{2, 1}, 0, 4, 1);
  EXPECT_EQ(kv.add(1), 0);
  kv.reserve(1, 8);
  EXPECT_EQ(kv.free_pages(), 0);
  EXPECT_THROW(kv.add(2), Error);  // no slot left
  kv.release(1);
  EXPECT_EQ(kv.free_pages(), 4);
  EXPECT_EQ(kv.free_slots(), 1);
  EXPECT_EQ(kv.add(2), 0);
}

TEST(KvManager, FullCacheIsAnOrderlyError) {
  KvManager kv(Placement{4, 1}, 0, 2, 2);
  kv.add(1);
  kv.reserve(1, 8);
  kv.add(2);
  try {
    kv.reserve(2, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache full"), std::string::npos);
  }
  EXPECT_EQ(kv.pages(2).size(), 0u);  // nothing half-allocated
}

TEST(KvManager, RejectsMisuse) {
  KvManager kv(Placement{4, 2}, 1, 8, 2);
  EXPECT_THROW(kv.global_len(3), Error);
  kv.add(3);
  EXPECT_THROW(kv.add(3), Error);
  EXPECT_THROW(kv.commit(3, 1), Error);       // not reserved
  EXPECT_THROW(kv.cache_index(3, 0), Error);  // not reserved
  EXPECT_THROW(KvManager(Placement{0, 1}, 0, 1, 1), Error);
}

// Regression (issue 12): the free lists held every page id, pushed one by one, so a pool sized for 2^31
// pages took 8 GB and minutes before the first step. Now they cost nothing until ids are released.
TEST(KvManager, HugePoolsCostNothingUpFront) {
  const auto start = std::chrono::steady_clock::now();
  KvManager kv(Placement{64, 1}, 0, kMaxPagesPerRank, std::numeric_limits<int32_t>::max());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_EQ(kv.free_pages(), kMaxPagesPerRank);
  EXPECT_EQ(kv.free_slots(), std::numeric_limits<int32_t>::max());
  kv.add(1);
  kv.reserve(1, 200);
  EXPECT_EQ(kv.pages(1), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(kv.cache_index(1, 199), 3 * 64 + 7);
}

TEST(IdPool, HandsOutLowestFreshIdsAndReusesTheLastReleasedFirst) {
  IdPool pool(5);
  EXPECT_EQ(pool.take(), 0);
  EXPECT_EQ(pool.take(), 1);
  EXPECT_EQ(pool.take(), 2);
  pool.give(1);
  pool.give(0);
  EXPECT_EQ(pool.free(), 4);
  EXPECT_EQ(pool.take(), 0);
  EXPECT_EQ(pool.take(), 1);
  EXPECT_EQ(pool.take(), 3);
  EXPECT_EQ(pool.take(), 4);
  EXPECT_EQ(pool.free(), 0);
  EXPECT_THROW(pool.take(), Error);
  EXPECT_THROW(IdPool(int64_t{1} << 32), Error);  // ids are int32
}

}  // namespace
}  // namespace hlm
