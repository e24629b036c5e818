// The NCCL communicator's own code on the emulated NCCL and CUDA (-DRINGATTN_CUDA_EMULATION=ON),
// under mpirun: one NCCL communicator per rank whatever P, grouped steps that match by posting
// order, collectives on device and host memory, split by ncclCommSplit (color, key, ties, no
// color) with an all-to-all on device memory over the new communicator, a receive without its
// send ending in a CommError that names the rank and the step (bounded, no hang at teardown),
// and teardown that leaves no communicator behind.
#include <gtest/gtest.h>
#include <nccl.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "comm/nccl_communicator.hpp"
#include "util/stopwatch.hpp"
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
  nccl.allreduce(d, 2, DType::f32, ReduceOp::sum);
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
  nccl.reduce_scatter(all, d, counts, DType::f32, ReduceOp::sum);
  EXPECT_EQ(d[0], float(P * r + P * (P - 1) / 2));
  double h = r;
  nccl.allreduce(&h, 1, DType::f64, ReduceOp::max);  // host memory: over MPI
  EXPECT_EQ(h, double(P - 1));
  nccl.barrier();
  cudaFree(all);
  cudaFree(d);
}

// Blocks j of (j + 1) floats, 100 x sender + j, to every rank j: each rank checks what it got.
void check_alltoallv(Communicator& c, bool device) {
  const int n = c.size(), me = c.rank();
  std::vector<size_t> send_bytes(static_cast<size_t>(n));
  std::vector<size_t> recv_bytes(static_cast<size_t>(n), sizeof(float) * size_t(me + 1));
  for (int j = 0; j < n; ++j) send_bytes[size_t(j)] = sizeof(float) * size_t(j + 1);
  const size_t count = size_t(n * (n + 1) / 2);
  float *send = nullptr, *recv = nullptr;
  std::vector<float> host_send(count), host_recv(size_t(n * (me + 1)));
  if (device) {
    ASSERT_EQ(cudaMalloc(&send, sizeof(float) * count), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&recv, sizeof(float) * host_recv.size()), cudaSuccess);
  } else {
    send = host_send.data(), recv = host_recv.data();
  }
  for (int j = 0, at = 0; j < n; ++j)
    for (int e = 0; e <= j; ++e) send[at++] = float(100 * me + j);
  c.alltoallv(send, send_bytes, recv, recv_bytes);
  for (int i = 0; i < n; ++i)
    for (int e = 0; e <= me; ++e) EXPECT_EQ(recv[i * (me + 1) + e], float(100 * i + me)) << "from " << i;
  if (device) cudaFree(send), cudaFree(recv);
}

// Ranks of one color form a communicator ranked by key (ties by rank); a negative color gets
// none. Each holds one more NCCL communicator, whose all-to-all and steps work on its own ranks.
TEST(NcclEmulated, SplitByColorAndKey) {
  NcclCommunicator nccl(MPI_COMM_WORLD, 30.0);
  const int P = nccl.size(), r = nccl.rank();
  check_alltoallv(nccl, true);
  {
    // Colors by parity, the last rank left out when P > 2; keys reverse the order.
    const bool out = P > 2 && r == P - 1;
    std::unique_ptr<Communicator> sub = nccl.split(out ? -1 : r % 2, -r);
    ASSERT_EQ(sub == nullptr, out);
    EXPECT_EQ(ncclEmulationLiveCommunicators(), out ? 1 : 2);
    if (sub) {
      int members = 0, before = 0;  // same color, in the split; those with a larger rank come first
      for (int q = 0; q < P; ++q)
        if (q % 2 == r % 2 && !(P > 2 && q == P - 1)) members += 1, before += q > r ? 1 : 0;
      EXPECT_EQ(sub->size(), members);
      EXPECT_EQ(sub->rank(), before);
      EXPECT_STREQ(sub->name(), "nccl");
      EXPECT_EQ(sub->memory(), MemorySpace::device);
      check_alltoallv(*sub, true);
      check_alltoallv(*sub, false);  // host memory: over MPI
      step_exchange(*sub, 3);
    }
    // Equal keys: ranked as in the parent.
    std::unique_ptr<Communicator> halves = nccl.split(r < P / 2 ? 0 : 1, 7);
    ASSERT_TRUE(halves);
    EXPECT_EQ(halves->rank(), r < P / 2 ? r : r - P / 2);
    EXPECT_EQ(ncclEmulationLiveCommunicators(), out ? 2 : 3);
  }
  EXPECT_EQ(ncclEmulationLiveCommunicators(), 1);
}

// Rank 0 waits for a step whose send never comes: a CommError within the timeout naming the
// rank and the step, the communicator aborted; the other ranks' teardown (finalize waits for
// peers) is bounded too. The bound on the whole is one only a hang reaches (a quiet machine takes
// about 2 s: the 1 s timeout, then the teardown).
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
  EXPECT_LT(clock.seconds(), 120.0) << "did not hang";
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace ringattn::comm::testing
