// Sharding: every position on exactly one rank, balanced, and locate() inverts positions().
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "runtime/errors.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {
namespace {

TEST(ShardLayout, PartitionsEveryLengthOverEveryRankCount) {
  for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
    for (int P = 1; P <= 8; ++P)
      for (int64_t L : {int64_t(P), int64_t(P + 1), int64_t(2 * P - 1), int64_t(2 * P), int64_t(97), int64_t(128)}) {
        if (L < P) continue;
        const ShardLayout layout(kind, L, P);
        std::vector<int> owner(static_cast<size_t>(L), -1);
        int64_t min_rows = L, max_rows = 0;
        for (int r = 0; r < P; ++r) {
          const auto pos = layout.positions(r);
          ASSERT_EQ(static_cast<int64_t>(pos.size()), layout.rows(r));
          ASSERT_TRUE(std::is_sorted(pos.begin(), pos.end()));
          min_rows = std::min<int64_t>(min_rows, pos.size());
          max_rows = std::max<int64_t>(max_rows, pos.size());
          for (size_t t = 0; t < pos.size(); ++t) {
            ASSERT_EQ(owner[static_cast<size_t>(pos[t])], -1) << "position on two ranks";
            owner[static_cast<size_t>(pos[t])] = r;
            const auto at = layout.locate(pos[t]);
            EXPECT_EQ(at.rank, r);
            EXPECT_EQ(at.row, static_cast<int64_t>(t));
            EXPECT_EQ(layout.position(r, static_cast<int64_t>(t)), pos[t]);
          }
        }
        for (int o : owner) ASSERT_GE(o, 0) << "position on no rank";
        EXPECT_GE(min_rows, 1);
        EXPECT_LE(max_rows - min_rows, kind == LayoutKind::zigzag ? 2 : 1) << layout_name(kind) << " P " << P << " L " << L;
      }
}

TEST(ShardLayout, ZigzagHoldsChunksRAndMirror) {
  const ShardLayout layout(LayoutKind::zigzag, 16, 4);  // chunks of 2
  EXPECT_EQ(layout.positions(0), (std::vector<int64_t>{0, 1, 14, 15}));
  EXPECT_EQ(layout.positions(1), (std::vector<int64_t>{2, 3, 12, 13}));
  EXPECT_EQ(layout.positions(3), (std::vector<int64_t>{6, 7, 8, 9}));
}

TEST(ShardLayout, StripedIsTokenModP) {
  const ShardLayout layout(LayoutKind::striped, 10, 3);
  EXPECT_EQ(layout.positions(1), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(layout.positions(0), (std::vector<int64_t>{0, 3, 6, 9}));
}

TEST(ShardLayout, RefusesFewerPositionsThanRanks) {
  EXPECT_THROW(ShardLayout(LayoutKind::contiguous, 3, 4), ArgumentError);
  EXPECT_THROW(parse_layout("diagonal"), ArgumentError);
}

}  // namespace
}  // namespace ringattn

namespace ringattn::testing {
namespace {

// --ulysses U: the members of group g together hold exactly the group's rows of the layout over
// P/U groups, in order; every position has one owner; a shard is still at most two runs.
TEST(ShardLayout, UlyssesMembersSplitTheirGroupsRows) {
  for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
    for (int P = 1; P <= 8; ++P)
      for (int U = 1; U <= P; ++U) {
        if (P % U != 0) continue;
        for (int64_t L : {int64_t(P), int64_t(P) + 1, int64_t(37), int64_t(100)}) {
          if (L < P) continue;
          const ShardLayout layout(kind, L, P, U);
          const ShardLayout groups = layout.group_layout();
          ASSERT_EQ(groups.ranks(), P / U);
          std::vector<int> owner(size_t(L), -1);
          for (int g = 0; g < P / U; ++g) {
            std::vector<int64_t> joined;
            for (int u = 0; u < U; ++u) {
              const int r = g * U + u;
              const std::vector<int64_t> pos = layout.positions(r);
              EXPECT_LE(layout.runs(r).size(), 2u);
              EXPECT_EQ(int64_t(pos.size()), layout.rows(r));
              for (size_t t = 0; t < pos.size(); ++t) {
                EXPECT_EQ(owner[size_t(pos[t])], -1);
                owner[size_t(pos[t])] = r;
                const auto at = layout.locate(pos[t]);
                EXPECT_EQ(at.rank, r);
                EXPECT_EQ(at.row, int64_t(t));
                EXPECT_EQ(layout.position(r, int64_t(t)), pos[t]);
              }
              joined.insert(joined.end(), pos.begin(), pos.end());
            }
            EXPECT_EQ(joined, groups.positions(g)) << layout_name(kind) << " P " << P << " U " << U << " L " << L;
          }
          for (int64_t t = 0; t < L; ++t) EXPECT_GE(owner[size_t(t)], 0);
        }
      }
  EXPECT_THROW(ShardLayout(LayoutKind::zigzag, 100, 4, 3), ArgumentError);
}

}  // namespace
}  // namespace ringattn::testing
