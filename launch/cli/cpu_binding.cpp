#include "launch/cli/cpu_binding.hpp"

#include <sched.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "launch/cli/context.hpp"

namespace ringattn {

int cpus_in_affinity(int fallback) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return fallback;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : fallback;
}

namespace {

std::string cores(int n) { return std::to_string(n) + (n == 1 ? " core" : " cores"); }

// The smallest value over the ranks, and the lowest rank holding it.
std::pair<int, int> smallest(comm::Communicator& comm, int value) {
  int least = value;
  comm.allreduce(&least, 1, DType::i32, comm::ReduceOp::min);
  int who = value == least ? comm.rank() : INT_MAX;
  comm.allreduce(&who, 1, DType::i32, comm::ReduceOp::min);
  return {least, who};
}

}  // namespace

void report_thread_binding(comm::Communicator& comm, int threads, bool threads_given, const LaunchContext& ctx) {
  const int own = ctx.affinity_cpus;
  const bool short_of_cores = threads > own;
  // A rank confined to fewer cores than the node has: mpirun's binding (or taskset), which a
  // different mapping lifts; otherwise the node itself has too few cores.
  int bound = short_of_cores && own < ctx.hardware_threads;
  comm.allreduce(&bound, 1, DType::i32, comm::ReduceOp::max);
  const auto [least, who] = smallest(comm, short_of_cores ? own : INT_MAX);
  // The default was held below the node's share of cores by the launcher's binding (not by a
  // container's CPU set, which a different mapping would not lift: only under a launcher).
  const bool launched =
      std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("SLURM_STEP_ID");
  int held = launched && !threads_given && own < ctx.hardware_threads / std::max(1, ctx.local_ranks);
  comm.allreduce(&held, 1, DType::i32, comm::ReduceOp::max);
  if (comm.rank() != 0) return;
  const int share = std::max(1, ctx.hardware_threads / std::max(1, ctx.local_ranks));
  if (least != INT_MAX) {
    std::string text = "--threads " + std::to_string(threads) + " but rank " + std::to_string(who) +
                       " may run on only " + cores(least);
    if (bound)
      text += " (its CPU affinity, as mpirun or taskset set it): its threads share " +
              std::string(least == 1 ? "it" : "them") + " and run slower. Give each rank a core per thread: " +
              "mpirun --map-by slot:PE=" + std::to_string(threads) + " --bind-to core, or mpirun --bind-to none";
    else
      text += " (all this node has): its threads share them and run slower";
    std::fprintf(stderr, "ringattn: warning: %s\n", text.c_str());
  } else if (held) {
    std::fprintf(stderr,
                 "ringattn: note: each rank runs %d thread%s, on the %s its CPU affinity allows (the launcher's "
                 "binding); for %d per rank: mpirun --map-by slot:PE=%d --bind-to core, or mpirun --bind-to none\n",
                 threads, threads > 1 ? "s" : "", cores(threads).c_str(), share, share);
  }
  std::fflush(stderr);
}

}  // namespace ringattn
