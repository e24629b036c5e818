// The NCCL communicator's placement and setup order (comm/nccl_schedule.hpp), on the CPU.
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm/nccl_schedule.hpp"
#include "tests/support/gtest_or_mini.hpp"

namespace ringattn::comm {
namespace {

TEST(NcclSchedule, OneGpuPerRankOrAnErrorNamingTheNode) {
  EXPECT_EQ(gpu_for_local_rank(0, 1, 1, "n1"), 0);
  EXPECT_EQ(gpu_for_local_rank(3, 4, 8, "n1"), 3);
  try {
    gpu_for_local_rank(2, 3, 2, "node7");
    EXPECT_TRUE(false) << "3 ranks on 2 GPUs must fail";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.find("node7") != std::string::npos && m.find("3 ranks but 2 GPUs") != std::string::npos) << m;
  }
  bool threw = false;
  try {
    gpu_for_local_rank(0, 1, 0, "cpu-only");
  } catch (const std::runtime_error&) {
    threw = true;
  }
  EXPECT_TRUE(threw);
}

// Every round is a matching, and every pair of ranks meets exactly once.
TEST(NcclSchedule, RoundRobinMeetsEveryPairOnce) {
  for (int ranks = 1; ranks <= 33; ++ranks) {
    std::set<std::pair<int, int>> met;
    for (int round = 0; round < round_robin_rounds(ranks); ++round)
      for (int r = 0; r < ranks; ++r) {
        const int partner = round_robin_partner(r, round, ranks);
        if (partner < 0) continue;
        ASSERT_NE(partner, r);
        ASSERT_EQ(round_robin_partner(partner, round, ranks), r) << ranks << " ranks, round " << round;
        if (r < partner) {
          ASSERT_TRUE(met.insert({r, partner}).second) << ranks << " ranks: " << r << "-" << partner << " twice";
        }
      }
    EXPECT_EQ(int(met.size()), ranks * (ranks - 1) / 2) << ranks << " ranks";
    EXPECT_LE(round_robin_rounds(ranks), ranks);
  }
}

}  // namespace
}  // namespace ringattn::comm
