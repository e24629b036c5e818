// Where a job computes and how its K/V moves (SPEC.md --backend, --comm): the CPU backend over
// MPI, or the CUDA backend over NCCL (one GPU per rank) or over MPI through pinned host memory
// (ranks sharing GPUs).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "launch/context.hpp"
#include "runtime/backend.hpp"

namespace ringattn {

struct ExecutionChoice {
  std::string backend;  // "cpu" or "cuda"
  std::string comm;     // "mpi" or "nccl"
};

// Validates --backend and --comm against this build and node; empty options take the defaults:
// cuda when a GPU is visible, and with it nccl when every rank of the node has a GPU of its own.
// Throws UsageError naming the option.
ExecutionChoice choose_execution(const std::string& backend_option, const std::string& comm_option,
                                 int64_t head_dim, const LaunchContext& ctx);

struct Execution {
  std::unique_ptr<AttentionBackend> backend;
  std::unique_ptr<comm::Communicator> owned_comm;  // NCCL or host-staged, when used
  comm::Communicator* ring_comm = nullptr;         // what K/V moves over (ctx.world for the CPU)
};

// Builds the backend and the ring's communicator over the ranks of `ranks` (an MPI communicator:
// the job's world, or a benchmark point's sub-communicator); collective over them when NCCL is set
// up. local_rank (the rank's index on its node) picks its GPU when GPUs are shared.
Execution make_execution(const ExecutionChoice& choice, comm::Communicator& ranks, int local_rank, int threads);

}  // namespace ringattn
