// Where the NCCL communicator puts each rank. A plain function, unit-tested on the CPU
// (tests/comm/test_nccl_schedule.cpp).
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
                             "(run at most " + std::to_string(devices) + " ranks per node, or use the MPI transport)");
  return local_rank;
}

}  // namespace ringattn::comm
