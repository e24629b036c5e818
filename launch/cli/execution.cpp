#include "launch/cli/execution.hpp"

#include <stdexcept>

#include "comm/mpi_communicator.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/errors.hpp"
#if defined(RINGATTN_WITH_CUDA)
#include "kernels/cuda/attention_cuda.hpp"
#endif

namespace ringattn {

ExecutionChoice choose_execution(const std::string& backend_option, const std::string& comm_option,
                                 int64_t head_dim, const LaunchContext& ctx) {
  ExecutionChoice c;
  c.backend = backend_option.empty() ? (cuda_device_available() ? "cuda" : "cpu") : backend_option;
  if (c.backend != "cpu" && c.backend != "cuda")
    throw UsageError("--backend " + backend_option + ": expected cpu or cuda");
  if (c.backend == "cuda") {
#if defined(RINGATTN_WITH_CUDA)
    if (!cuda_device_available()) throw UsageError("--backend cuda: no GPU is visible on this node");
    if (!kernels::cuda_supports_head_dim(head_dim))
      throw UsageError("--backend cuda: head dim " + std::to_string(head_dim) + " is not supported (1 to 256)");
#else
    (void)head_dim;
    throw UsageError("--backend cuda: this build has no CUDA backend (nvcc and NCCL were not found when it was built)");
#endif
  }
  const bool gpu_per_rank = ctx.local_ranks <= cuda_device_count();
  c.comm = comm_option.empty() ? (c.backend == "cuda" && gpu_per_rank ? "nccl" : "mpi") : comm_option;
  if (c.comm != "mpi" && c.comm != "nccl") throw UsageError("--comm " + comm_option + ": expected mpi or nccl");
  if (c.comm == "nccl") {
    if (c.backend != "cuda") throw UsageError("--comm nccl needs --backend cuda (NCCL moves device memory)");
#if !defined(RINGATTN_WITH_NCCL)
    throw UsageError("--comm nccl: this build has no NCCL communicator");
#endif
    if (!gpu_per_rank)
      throw UsageError("--comm nccl needs one GPU per rank, but this node runs " + std::to_string(ctx.local_ranks) +
                       " ranks on " + std::to_string(cuda_device_count()) +
                       " GPUs (use --comm mpi to share GPUs, or start fewer ranks per node)");
  }
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

std::unique_ptr<Context> open_context(const comm::Communicator& ranks, const ContextOptions& options) {
  const auto* mpi = dynamic_cast<const comm::MpiCommunicator*>(&ranks);
  if (!mpi) throw RuntimeFault("the library's context is built over an MPI communicator");
  const std::string what = "--backend " + options.backend + " --comm " + options.comm + ": ";
  try {
    return std::make_unique<Context>(mpi->mpi_comm(), options);
  } catch (const comm::CommError&) {  // e.g. NCCL's init timed out: a fault (exit 4), not bad usage
    throw;
  } catch (const UsageError&) {  // names its option already (RINGATTN_TEST_NODES), not the backend's
    throw;
  } catch (const std::runtime_error& e) {  // e.g. NCCL's placement check: more ranks than GPUs
    throw UsageError(what + e.what());
  } catch (const std::invalid_argument& e) {  // ArgumentError: an option the context refused
    throw UsageError(what + e.what());
  }
}

}  // namespace ringattn
