// Placement against brute force (docs/HELIX.md §5): pages striped round-robin over the cp ranks by global
// position, exhaustively for cp 1..8 and several page sizes, including prompts shorter than one page
// per rank.
#include "parallel/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace hlm {
namespace {

// Brute force: walk every position, give page b to rank b % cp.
struct BruteForce {
  int64_t p;
  int cp;
  std::vector<std::vector<int64_t>> positions;  // per rank, global positions in local order

  BruteForce(int64_t p_, int cp_, int64_t len) : p(p_), cp(cp_), positions(cp_) {
    for (int64_t pos = 0; pos < len; ++pos) positions[(pos / p) % cp].push_back(pos);
  }
};

TEST(Placement, MatchesBruteForceExhaustively) {
  for (int cp = 1; cp <= 8; ++cp) {
    for (int64_t p : {1, 2, 4, 16, 64}) {
      const Placement pl{p, cp};
      const int64_t max_len = 3 * p * cp + 5;
      const BruteForce bf(p, cp, max_len);
      for (int64_t g = 0; g <= max_len; ++g) {
        int64_t sum = 0;
        for (int r = 0; r < cp; ++r) {
          const auto expect =
              std::count_if(bf.positions[r].begin(), bf.positions[r].end(), [&](int64_t x) { return x < g; });
          ASSERT_EQ(pl.local_len(g, r), expect) << "cp " << cp << " P " << p << " G " << g << " r " << r;
          sum += pl.local_len(g, r);
        }
        ASSERT_EQ(sum, g);
      }
      for (int r = 0; r < cp; ++r) {
        for (size_t i = 0; i < bf.positions[r].size(); ++i) {
          const int64_t pos = bf.positions[r][i];
          ASSERT_EQ(pl.owner(pos), r);
          ASSERT_EQ(pl.local_slot(pos), static_cast<int64_t>(i));
          ASSERT_EQ(pl.global_pos(r, static_cast<int64_t>(i)), pos);
          ASSERT_TRUE(pl.is_active(pos, r));
        }
      }
    }
  }
}

TEST(Placement, Invariants) {
  for (int cp = 1; cp <= 8; ++cp) {
    for (int64_t p : {1, 2, 4, 16, 64}) {
      const Placement pl{p, cp};
      for (int64_t g = 0; g <= 4 * p * cp; ++g) {
        std::vector<int64_t> lens = pl.local_lens(g);
        // Exactly one rank receives the token appended at position g.
        int active = 0;
        for (int r = 0; r < cp; ++r) {
          const int64_t grow = pl.local_len(g + 1, r) - pl.local_len(g, r);
          ASSERT_TRUE(grow == 0 || grow == 1);
          ASSERT_EQ(grow == 1, r == pl.owner(g));
          active += static_cast<int>(grow);
        }
        ASSERT_EQ(active, 1);
        // Lower ranks never hold fewer tokens, and the spread is at most one page.
        ASSERT_TRUE(std::is_sorted(lens.rbegin(), lens.rend()));
        ASSERT_LE(lens.front() - lens.back(), p);
        // Rank r is empty iff g <= r·P, which happens only for g < cp·P.
        for (int r = 0; r < cp; ++r) ASSERT_EQ(lens[r] == 0, g <= r * p);
        // During a decode step, kv lengths sum to G + 1 and past-seen lengths to G.
        int64_t kv = 0;
        for (int r = 0; r < cp; ++r) kv += pl.local_len(g + 1, r);
        ASSERT_EQ(kv, g + 1);
        // Pages: enough for the local tokens, never a wasted whole page.
        for (int r = 0; r < cp; ++r) {
          ASSERT_GE(pl.local_pages(g, r) * p, lens[r]);
          ASSERT_LT(pl.local_pages(g, r) * p - lens[r], p);
        }
      }
    }
  }
}

}  // namespace
}  // namespace hlm
