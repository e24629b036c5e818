// Checks of Communicator::post_step/wait_step shared by every transport's tests: steps posted
// back to back before any is waited for, empty steps on some ranks, several transfers between
// one pair in one step (matched in the order listed), and every payload checked byte by byte.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "tests/support/mpi_test_util.hpp"

namespace ringattn::comm::testing {

// `steps` steps. Step s: every rank sends a message of size(s) to the next rank and receives one
// from the previous; on even steps a second, shorter message follows in the same step; every
// third step nobody moves anything (an empty step, still posted). Buffers are host vectors (the
// emulated device memory is host memory too).
inline void step_exchange(Communicator& c, int steps) {
  const int next = next_rank(c), previous = previous_rank(c);
  auto size_of = [](int s, int part) { return size_t(1000 + 37 * s) / size_t(part + 1); };
  std::vector<std::vector<uint8_t>> out(size_t(2 * steps)), in(size_t(2 * steps));
  std::vector<StepHandle> handles;
  const int64_t first = c.steps_posted();
  for (int s = 0; s < steps; ++s) {
    std::vector<StepTransfer> t;
    if (s % 3 != 2)
      for (int part = 0; part < (s % 2 == 0 ? 2 : 1); ++part) {
        const size_t i = size_t(2 * s + part);
        out[i] = payload(size_of(s, part), c.rank(), int(i));
        in[i].assign(size_of(s, part), 0);
        t.push_back(StepTransfer::send(out[i].data(), out[i].size(), next));
        t.push_back(StepTransfer::recv(in[i].data(), in[i].size(), previous));
      }
    handles.push_back(c.post_step(t));
  }
  EXPECT_EQ(c.steps_posted(), first + steps);
  for (int s = 0; s < steps; ++s) c.wait_step(handles[size_t(s)], "step " + std::to_string(s));
  for (int s = 0; s < steps; ++s) {
    EXPECT_FALSE(handles[size_t(s)].valid());
    for (int part = 0; part < 2; ++part) {
      const size_t i = size_t(2 * s + part);
      if (!in[i].empty()) {
        EXPECT_TRUE(in[i] == payload(in[i].size(), previous, int(i))) << "step " << s << " part " << part;
      }
    }
  }
}

}  // namespace ringattn::comm::testing
