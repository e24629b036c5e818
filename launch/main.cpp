// The ringattn command: `ringattn [attention] | layer | decode | bench | plan [options]`, one process per
// rank under mpirun (or alone as one rank). Owns MPI's lifetime and the one top-level handler
// that turns any failure into the exit codes of docs/reference.md on every rank.
//
// Signals. SIGINT, SIGTERM and SIGHUP end the process at once, whatever it is doing (computing,
// waiting on a peer, writing): the handler removes the temporary output files this rank created
// (runtime/io/temp_files.hpp), rank 0 prints one line, and the signal is raised again with its
// default action, so the process dies of it (a shell sees 128 + signal: 130 for SIGINT, 143 for
// SIGTERM). mpirun, given SIGINT or SIGTERM, sends SIGTERM to every rank, and it ends the job
// (signalling every rank) when one dies of a signal, so no process is left; an output never
// appears at its final path unless every rank finished it. SIGXFSZ is ignored, so that a write beyond the file size
// limit (ulimit -f) fails with EFBIG and is reported (exit code 4) instead of killing the rank.
#include <mpi.h>
#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "launch/attention/attention_job.hpp"
#include "launch/bench/bench.hpp"
#include "launch/decode/decode_job.hpp"
#include "launch/cli/context.hpp"
#include "launch/cli/cpu_binding.hpp"
#include "launch/cli/job_control.hpp"
#include "launch/layer/layer_job.hpp"
#include "launch/cli/options_util.hpp"
#include "launch/plan/plan_job.hpp"
#include "runtime/errors.hpp"
#include "runtime/io/temp_files.hpp"
#include "runtime/placement.hpp"

namespace {

using ringattn::LaunchContext;

int dispatch(LaunchContext& ctx, const std::string& command) {
  if (command == "attention") return ringattn::run_attention(ctx);
  if (command == "layer") return ringattn::run_layer(ctx);
  if (command == "bench") return ringattn::run_bench(ctx);
  if (command == "plan") return ringattn::run_plan(ctx);
  if (command == "decode") return ringattn::run_decode(ctx);
  // Every rank has the same command (agree_to_start): refuse it together, reported once.
  ringattn::agreed_phase(ctx.world, [&] {
    throw ringattn::usage_error("unknown subcommand '" + command + "' (expected attention, layer, bench, plan or decode)");
  });
  return ringattn::kExitUsage;
}

// ---- signals (see the top of this file) ----

pthread_t main_thread;
const char* signal_who = "";  // "rank 0 ", or "" for a job of one rank; only rank 0 reports
bool signal_reports = true;

void write_stderr(const char* text) {
  for (size_t left = std::strlen(text); left > 0;) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n, left -= static_cast<size_t>(n);
  }
}

// Async-signal-safe: atomics, unlink, write, sigaction, raise, pthread_self/pthread_kill.
extern "C" void on_terminating_signal(int sig) {
  // The main thread registers the temporary files; run there, so none is half-registered.
  if (!pthread_equal(pthread_self(), main_thread)) {
    pthread_kill(main_thread, sig);
    return;
  }
  const int removed = ringattn::temp_files::remove_all();
  if (signal_reports) {
    // mpirun forwards the user's signal, and also sends SIGTERM when it ends a job after a
    // rank failed (whose message came first): the line says what happened, not why.
    write_stderr("ringattn: ");
    write_stderr(signal_who);
    write_stderr(sig == SIGINT ? "got SIGINT" : sig == SIGTERM ? "got SIGTERM" : "got SIGHUP");
    write_stderr(removed ? ": ending the job; its unfinished outputs were removed\n" : ": ending the job\n");
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);  // delivered when this handler returns: the process dies of the signal
}

void install_signal_handlers(int rank, int ranks) {
  main_thread = pthread_self();
  signal_who = ranks > 1 ? "rank 0 " : "";
  signal_reports = rank == 0;
  struct sigaction sa {};
  sa.sa_handler = on_terminating_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sa.sa_mask, sig);  // one handler at a time
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

// Before any work, in agreed phases: every rank runs rank 0's subcommand, and the environment
// each rank reads (RINGATTN_ISA, the tests' seam) is valid there.
void agree_to_start(ringattn::comm::Communicator& world, const std::string& command, ringattn::TestSeam& seam) {
  // (Each an agreed phase of its own: a phase that fails on one rank must not skip a collective
  // the others make.)
  ringattn::agreed_phase(world, [&] { seam = ringattn::TestSeam::from_environment(world.rank(), world.size()); });
  ringattn::agreed_phase(world, [&] {
    if (auto d = ringattn::differs_from_rank0(world, "subcommand=" + command + "\n"))
      throw ringattn::usage_error("the ranks were started with different subcommands: '" + d->on_rank0 +
                                 "' on rank 0 but '" + d->here + "' on rank " + std::to_string(world.rank()));
    // A bad RINGATTN_ISA is bad usage (exit 2), not a fault met later inside a kernel call.
    try {
      ringattn::kernels::cpu_isa();
    } catch (const std::invalid_argument& e) {
      throw ringattn::usage_error(e.what());
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  // Before MPI starts: it writes files too (shared-memory segments), and a limit they exceed
  // should be an error there, not a death by SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  int provided = 0;
  // Compute runs in OpenMP regions; only the main thread calls MPI.
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "ringattn: error: MPI could not be initialised\n");
    return ringattn::kExitFault;
  }
  std::unique_ptr<ringattn::comm::Communicator> world = ringattn::comm::make_mpi_communicator(MPI_COMM_WORLD);
  install_signal_handlers(world->rank(), world->size());

  ringattn::TestSeam seam;
  LaunchContext ctx{*world, seam};
  ctx.hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ctx.affinity_cpus = ringattn::cpus_in_affinity(ctx.hardware_threads);

  std::string command = "attention";
  int first = 1;
  if (argc > 1 && argv[1][0] != '-') {
    command = argv[1];
    first = 2;
  }
  for (int i = first; i < argc; ++i) ctx.args.emplace_back(argv[i]);

  int code = ringattn::kExitOk;
  try {
    const ringattn::NodeMap nodes = ringattn::find_nodes(*world);  // a bounded collective
    ctx.local_rank = nodes.local_rank(world->rank());
    ctx.local_ranks = nodes.local_ranks(world->rank());
    ctx.nodes = nodes.nodes();
    agree_to_start(*world, command, seam);
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
