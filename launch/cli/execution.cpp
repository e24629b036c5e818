#include "launch/cli/execution.hpp"

#include <stdexcept>

#include "comm/mpi_communicator.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/errors.hpp"

namespace ringattn {

ExecutionChoice choose_execution(const std::string& backend_option, const std::string& comm_option,
                                 const LaunchContext& ctx) {
  ExecutionChoice c;
  c.backend = backend_option.empty() ? (cuda_device_available() ? "cuda" : "cpu") : backend_option;
  const bool gpu_per_rank = ctx.local_ranks <= cuda_device_count();
  c.comm = comm_option.empty() ? (c.backend == "cuda" && gpu_per_rank ? "nccl" : "mpi") : comm_option;
  ContextOptions options;
  options.backend = c.backend, options.comm = c.comm;
  if (auto bad = api::check_options(options)) throw *bad;  // the library's judgement of the pair
  if (c.comm == "nccl" && !gpu_per_rank)
    throw usage_error("--comm nccl needs one GPU per rank, but this node runs " + std::to_string(ctx.local_ranks) +
                      " ranks on " + std::to_string(cuda_device_count()) +
                      " GPUs (use --comm mpi to share GPUs, or start fewer ranks per node)");
  return c;
}

ContextOptions context_options(const ExecutionChoice& choice, const ExecutionOptions& o, int threads,
                               double emulate_intra_bandwidth, double emulate_intra_latency) {
  ContextOptions options;
  options.backend = choice.backend;
  options.comm = choice.comm;
  options.threads = threads;
  options.timeout_s = o.timeout;
  options.emulate_bandwidth_gbps = o.emulate_bandwidth;
  options.emulate_latency_us = o.emulate_latency;
  options.emulate_intra_bandwidth_gbps = emulate_intra_bandwidth;
  options.emulate_intra_latency_us = emulate_intra_latency;
  return options;
}

std::unique_ptr<Session> open_session(const comm::Communicator& ranks, const ContextOptions& options,
                                      const TestSeam& seam) {
  const auto* mpi = dynamic_cast<const comm::MpiCommunicator*>(&ranks);
  if (!mpi) throw std::invalid_argument("open_session: a session is built over an MPI communicator");
  try {
    return std::make_unique<Session>(mpi->mpi_comm(), SessionOptions{options, seam.pretend_nodes});
  } catch (const comm::CommError&) {  // e.g. NCCL's init timed out: a fault (exit 4), not bad usage
    throw;
  } catch (const ArgumentError&) {  // names its option already
    throw;
  } catch (const std::runtime_error& e) {  // NCCL's placement check (more ranks than GPUs), no such GPU
    throw usage_error("--backend " + options.backend + " --comm " + options.comm + ": " + e.what());
  }
}

}  // namespace ringattn
