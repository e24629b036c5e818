// Helpers of the communicator tests: a fresh communicator per test, and payloads whose every
// byte says who sent it, so a message delivered to the wrong receive cannot pass.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/mpi_communicator.hpp"

namespace ringattn::comm::testing {

// Byte i of message `salt` from rank `from`.
inline uint8_t payload_byte(size_t i, int from, int salt) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + uint64_t(from + 1) * 0xBF58476D1CE4E5B9ull +
               uint64_t(salt + 1) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return uint8_t(x >> 24);
}

inline std::vector<uint8_t> payload(size_t bytes, int from, int salt) {
  std::vector<uint8_t> p(bytes);
  for (size_t i = 0; i < bytes; ++i) p[i] = payload_byte(i, from, salt);
  return p;
}

inline int next_rank(const Communicator& c) { return (c.rank() + 1) % c.size(); }
inline int previous_rank(const Communicator& c) { return (c.rank() + c.size() - 1) % c.size(); }

// Each rank sends `bytes` to the next rank and receives from the previous one, and checks what
// arrived. The tag doubles as the payload's salt.
inline void ring_exchange(Communicator& c, size_t bytes, int tag) {
  const std::vector<uint8_t> out = payload(bytes, c.rank(), tag);
  std::vector<uint8_t> in(bytes, 0);
  Request recv = c.irecv(in.data(), bytes, previous_rank(c), tag);
  Request send = c.isend(out.data(), bytes, next_rank(c), tag);
  c.wait(recv, "ring exchange");
  c.wait(send, "ring exchange");
  EXPECT_FALSE(recv.valid());
  EXPECT_FALSE(send.valid());
  EXPECT_TRUE(in == payload(bytes, previous_rank(c), tag)) << bytes << " bytes, tag " << tag;
}

// A communicator over MPI_COMM_WORLD for each test, with a short timeout, so that a test gone
// wrong on one rank fails the others in seconds instead of hanging them.
class MpiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    comm->set_timeout(10.0);
  }
  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }

  std::unique_ptr<MpiCommunicator> comm;
};

}  // namespace ringattn::comm::testing
