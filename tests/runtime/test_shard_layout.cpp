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
  EXPECT_THROW(ShardLayout(LayoutKind::contiguous, 3, 4), UsageError);
  EXPECT_THROW(parse_layout("diagonal"), UsageError);
}

}  // namespace
}  // namespace ringattn
