// What MpiCommunicator::progress() costs, against a bare MPI_Test on a pending request in the same
// run (docs/benchmarks.md). The ring's compute loops call progress() between tiles, so it must cost
// about what one pass of MPI's progress engine costs: the ratio says how much the communicator adds
// to it. Times are the fastest of 20 batches (a rank descheduled for a while slows some batches, not
// all). Not a test: its timings need a quiet machine (the functional checks are in
// test_mpi_communicator.cpp).
//   mpirun -np 2 build/ringattn_comm_progress_bench [calls_per_batch]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "comm/mpi_communicator.hpp"
#include "util/stopwatch.hpp"

namespace {

constexpr int kBatches = 20;

// Seconds per call of `call`, the fastest batch.
template <class Call>
double fastest_per_call(int calls, Call call) {
  double best = 1e30;
  for (int b = 0; b < kBatches; ++b) {
    const ringattn::Stopwatch watch;
    for (int i = 0; i < calls; ++i) call();
    best = std::min(best, watch.seconds() / calls);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int calls = argc > 1 ? std::atoi(argv[1]) : 20000;
  {
    ringattn::comm::MpiCommunicator comm(MPI_COMM_WORLD);
    const int peer = (comm.rank() + 1) % comm.size();
    const double idle = fastest_per_call(calls, [&] { comm.progress(); });

    // A receive that stays pending until the end: the communicator's, then MPI's own.
    uint8_t byte = 0, one = 1;
    ringattn::comm::Request recv = comm.irecv(&byte, 1, peer, 10);
    const double outstanding = fastest_per_call(calls, [&] { comm.progress(); });
    MPI_Request raw;
    uint8_t raw_byte = 0;
    MPI_Irecv(&raw_byte, 1, MPI_BYTE, peer, 11, MPI_COMM_WORLD, &raw);
    int flag = 0;
    const double bare = fastest_per_call(calls, [&] { MPI_Test(&raw, &flag, MPI_STATUS_IGNORE); });

    comm.barrier();
    ringattn::comm::Request send = comm.isend(&one, 1, (comm.rank() + comm.size() - 1) % comm.size(), 10);
    MPI_Send(&one, 1, MPI_BYTE, (comm.rank() + comm.size() - 1) % comm.size(), 11, MPI_COMM_WORLD);
    MPI_Wait(&raw, MPI_STATUS_IGNORE);
    comm.wait(recv, "progress bench");
    comm.wait(send, "progress bench");
    if (comm.rank() == 0) {
      std::printf("# MpiCommunicator::progress() against a bare MPI_Test, %d ranks, fastest of %d batches of %d calls\n",
                  comm.size(), kBatches, calls);
      std::printf("# %-24s %10s %8s\n", "case", "us/call", "vs_test");
      std::printf("  %-24s %10.3f %7.2fx\n", "nothing outstanding", idle * 1e6, idle / bare);
      std::printf("  %-24s %10.3f %7.2fx\n", "a receive outstanding", outstanding * 1e6, outstanding / bare);
      std::printf("  %-24s %10.3f %7.2fx\n", "bare MPI_Test", bare * 1e6, 1.0);
    }
  }
  MPI_Finalize();
  return 0;
}
