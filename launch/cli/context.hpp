// What every subcommand gets from main(): the world communicator and where this rank sits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "launch/cli/test_seam.hpp"

namespace ringattn {

struct LaunchContext {
  comm::Communicator& world;
  const TestSeam& seam;  // the tests' seam, read once at start-up (empty outside tests)
  int local_rank = 0;   // among the ranks on this node
  int local_ranks = 1;  // ranks on this node
  int nodes = 1;        // nodes the job spans (MPI_Comm_split_type, as local_rank)
  int hardware_threads = 1;  // the node's
  int affinity_cpus = 1;     // those this rank may run on (launch/cli/cpu_binding.hpp)
  std::vector<std::string> args;  // the subcommand's arguments (without the program and subcommand names)

  // Default --threads: the cores this rank may run on, at most the node's hardware threads shared
  // among its ranks (unbound ranks share the node; a rank bound to fewer cores gets those).
  int default_threads() const {
    return std::max(1, std::min(affinity_cpus, hardware_threads / std::max(1, local_ranks)));
  }
};

// Writes text to path atomically (temporary file, then rename); throws ArgumentError/Fault naming `label`.
void write_text_file(const std::string& path, const std::string& label, const std::string& text);

// Peak resident memory of this process, bytes.
uint64_t peak_rss_bytes();

}  // namespace ringattn
