// Which cores a rank may run on (its CPU affinity, as mpirun or taskset bound it) and what that
// means for --threads: threads beyond those cores share them and run slower, so the default stays
// within them and an explicit --threads beyond them is warned about (README "Threads and binding").
#pragma once

#include "comm/communicator.hpp"

namespace ringattn {

struct LaunchContext;

// CPUs in this process's affinity mask (sched_getaffinity); `fallback` when it cannot be read.
int cpus_in_affinity(int fallback);

// Collective over `comm`. Rank 0 prints one warning when `threads` exceeds the cores of some rank
// (naming the rank, its cores and the mpirun options that give each rank a core per thread), or,
// when --threads was not given and a binding held the default below the node's share, one note
// saying so.
void report_thread_binding(comm::Communicator& comm, int threads, bool threads_given, const LaunchContext& ctx);

}  // namespace ringattn
