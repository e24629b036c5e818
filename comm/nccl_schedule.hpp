// Where the NCCL communicator puts each rank, and the order in which it sets up its per-pair
// communicators. Plain functions, unit-tested on the CPU (tests/comm/test_nccl_schedule.cpp).
#pragma once

#include <stdexcept>
#include <string>

namespace ringattn::comm {

// The GPU of the rank with node-local index `local_rank` among `local_ranks` ranks on node
// `node` that sees `devices` GPUs: local_rank itself; throws std::runtime_error naming the node
// and the counts when local_ranks > devices (or no GPU is visible).
inline int gpu_for_local_rank(int local_rank, int local_ranks, int devices, const std::string& node) {
  if (devices <= 0)
    throw std::runtime_error("node " + node + ": no CUDA device visible; the NCCL communicator needs one GPU per rank");
  if (local_ranks > devices)
    throw std::runtime_error("node " + node + ": " + std::to_string(local_ranks) + " ranks but " +
                             std::to_string(devices) + " GPUs visible; the NCCL communicator needs one GPU per rank " +
                             "(run at most " + std::to_string(devices) + " ranks per node, or use --comm mpi)");
  return local_rank;
}

// Pair communicators are created and connected in the rounds of a round-robin tournament
// (circle method): in every round each rank works with at most one partner, and the two sides
// of a pair meet in the same round (creating a communicator, and its first transfer, block
// until both sides take part). 2 (P - 1) sequential steps per rank.

// Rounds of the tournament of `ranks` players (one more for an odd count: a bye each round).
inline int round_robin_rounds(int ranks) { return ranks < 2 ? 0 : (ranks % 2 == 0 ? ranks - 1 : ranks); }

// The partner of `rank` in round `round`, or -1 (a bye, or a single rank).
inline int round_robin_partner(int rank, int round, int ranks) {
  if (ranks < 2) return -1;
  const int n = ranks % 2 == 0 ? ranks : ranks + 1;  // with a phantom player n - 1 when odd
  const int m = n - 1;
  int partner;
  if (rank == m) {
    partner = round % m;
  } else if (rank == round % m) {
    partner = m;
  } else {
    partner = ((2 * round - rank) % m + m) % m;  // rank + partner == 2 round (mod m)
  }
  return partner >= ranks ? -1 : partner;
}

}  // namespace ringattn::comm
