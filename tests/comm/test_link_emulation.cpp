// Link emulation: the queueing arithmetic exactly, then measured transfers on this machine with a
// 1 GB/s, 100 us link. Lower bounds are the emulated times; upper bounds allow 3x for a shared,
// oversubscribed machine.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "util/stopwatch.hpp"
#include "tests/support/mpi_test_util.hpp"

namespace ringattn::comm::testing {
namespace {

constexpr LinkEmulation kSlowLink{1.0, 100.0};  // 1 GB/s, 100 us
constexpr size_t k10MB = 10'000'000;

TEST(EmulatedLink, MessagesQueueAndLatencyDoesNotHoldTheLink) {
  EmulatedLink link;
  EXPECT_DOUBLE_EQ(link.book(1.0, k10MB, kSlowLink), 1.0 + 0.010 + 0.0001);
  EXPECT_DOUBLE_EQ(link.book(1.0, k10MB, kSlowLink), 1.0 + 0.020 + 0.0001);   // behind the first
  EXPECT_DOUBLE_EQ(link.book(1.005, 0, kSlowLink), 1.0 + 0.020 + 0.0001);     // behind both
  EXPECT_DOUBLE_EQ(link.book(2.0, 0, kSlowLink), 2.0 + 0.0001);               // idle: latency only
  EXPECT_DOUBLE_EQ(link.book(3.0, 2'000'000'000, {2.0, 0.0}), 4.0);           // bandwidth only
  EXPECT_DOUBLE_EQ(EmulatedLink{}.book(3.0, 1'000'000, {0.0, 50.0}), 3.0 + 50e-6);  // latency only
}

// Seconds from posting a ring exchange until both are posted and until each wait returns.
struct RingTimes {
  double posted = 0.0, recv = 0.0, send = 0.0;
};

// Upper bounds on elapsed time only hold when every rank has a core of its own: oversubscribed
// ranks (3-4 ranks on a 2-core machine) wait for the scheduler, not for the emulated link. The
// lower bounds, which are what the emulator promises, are checked always.
bool ranks_have_own_cores(const Communicator& c) {
  return c.size() <= static_cast<int>(std::thread::hardware_concurrency());
}
constexpr double kSchedulerSlack = 0.02;  // seconds a busy machine may add to a short wait

RingTimes timed_ring_exchange(Communicator& c, size_t bytes, int tag) {
  const std::vector<uint8_t> out = payload(bytes, c.rank(), tag);
  std::vector<uint8_t> in(bytes);
  c.barrier();
  const Stopwatch watch;
  Request recv = c.irecv(in.data(), bytes, previous_rank(c), tag);
  Request send = c.isend(out.data(), bytes, next_rank(c), tag);
  RingTimes t;
  t.posted = watch.seconds();
  c.wait(recv, "emulated ring");
  t.recv = watch.seconds();
  c.wait(send, "emulated ring");
  t.send = watch.seconds();
  EXPECT_TRUE(in == payload(bytes, previous_rank(c), tag));
  return t;
}

TEST_F(MpiTest, ATransferTakesLatencyPlusSizeOverBandwidth) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  comm->set_link_emulation(kSlowLink);
  const RingTimes t = timed_ring_exchange(*comm, k10MB, 1);
  const double expect = kSlowLink.delay_seconds(k10MB);
  EXPECT_DOUBLE_EQ(expect, 0.0101);
  EXPECT_GE(t.recv, expect);
  EXPECT_GE(t.send, expect);
  if (ranks_have_own_cores(*comm)) {
    EXPECT_LE(t.recv, 3 * expect + kSchedulerSlack);
    EXPECT_LE(t.send, 3 * expect + kSchedulerSlack);
  }
  // The emulated time not spent posting is spent waiting (to 0.1 ms: the clocks are read apart).
  EXPECT_GE(comm->wait_seconds(), expect - t.posted - 1e-4);
}

TEST_F(MpiTest, AnEmptyMessageTakesTheLatency) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  comm->set_link_emulation(kSlowLink);
  const RingTimes t = timed_ring_exchange(*comm, 0, 2);
  EXPECT_GE(t.recv, 100e-6);
  EXPECT_GE(t.send, 100e-6);
  if (ranks_have_own_cores(*comm)) {
    EXPECT_LE(t.send, 0.02 + kSchedulerSlack);
  }
}

// Two 10 MB messages posted together share the link: the second arrives 10 ms after the first.
TEST_F(MpiTest, ConsecutiveTransfersQueueOnTheLink) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  comm->set_link_emulation(kSlowLink);
  const std::vector<uint8_t> out = payload(k10MB, rank(), 3);
  std::vector<uint8_t> in1(k10MB), in2(k10MB);
  comm->barrier();
  const Stopwatch watch;
  Request recv1 = comm->irecv(in1.data(), k10MB, previous_rank(*comm), 3);
  Request recv2 = comm->irecv(in2.data(), k10MB, previous_rank(*comm), 3);
  Request send1 = comm->isend(out.data(), k10MB, next_rank(*comm), 3);
  Request send2 = comm->isend(out.data(), k10MB, next_rank(*comm), 3);
  comm->wait(send1, "first");
  const double first_sent = watch.seconds();
  comm->wait(recv1, "first");
  const double first_received = watch.seconds();
  comm->wait(send2, "second");
  comm->wait(recv2, "second");
  const double both = watch.seconds();
  EXPECT_GE(first_sent, 0.0101);
  EXPECT_GE(first_received, 0.0101);
  EXPECT_GE(both, 0.0201);
  if (ranks_have_own_cores(*comm)) {
    EXPECT_LT(first_received, 0.0201 + kSchedulerSlack) << "the first message waits for no other";
    EXPECT_LE(both, 3 * 0.0201 + kSchedulerSlack);
  }
  EXPECT_TRUE(in1 == payload(k10MB, previous_rank(*comm), 3));
  EXPECT_TRUE(in2 == in1);
}

// test() says "not yet" while MPI has finished but the emulated link has not.
TEST_F(MpiTest, TestIsFalseUntilTheEmulatedTimeHasCome) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  comm->set_link_emulation({0.0, 20'000.0});  // 20 ms latency
  uint8_t in = 0, out = 1;
  comm->barrier();
  const Stopwatch watch;
  Request recv = comm->irecv(&in, 1, previous_rank(*comm), 4);
  Request send = comm->isend(&out, 1, next_rank(*comm), 4);
  EXPECT_FALSE(comm->test(recv));
  EXPECT_FALSE(comm->test(send));
  comm->wait(recv, "slow byte");
  EXPECT_GE(watch.seconds(), 0.02);
  comm->wait(send, "slow byte");
  EXPECT_EQ(in, 1);

  comm->set_link_emulation({});  // off again: no delay is added
  EXPECT_FALSE(comm->link_emulation().active());
  const RingTimes t = timed_ring_exchange(*comm, 1, 5);
  if (ranks_have_own_cores(*comm)) {
    EXPECT_LT(t.send, 0.02 + kSchedulerSlack);
  }
}

// A receive posted long before its send completes no earlier than the send could arrive: the
// sender's link takes the message when the send is posted (its start time travels ahead of the
// payload), then size / bandwidth + latency. Rank 0 sends to rank 1 after 50 ms.
TEST_F(MpiTest, AnEarlyReceiveWaitsForTheSendsLink) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  comm->set_link_emulation({0.1, 5'000.0});  // 100 MB/s, 5 ms: 1 MB takes 10 ms + 5 ms
  const size_t bytes = 1'000'000;
  std::vector<uint8_t> buffer = payload(bytes, 0, 7);
  comm->barrier();
  const Stopwatch watch;
  if (rank() == 1) {
    std::vector<uint8_t> in(bytes);
    Request recv = comm->irecv(in.data(), bytes, 0, 7);
    comm->wait(recv, "a late send");
    EXPECT_GE(watch.seconds(), 0.050 + 0.015) << "the receive ended before the send could have arrived";
    EXPECT_TRUE(in == buffer);
  } else if (rank() == 0) {
    while (watch.seconds() < 0.050) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    Request send = comm->isend(buffer.data(), bytes, 1, 7);
    comm->wait(send, "a late send");
    EXPECT_GE(watch.seconds(), 0.050 + 0.015);
  }
  comm->barrier();
}

// The nodes of the ranks: one machine here, the least rank of the node is 0.
TEST_F(MpiTest, EveryRankIsOnTheFirstRanksNode) {
  EXPECT_EQ(comm->node_of_ranks(), std::vector<int>(size_t(size()), 0));
}

// A message to oneself never crosses the network: the link does not delay it.
TEST_F(MpiTest, MessagesToOneselfAreNotDelayed) {
  comm->set_link_emulation({0.001, 50'000.0});  // 1 MB/s, 50 ms
  const std::vector<uint8_t> out = payload(10000, rank(), 6);
  std::vector<uint8_t> in(out.size());
  const Stopwatch watch;
  Request recv = comm->irecv(in.data(), in.size(), rank(), 6);
  Request send = comm->isend(out.data(), out.size(), rank(), 6);
  comm->wait(recv, "to myself");
  comm->wait(send, "to myself");
  if (ranks_have_own_cores(*comm)) {
    EXPECT_LT(watch.seconds(), 0.02 + kSchedulerSlack);
  }
  EXPECT_TRUE(in == out);
}

}  // namespace
}  // namespace ringattn::comm::testing
