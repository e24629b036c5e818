// The NCCL communicator's own code on the emulated NCCL and CUDA (-DRINGATTN_CUDA_EMULATION=ON),
// under mpirun: one NCCL communicator per rank whatever P, grouped steps that match by posting
// order, collectives on device and host memory, a receive without its send ending in a CommError
// that names the rank and the step (bounded, no hang at teardown), and teardown that leaves no
// communicator behind.
#include <gtest/gtest.h>
#include <nccl.h>

#include <numeric>
#include <string>
#include <vector>

#include "comm/nccl_communicator.hpp"
#include "comm/stopwatch.hpp"
#include "tests/comm/step_exchange.hpp"

namespace ringattn::comm::testing {
namespace {

TEST(NcclEmulated, OneCommunicatorPerRankWhateverTheRanks) {
  {
    NcclCommunicator nccl(MPI_COMM_WORLD, 30.0);
    EXPECT_EQ(nccl.nccl_communicators(), 1);
    EXPECT_EQ(ncclEmulationLiveCommunicators(), 1) << "at P = " << nccl.size();
    EXPECT_STREQ(nccl.name(), "nccl");
    EXPECT_EQ(nccl.memory(), MemorySpace::device);
  }
  EXPECT_EQ(ncclEmulationLiveCommunicators(), 0) << "teardown left a communicator behind";
}

TEST(NcclEmulated, StepsMatchInPostingOrder) {
  NcclCommunicator nccl(MPI_COMM_WORLD, 30.0);
  const uint64_t sent = nccl.bytes_sent();
  step_exchange(nccl, 9);
  EXPECT_GT(nccl.bytes_sent(), sent);
}

TEST(NcclEmulated, CollectivesOnDeviceAndHostMemory) {
  NcclCommunicator nccl(MPI_COMM_WORLD, 30.0);
  const int P = nccl.size(), r = nccl.rank();
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(float) * 2 * size_t(P)), cudaSuccess);
  d[0] = float(r + 1), d[1] = 2.0f;
  nccl.allreduce(d, 2, DataType::f32, ReduceOp::sum);
  EXPECT_EQ(d[0], float(P * (P + 1) / 2));
  EXPECT_EQ(d[1], float(2 * P));
  d[0] = r == P - 1 ? 42.0f : 0.0f;
  nccl.broadcast(d, sizeof(float), P - 1);
  EXPECT_EQ(d[0], 42.0f);
  float* all = nullptr;
  ASSERT_EQ(cudaMalloc(&all, sizeof(float) * size_t(P)), cudaSuccess);
  d[0] = float(10 * r);
  nccl.allgather(d, all, sizeof(float));
  for (int i = 0; i < P; ++i) EXPECT_EQ(all[i], float(10 * i));
  for (int i = 0; i < P; ++i) all[i] = float(i + r);
  std::vector<size_t> counts(size_t(P), 1);
  nccl.reduce_scatter(all, d, counts, DataType::f32, ReduceOp::sum);
  EXPECT_EQ(d[0], float(P * r + P * (P - 1) / 2));
  double h = r;
  nccl.allreduce(&h, 1, DataType::f64, ReduceOp::max);  // host memory: over MPI
  EXPECT_EQ(h, double(P - 1));
  nccl.barrier();
  cudaFree(all);
  cudaFree(d);
}

// Rank 0 waits for a step whose send never comes: a CommError within the timeout naming the
// rank and the step, the communicator aborted; the other ranks' teardown (finalize waits for
// peers) is bounded too.
TEST(NcclEmulated, AReceiveWithoutItsSendTimesOutAndAborts) {
  const Stopwatch clock;
  {
    NcclCommunicator nccl(MPI_COMM_WORLD, 1.0);
    std::vector<uint8_t> in(64);
    if (nccl.rank() == 0 && nccl.size() > 1) {
      const StepTransfer t = StepTransfer::recv(in.data(), in.size(), 1);
      StepHandle h = nccl.post_step(std::span<const StepTransfer>(&t, 1));
      try {
        nccl.wait_step(h, "data that never comes");
        ADD_FAILURE() << "expected a timeout";
      } catch (const CommError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
        EXPECT_NE(m.find("step 0"), std::string::npos) << m;
        EXPECT_NE(m.find("timed out"), std::string::npos) << m;
        EXPECT_NE(m.find("ncclCommAbort"), std::string::npos) << m;
      }
      EXPECT_EQ(nccl.nccl_communicators(), 0);
    }
  }
  EXPECT_EQ(ncclEmulationLiveCommunicators(), 0);
  EXPECT_LT(clock.seconds(), 20.0);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace ringattn::comm::testing
