// Bounded blocking: a receive no one sends, a send no one receives and a collective a rank is late
// for each become a CommError after timeout() seconds that says who waited for what, and the
// communicator goes on working afterwards (as the error report and the tests need).
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "comm/stopwatch.hpp"
#include "mpi_test_util.hpp"

namespace ringattn::comm::testing {
namespace {

// Runs `call`, which must throw CommError; returns its message ("" and a failure if it did not).
template <class Call>
std::string comm_error_of(Call call) {
  try {
    call();
  } catch (const CommError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no CommError";
  return "";
}

TEST_F(MpiTest, AReceiveNoOneSendsTimesOutNamingThePeer) {
  comm->set_timeout(1.0);
  const int peer = previous_rank(*comm);
  uint8_t byte = 0;
  Request recv = comm->irecv(&byte, 1, peer, 900);
  const Stopwatch watch;
  const std::string message = comm_error_of([&] { comm->wait(recv, "K/V step 3"); });
  const double elapsed = watch.seconds();
  EXPECT_GE(elapsed, 1.0);
  EXPECT_LT(elapsed, 1.5);
  EXPECT_EQ(message, "rank " + std::to_string(rank()) + ": timed out after 1 s waiting for 'K/V step 3' from rank " +
                         std::to_string(peer) + " (tag 900, 1 bytes)");
  EXPECT_FALSE(recv.valid());
  EXPECT_EQ(comm->outstanding(), 0u);

  // The timed-out receive was cancelled: a message with its tag goes to the next receive.
  comm->set_timeout(10.0);
  comm->barrier();
  ring_exchange(*comm, 1, 900);
  EXPECT_EQ(byte, 0);
}

// 1 MiB is above every eager limit of Open MPI, so the send waits for its receive. Open MPI cannot
// cancel it; it is let go and delivered when the peer receives at last.
TEST_F(MpiTest, ASendNoOneReceivesTimesOutAndIsDeliveredLater) {
  comm->set_timeout(0.3);
  const size_t bytes = size_t(1) << 20;
  const std::vector<uint8_t> out = payload(bytes, rank(), 901);
  Request send = comm->isend(out.data(), bytes, next_rank(*comm), 901);
  const std::string message = comm_error_of([&] { comm->wait(send, "unreceived K/V"); });
  EXPECT_EQ(message, "rank " + std::to_string(rank()) + ": timed out after 0.3 s waiting for 'unreceived K/V' to reach rank " +
                         std::to_string(next_rank(*comm)) + " (tag 901, 1048576 bytes)");
  EXPECT_FALSE(send.valid());

  comm->set_timeout(10.0);
  comm->barrier();
  std::vector<uint8_t> in(bytes);
  Request recv = comm->irecv(in.data(), bytes, previous_rank(*comm), 901);
  comm->wait(recv, "late receive");
  EXPECT_TRUE(in == payload(bytes, previous_rank(*comm), 901));
  comm->barrier();  // every receive has read its sender's `out` before it goes away
}

TEST_F(MpiTest, ACollectiveARankIsLateForTimesOut) {
  if (size() == 1) GTEST_SKIP() << "needs a second rank to be late";
  comm->set_timeout(0.3);
  if (rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    comm->barrier();  // the others have begun theirs before giving up on it
  } else {
    const std::string message = comm_error_of([&] { comm->barrier(); });
    EXPECT_EQ(message, "rank " + std::to_string(rank()) + ": timed out after 0.3 s in barrier: some rank of this " +
                           "communicator of " + std::to_string(size()) + " ranks did not join it");
  }
  comm->set_timeout(10.0);
  int64_t ranks = 1;
  comm->allreduce(&ranks, 1, DataType::i64, ReduceOp::sum);
  EXPECT_EQ(ranks, size());
}

// In a sub-communicator, messages give the world rank too, to match mpirun's and the logs' numbering.
TEST_F(MpiTest, TimeoutsInASubCommunicatorNameWorldRanks) {
  std::unique_ptr<Communicator> reversed = comm->split(0, size() - rank());
  reversed->set_timeout(0.05);
  const int peer = previous_rank(*reversed);
  uint8_t byte = 0;
  Request recv = reversed->irecv(&byte, 1, peer, 7);
  const std::string message = comm_error_of([&] { reversed->wait(recv, "nothing"); });
  const int world_peer = size() - 1 - peer;
  const std::string expect = size() == 1 ? "rank 0: timed out after 0.05 s waiting for 'nothing' from rank 0 (tag 7, 1 bytes)"
                                         : "rank " + std::to_string(reversed->rank()) + " (world rank " +
                                               std::to_string(rank()) + "): timed out after 0.05 s waiting for "
                                               "'nothing' from rank " + std::to_string(peer) + " (world rank " +
                                               std::to_string(world_peer) + ") (tag 7, 1 bytes)";
  EXPECT_EQ(message, expect);
}

}  // namespace
}  // namespace ringattn::comm::testing
