#include "launch/execution.hpp"

#include "comm/mpi_communicator.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/errors.hpp"
#if defined(RINGATTN_WITH_CUDA)
#include "kernels/cuda/attention_cuda.hpp"
#endif
#if defined(RINGATTN_WITH_NCCL)
#include "comm/host_staged_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/nccl_communicator.hpp"
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

void open_context(std::optional<Context>& api, const LaunchContext& ctx, const ExecutionChoice& choice,
                  ContextOptions options) {
  const auto* mpi = dynamic_cast<const comm::MpiCommunicator*>(&ctx.world);
  if (!mpi) throw RuntimeFault("a job's context is opened over an MPI communicator");
  options.backend = choice.backend;
  options.comm = choice.comm;
  const std::string flags = "--backend " + choice.backend + " --comm " + choice.comm + ": ";
  try {
    api.emplace(mpi->mpi_comm(), options);
  } catch (const comm::CommError&) {  // e.g. NCCL's init timed out: a fault (exit 4), not bad usage
    throw;
  } catch (const std::runtime_error& e) {  // e.g. NCCL's placement check: more ranks than GPUs
    throw UsageError(flags + e.what());
  } catch (const std::invalid_argument& e) {
    throw UsageError(flags + e.what());
  }
}

Execution make_execution(const ExecutionChoice& choice, comm::Communicator& ranks, int local_rank, int threads) {
  Execution e;
  e.ring_comm = &ranks;
  if (choice.backend == "cpu") {
    e.backend = make_cpu_backend(threads);
    return e;
  }
  int device = local_rank % std::max(1, cuda_device_count());
#if defined(RINGATTN_WITH_NCCL)
  if (choice.comm == "nccl") {
    const auto* mpi = dynamic_cast<const comm::MpiCommunicator*>(&ranks);
    if (!mpi) throw RuntimeFault("--comm nccl: NCCL is set up over an MPI communicator");
    auto nccl = std::make_unique<comm::NcclCommunicator>(mpi->mpi_comm(), ranks.timeout());
    device = nccl->device();
    e.owned_comm = std::move(nccl);
  } else {  // several ranks may share a GPU: device buffers go over MPI through host memory
    e.owned_comm = std::make_unique<comm::HostStagedCommunicator>(ranks);
  }
  e.ring_comm = e.owned_comm.get();
#endif
  e.backend = make_cuda_backend(device);
#if defined(RINGATTN_WITH_NCCL)
  // Steps wait for the kernels issued before them, and later kernels for the steps, on the device.
  if (auto* nccl = dynamic_cast<comm::NcclCommunicator*>(e.owned_comm.get())) nccl->order_after(e.backend->native_stream());
#endif
  return e;
}

}  // namespace ringattn
