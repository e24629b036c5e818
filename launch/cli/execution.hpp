// Where a job computes and how its K/V moves (docs/reference.md --backend, --comm): the CPU backend over
// MPI, or the CUDA backend over NCCL (one GPU per rank) or over MPI through pinned host memory
// (ranks sharing GPUs). The jobs compute through the runtime's session (runtime/session.hpp), the
// way in that the library's public Context wraps as well: there is no second path.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "launch/cli/context.hpp"
#include "launch/cli/options_util.hpp"
#include "launch/cli/test_seam.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/session.hpp"

namespace ringattn {

struct ExecutionChoice {
  std::string backend;  // "cpu" or "cuda"
  std::string comm;     // "mpi" or "nccl"
};

// Resolves --backend and --comm (empty options take the defaults: cuda when a GPU is visible, and
// with it nccl when every rank of the node has a GPU of its own) and has the library judge them
// against this build and node. Throws ArgumentError.
ExecutionChoice choose_execution(const std::string& backend_option, const std::string& comm_option,
                                 const LaunchContext& ctx);

// The library context's options (include/ringattn/ringattn.hpp) as a job's execution options
// give them: --backend, --comm, --threads (resolved), --timeout, --emulate-bandwidth/-latency,
// and the link inside --ulysses groups (--emulate-intra-bandwidth/-latency).
ContextOptions context_options(const ExecutionChoice& choice, const ExecutionOptions& o, int threads,
                               double emulate_intra_bandwidth = 0.0, double emulate_intra_latency = 0.0);

// The runtime's session over the ranks of `ranks` (an MPI communicator: the job's world, or a
// benchmark point's sub-communicator), with the tests' pretend nodes from the seam; collective
// over them. It builds the backend and the transport (NCCL setup is collective). A setup the node
// refuses (e.g. more ranks than GPUs for NCCL) is an ArgumentError naming --backend and --comm; a
// transport fault (e.g. NCCL's init timed out) stays a Fault (exit 4).
std::unique_ptr<Session> open_session(const comm::Communicator& ranks, const ContextOptions& options,
                                      const TestSeam& seam);

}  // namespace ringattn
