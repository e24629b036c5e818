// The all-to-all (Communicator::alltoallv) on 1 to 4 ranks: uneven and empty blocks arrive whole
// and in rank order, through MPI's native collective and through the point-to-point default that
// link emulation selects; a mismatched size list is a CommError.
#include <gtest/gtest.h>

#include <vector>

#include "comm/emulated_link_communicator.hpp"
#include "util/stopwatch.hpp"
#include "tests/support/mpi_test_util.hpp"

namespace ringattn::comm::testing {
namespace {

// Bytes rank `from` sends to rank `to`: uneven, and empty between some pairs.
size_t block_bytes(int from, int to) { return (from + 2 * to) % 3 == 0 ? 0 : size_t(37 * (from + 1) + 1000 * to); }

void check_alltoallv(Communicator& c, int salt) {
  const int n = c.size(), me = c.rank();
  std::vector<size_t> send_bytes(n), recv_bytes(n);
  std::vector<uint8_t> send;
  for (int j = 0; j < n; ++j) {
    send_bytes[j] = block_bytes(me, j);
    recv_bytes[j] = block_bytes(j, me);
    const std::vector<uint8_t> block = payload(send_bytes[j], me, salt + j);
    send.insert(send.end(), block.begin(), block.end());
  }
  size_t total = 0;
  for (size_t b : recv_bytes) total += b;
  std::vector<uint8_t> recv(total, 0);
  c.alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  size_t offset = 0;
  for (int i = 0; i < n; ++i) {
    const std::vector<uint8_t> expected = payload(recv_bytes[i], i, salt + me);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), recv.begin() + offset)) << "block from rank " << i;
    offset += recv_bytes[i];
  }
}

TEST_F(MpiTest, AlltoallvDeliversUnevenBlocksInRankOrder) {
  check_alltoallv(*comm, 0);
  check_alltoallv(*comm, 100);
  EXPECT_EQ(comm->outstanding(), 0u);
}

// Under link emulation the all-to-all goes point to point, so the emulated link delays it.
TEST_F(MpiTest, AlltoallvUnderLinkEmulationIsDelayedAndCorrect) {
  {
    EmulatedLinkCommunicator link(*comm, LinkEmulation{0.0, 20000.0});  // 20 ms per message
    const Stopwatch clock;
    check_alltoallv(link, 7);
    if (size() > 1) {
      EXPECT_GE(clock.seconds(), 0.019);
    }
  }
  EXPECT_EQ(comm->outstanding(), 0u);
}

TEST_F(MpiTest, AlltoallvInASubCommunicator) {
  std::unique_ptr<Communicator> half = comm->split(rank() % 2, rank());
  check_alltoallv(*half, 3);
}

TEST_F(MpiTest, AlltoallvWithTheWrongNumberOfSizesIsACommError) {
  std::vector<size_t> sizes(size() + 1, 0);
  uint8_t dummy = 0;
  EXPECT_THROW(comm->alltoallv(&dummy, sizes, &dummy, sizes), CommError);
}

}  // namespace
}  // namespace ringattn::comm::testing
