// Where a job computes and how its K/V moves (SPEC.md --backend, --comm): the CPU backend over
// MPI, or the CUDA backend over NCCL (one GPU per rank) or over MPI through pinned host memory
// (ranks sharing GPUs).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.hpp"
#include "launch/context.hpp"
#include "ringattn/ringattn.hpp"
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

// Opens the library's context (include/ringattn/ringattn.hpp) over the job's ranks (ctx.world, an
// MPI communicator) with the chosen backend and communicator, the rest from `options`. Collective
// (NCCL is set up here). What usage can cause (e.g. NCCL's placement check: more ranks than GPUs)
// becomes UsageError naming --backend and --comm; a communication fault stays CommError (exit 4).
void open_context(std::optional<Context>& api, const LaunchContext& ctx, const ExecutionChoice& choice,
                  ContextOptions options);

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
