// Link emulation (comm/emulated_link_communicator.hpp): the queueing arithmetic exactly, then
// measured transfers on this machine with a 1 GB/s, 100 us link over the MPI communicator. Measured
// times are checked from below only (the emulated time is what the emulator promises; a busy
// machine can only add to it): that the link adds no more than its model is the arithmetic's test
// above, and how close a run comes to the model is measured by launch/plan/check_hybrid_model.sh
// (docs/benchmarks.md), not here.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/emulated_link_communicator.hpp"
#include "util/stopwatch.hpp"
#include "tests/support/mpi_test_util.hpp"

namespace ringattn::comm::testing {
namespace {

constexpr LinkEmulation kSlowLink{1.0, 100.0};  // 1 GB/s, 100 us
constexpr size_t k10MB = 10'000'000;

using Port = EmulatedLinkCommunicator::Port;

TEST(EmulatedLink, MessagesQueueAndLatencyDoesNotHoldTheLink) {
  Port link;
  EXPECT_DOUBLE_EQ(link.book(1.0, k10MB, kSlowLink), 1.0 + 0.010 + 0.0001);
  EXPECT_DOUBLE_EQ(link.book(1.0, k10MB, kSlowLink), 1.0 + 0.020 + 0.0001);   // behind the first
  EXPECT_DOUBLE_EQ(link.book(1.005, 0, kSlowLink), 1.0 + 0.020 + 0.0001);     // behind both
  EXPECT_DOUBLE_EQ(link.book(2.0, 0, kSlowLink), 2.0 + 0.0001);               // idle: latency only
  EXPECT_DOUBLE_EQ(link.book(3.0, 2'000'000'000, {2.0, 0.0}), 4.0);           // bandwidth only
  EXPECT_DOUBLE_EQ(Port{}.book(3.0, 1'000'000, {0.0, 50.0}), 3.0 + 50e-6);  // latency only
}

// Seconds from posting a ring exchange until both are posted and until each wait returns.
struct RingTimes {
  double posted = 0.0, recv = 0.0, send = 0.0;
};

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
  EmulatedLinkCommunicator link(*comm, LinkEmulation(kSlowLink));
  const RingTimes t = timed_ring_exchange(link, k10MB, 1);
  const double expect = kSlowLink.delay_seconds(k10MB);
  EXPECT_DOUBLE_EQ(expect, 0.0101);
  EXPECT_GE(t.recv, expect);
  EXPECT_GE(t.send, expect);
  // The emulated time not spent posting is spent waiting (to 0.1 ms: the clocks are read apart).
  EXPECT_GE(link.wait_seconds(), expect - t.posted - 1e-4);
}

TEST_F(MpiTest, AnEmptyMessageTakesTheLatency) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  EmulatedLinkCommunicator link(*comm, LinkEmulation(kSlowLink));
  const RingTimes t = timed_ring_exchange(link, 0, 2);
  EXPECT_GE(t.recv, 100e-6);
  EXPECT_GE(t.send, 100e-6);
}

// Two 10 MB messages posted together share the link: the second arrives 10 ms after the first.
TEST_F(MpiTest, ConsecutiveTransfersQueueOnTheLink) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  EmulatedLinkCommunicator link(*comm, LinkEmulation(kSlowLink));
  const std::vector<uint8_t> out = payload(k10MB, rank(), 3);
  std::vector<uint8_t> in1(k10MB), in2(k10MB);
  link.barrier();
  const Stopwatch watch;
  Request recv1 = link.irecv(in1.data(), k10MB, previous_rank(link), 3);
  Request recv2 = link.irecv(in2.data(), k10MB, previous_rank(link), 3);
  Request send1 = link.isend(out.data(), k10MB, next_rank(link), 3);
  Request send2 = link.isend(out.data(), k10MB, next_rank(link), 3);
  link.wait(send1, "first");
  const double first_sent = watch.seconds();
  link.wait(recv1, "first");
  const double first_received = watch.seconds();
  link.wait(send2, "second");
  link.wait(recv2, "second");
  const double both = watch.seconds();
  EXPECT_GE(first_sent, 0.0101);
  EXPECT_GE(first_received, 0.0101);
  EXPECT_GE(both, 0.0201);
  EXPECT_TRUE(in1 == payload(k10MB, previous_rank(link), 3));
  EXPECT_TRUE(in2 == in1);
}

// test() says "not yet" while MPI has finished but the emulated link has not.
TEST_F(MpiTest, TestIsFalseUntilTheEmulatedTimeHasCome) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  {
    EmulatedLinkCommunicator link(*comm, LinkEmulation{0.0, 20'000.0});  // 20 ms latency
    uint8_t in = 0, out = 1;
    link.barrier();
    const Stopwatch watch;
    Request recv = link.irecv(&in, 1, previous_rank(link), 4);
    Request send = link.isend(&out, 1, next_rank(link), 4);
    EXPECT_FALSE(link.test(recv));
    EXPECT_FALSE(link.test(send));
    link.wait(recv, "slow byte");
    EXPECT_GE(watch.seconds(), 0.02);
    link.wait(send, "slow byte");
    EXPECT_EQ(in, 1);
  }
}

// A split of an emulated communicator is emulated too, with the same link.
TEST_F(MpiTest, ASplitOfAnEmulatedLinkIsEmulated) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  EmulatedLinkCommunicator link(*comm, LinkEmulation{0.0, 20'000.0});  // 20 ms latency
  link.set_timeout(7.0);
  std::unique_ptr<Communicator> all = link.split(0, rank());
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->timeout(), 7.0);
  const RingTimes t = timed_ring_exchange(*all, 1, 8);
  EXPECT_GE(t.recv, 0.02);
  EXPECT_GE(t.send, 0.02);
}

// A receive posted long before its send completes no earlier than the send could arrive: the
// sender's link takes the message when the send is posted (its start time travels ahead of the
// payload), then size / bandwidth + latency. Rank 0 sends to rank 1 after 50 ms.
TEST_F(MpiTest, AnEarlyReceiveWaitsForTheSendsLink) {
  if (size() == 1) GTEST_SKIP() << "a message to oneself is not delayed";
  EmulatedLinkCommunicator link(*comm, LinkEmulation{0.1, 5'000.0});  // 100 MB/s, 5 ms: 1 MB takes 10 ms + 5 ms
  const size_t bytes = 1'000'000;
  std::vector<uint8_t> buffer = payload(bytes, 0, 7);
  link.barrier();
  const Stopwatch watch;
  if (rank() == 1) {
    std::vector<uint8_t> in(bytes);
    Request recv = link.irecv(in.data(), bytes, 0, 7);
    link.wait(recv, "a late send");
    EXPECT_GE(watch.seconds(), 0.050 + 0.015) << "the receive ended before the send could have arrived";
    EXPECT_TRUE(in == buffer);
  } else if (rank() == 0) {
    while (watch.seconds() < 0.050) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    Request send = link.isend(buffer.data(), bytes, 1, 7);
    link.wait(send, "a late send");
    EXPECT_GE(watch.seconds(), 0.050 + 0.015);
  }
  link.barrier();
}

// The nodes of the ranks: one machine here, the least rank of the node is 0.
TEST_F(MpiTest, EveryRankIsOnTheFirstRanksNode) {
  EXPECT_EQ(comm->node_of_ranks(), std::vector<int>(size_t(size()), 0));
}

// A message to oneself never crosses the network: the link does not delay it. With a latency of
// 1000 s, a delayed message would still be in flight when the loop gives up (a bound that only
// a hang reaches: the message takes microseconds).
TEST_F(MpiTest, MessagesToOneselfAreNotDelayed) {
  EmulatedLinkCommunicator link(*comm, LinkEmulation{0.001, 1e9});  // 1 MB/s, 1000 s
  const std::vector<uint8_t> out = payload(10000, rank(), 6);
  std::vector<uint8_t> in(out.size());
  Request recv = link.irecv(in.data(), in.size(), rank(), 6);
  Request send = link.isend(out.data(), out.size(), rank(), 6);
  bool received = false, sent = false;
  for (const Stopwatch watch; !(received && sent) && watch.seconds() < 60.0;) {
    received = received || link.test(recv);
    sent = sent || link.test(send);
  }
  ASSERT_TRUE(received && sent) << "a message to oneself was delayed by the emulated link";
  EXPECT_TRUE(in == out);
}

}  // namespace
}  // namespace ringattn::comm::testing
