// The NCCL communicator's placement (comm/nccl_schedule.hpp), on the CPU.
#include <stdexcept>
#include <string>

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

}  // namespace
}  // namespace ringattn::comm
