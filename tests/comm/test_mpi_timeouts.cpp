// Bounded blocking: a receive no one sends, a send no one receives and a collective a rank is late
// for each become a CommError after timeout() seconds that says who waited for what and which
// ranks a roll call found absent, and the communicator goes on working afterwards (as the error
// report and the tests need).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <thread>

#include "util/stopwatch.hpp"
#include "tests/support/mpi_test_util.hpp"

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

// A bound only a hang reaches: a timeout of at most a second, its roll call and a very busy
// machine's scheduling take a few seconds (how long a quiet machine takes is in the messages).
constexpr double kNoHang = 60.0;

// A rank away from communication stays away this long: well past the others' timeout (1 s) and
// roll call (0.2 s), however late a busy machine lets them notice.
constexpr auto kAway = std::chrono::milliseconds(4000);

// What a timeout adds when every rank is alive (they all wait in these tests).
std::string everyone_alive(const Communicator& comm) {
  return comm.size() == 1 ? "" : "; a roll call found all " + std::to_string(comm.size()) +
                                     " ranks alive: one is late, or waiting on something else";
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
  EXPECT_LT(elapsed, kNoHang) << "did not hang";
  EXPECT_EQ(message, "rank " + std::to_string(rank()) + ": timed out after 1 s waiting for 'K/V step 3' from rank " +
                         std::to_string(peer) + " (tag 900, 1 bytes)" + everyone_alive(*comm));
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
                         std::to_string(next_rank(*comm)) + " (tag 901, 1048576 bytes)" + everyone_alive(*comm));
  EXPECT_FALSE(send.valid());

  comm->set_timeout(10.0);
  comm->barrier();
  std::vector<uint8_t> in(bytes);
  Request recv = comm->irecv(in.data(), bytes, previous_rank(*comm), 901);
  comm->wait(recv, "late receive");
  EXPECT_TRUE(in == payload(bytes, previous_rank(*comm), 901));
  comm->barrier();  // every receive has read its sender's `out` before it goes away
}

// Rank 0 is away from MPI (as a stopped rank is) past the others' timeout and their roll call.
TEST_F(MpiTest, ACollectiveARankIsLateForTimesOutNamingThatRank) {
  if (size() == 1) GTEST_SKIP() << "needs a second rank to be late";
  comm->set_timeout(1.0);  // a roll call of 0.2 s
  if (rank() == 0) {
    std::this_thread::sleep_for(kAway);
    comm->barrier();  // the others have begun theirs before giving up on it
  } else {
    const Stopwatch watch;
    const std::string message = comm_error_of([&] { comm->barrier(); });
    EXPECT_LT(watch.seconds(), kNoHang) << "did not hang";
    EXPECT_EQ(message, "rank " + std::to_string(rank()) + ": timed out after 1 s in barrier: rank 0 did not answer a " +
                           "roll call within 0.2 s (stopped, dead, or busy outside communication)");
  }
  comm->set_timeout(10.0);
  int64_t ranks = 1;
  comm->allreduce(&ranks, 1, DType::i64, ReduceOp::sum);
  EXPECT_EQ(ranks, size());
}

// Waits chain: rank r waits for rank r - 1, and the last rank is away. Only rank 0 waits on the
// absent rank itself; every other rank's peer is alive and only waiting, and the roll call says so.
TEST_F(MpiTest, AChainOfWaitsNamesTheRankThatIsAway) {
  if (size() == 1) GTEST_SKIP() << "needs a second rank to be away";
  const int away = size() - 1;
  comm->set_timeout(1.0);
  if (rank() == away) {
    std::this_thread::sleep_for(kAway);
  } else {
    uint8_t byte = 0;
    Request recv = comm->irecv(&byte, 1, previous_rank(*comm), 902);
    const std::string message = comm_error_of([&] { comm->wait(recv, "K/V step 1"); });
    EXPECT_NE(message.find("from rank " + std::to_string(previous_rank(*comm)) + " (tag 902, 1 bytes); rank " +
                           std::to_string(away) + " did not answer a roll call within 0.2 s"),
              std::string::npos)
        << message;
  }
  comm->set_timeout(10.0);
  comm->barrier();
  // The away rank answers the asks it finds on its return; those answers are stale for any later
  // roll call, which must not count them: everyone is alive now, and says so.
  comm->set_timeout(0.2);
  uint8_t byte = 0;
  Request recv = comm->irecv(&byte, 1, previous_rank(*comm), 903);
  const std::string message = comm_error_of([&] { comm->wait(recv, "nothing"); });
  EXPECT_NE(message.find(everyone_alive(*comm)), std::string::npos) << message;
  comm->set_timeout(10.0);
  comm->barrier();
}

TEST(RollCallText, NamesAFewRanksThenCounts) {
  auto name = [](int r) { return "rank " + std::to_string(r); };
  EXPECT_EQ(roll_call_text({}, 4, 2.0, name), "a roll call found all 4 ranks alive: one is late, or waiting on "
                                               "something else");
  EXPECT_EQ(roll_call_text({3}, 4, 2.0, name),
            "rank 3 did not answer a roll call within 2 s (stopped, dead, or busy outside communication)");
  std::vector<int> many(20);
  std::iota(many.begin(), many.end(), 100);
  EXPECT_EQ(roll_call_text(many, 800, 0.5, name),
            "20 ranks did not answer a roll call within 0.5 s (stopped, dead, or busy outside communication): "
            "rank 100, rank 101, rank 102, rank 103, rank 104, rank 105, rank 106, rank 107 and 12 more");
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
                                               std::to_string(world_peer) + ") (tag 7, 1 bytes)" +
                                               everyone_alive(*reversed);
  EXPECT_EQ(message, expect);
}

}  // namespace
}  // namespace ringattn::comm::testing
