// The ringattn command: `ringattn [attention] | layer | bench | plan [options]`, one process per
// rank under mpirun (or alone as one rank). Owns MPI's lifetime and the one top-level handler
// that turns any failure into the exit codes of SPEC.md on every rank.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "launch/attention_job.hpp"
#include "launch/bench.hpp"
#include "launch/context.hpp"
#include "launch/job_control.hpp"
#include "launch/plan_job.hpp"
#include "runtime/errors.hpp"

namespace {

using ringattn::LaunchContext;

int dispatch(LaunchContext& ctx, const std::string& command) {
  if (command == "attention") return ringattn::run_attention(ctx);
  if (command == "bench") return ringattn::run_bench(ctx);
  if (command == "plan") return ringattn::run_plan(ctx);
  throw ringattn::UsageError("unknown subcommand '" + command + "' (expected attention, layer, bench or plan)");
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  // Compute runs in OpenMP regions; only the main thread calls MPI.
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "ringattn: error: MPI could not be initialised\n");
    return ringattn::kExitFault;
  }
  std::unique_ptr<ringattn::comm::Communicator> world = ringattn::comm::make_mpi_communicator(MPI_COMM_WORLD);

  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  LaunchContext ctx{*world, 0, 1, 1, {}};
  MPI_Comm_rank(node, &ctx.local_rank);
  MPI_Comm_size(node, &ctx.local_ranks);
  MPI_Comm_free(&node);
  ctx.hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  std::string command = "attention";
  int first = 1;
  if (argc > 1 && argv[1][0] != '-') {
    command = argv[1];
    first = 2;
  }
  for (int i = first; i < argc; ++i) ctx.args.emplace_back(argv[i]);

  int code = ringattn::kExitOk;
  try {
    code = dispatch(ctx, command);
  } catch (const ringattn::JobFailed& e) {
    code = e.code();  // agreed by every rank and reported once
  } catch (const std::exception& e) {
    // Not agreed: other ranks may be waiting on this one, so end them all.
    ringattn::fail_now(*world, e);
  }
  world.reset();
  MPI_Finalize();
  return code;
}
