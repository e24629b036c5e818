// Helpers around Boost.Program_options shared by the subcommands.
#pragma once

#include <boost/program_options.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "ringattn/ringattn.hpp"
#include "util/dtype.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

// Parses args against desc (no positional arguments); unknown options, bad values and empty
// strings become ArgumentError with the option's name and a pointer to --help.
boost::program_options::variables_map parse_options(const boost::program_options::options_description& desc,
                                                    const std::vector<std::string>& args,
                                                    const std::string& command);

// One "name=value" line per option, sorted: what the ranks compare to agree on their configuration.
std::string canonical_options(const boost::program_options::variables_map& vm);

// Rank 0's canonical options are sent to every rank; a rank whose options differ throws
// ArgumentError naming the first differing option (call inside an agreed phase).
void agree_on_options(comm::Communicator& comm, const std::string& canonical);

// --dtype fp32|bf16; throws ArgumentError naming --dtype.
DType parse_dtype_option(const std::string& name);
// A comma-separated list of fp32 and bf16 (the benchmarks' --dtypes); ArgumentError naming `option`.
std::vector<DType> parse_dtype_list(const std::string& text, const std::string& option);

// --layout and --schedule as the library's AttentionSpec takes them ("" layout: automatic).
SequenceLayout layout_spec(const std::string& name);
KeyValueSchedule schedule_spec(const std::string& name);
AttentionKernel kernel_spec(const std::string& name);  // --kernel auto|cudnn|own

// --layout, or its default when empty: zigzag when causal (balances causal work), else contiguous.
LayoutKind layout_option(const std::string& name, bool causal);

// The first "name=value" line where this rank's `lines` differ from rank 0's (collective: rank 0
// broadcasts its lines). A name missing on one side reads "(not given)".
struct Difference {
  std::string name, on_rank0, here;
};
std::optional<Difference> differs_from_rank0(comm::Communicator& comm, const std::string& lines);

// Parses args on every rank, then compares them with rank 0's, each an agreed phase (see
// job_control.hpp), so that every rank takes part in every collective even when its own command
// line is the one that fails. Throws JobFailed (already reported) on any rank's error.
boost::program_options::variables_map parse_and_agree(comm::Communicator& comm,
                                                      const boost::program_options::options_description& desc,
                                                      const std::vector<std::string>& args, const std::string& command);

// Where the options of the ring's execution are stored by a subcommand. Null members are options
// that subcommand does not have (the layer runs on the CPU only: no --backend, --comm).
struct RingOptionFields {
  std::string* layout = nullptr;
  std::string* schedule = nullptr;
  std::string* dtype = nullptr;
  std::string* backend = nullptr;
  std::string* comm = nullptr;
  std::string* kernel = nullptr;
  bool* deterministic = nullptr;
  int* threads = nullptr;
  double* timeout = nullptr;
  double* emulate_bandwidth = nullptr;
  double* emulate_latency = nullptr;
  int* iters = nullptr;   // timed repetitions; the default is the value it holds
  int* warmup = nullptr;  // untimed repetitions first; likewise
};

// --layout, --schedule, --dtype, --backend, --comm, --kernel, --deterministic, --threads,
// --timeout, the link emulation
// (--emulate-bandwidth, --emulate-latency), --iters and --warmup, declared once for every
// subcommand that runs the ring, with the same defaults and help.
void add_ring_options(boost::program_options::options_description& desc, const RingOptionFields& f);

// The values of those options, with their defaults: the options of every subcommand that runs the
// ring derive from it (a subcommand may change the defaults of --iters and --warmup).
struct ExecutionOptions {
  std::string layout, schedule = "direct", dtype = "fp32", backend, comm, kernel = "auto";
  bool deterministic = false;
  int threads = 0;
  double timeout = 300.0, emulate_bandwidth = 0.0, emulate_latency = 0.0;
  int iters = 1, warmup = 0;

  // Every one of them, for add_ring_options (a subcommand without some sets those to null).
  RingOptionFields fields() {
    return {&layout,  &schedule, &dtype,          &backend,          &comm,           &kernel, &deterministic,
            &threads, &timeout,  &emulate_bandwidth, &emulate_latency, &iters,        &warmup};
  }
};

// Checks what only the command line has (--iters, --warmup) alike for every subcommand; the
// library judges the rest (api::check_options of context_options). Throws ArgumentError naming the
// option. (The options a subcommand lacks hold their defaults, which pass.)
void check_execution_options(const ExecutionOptions& o);

// Hybrid parallelism (docs/hybrid.md): --ulysses and the intra-group link
// emulation (--emulate-intra-bandwidth, --emulate-intra-latency); null members are left out.
void add_hybrid_options(boost::program_options::options_description& desc, int* ulysses,
                        double* emulate_intra_bandwidth, double* emulate_intra_latency);

// True when the user gave the option (not only its default).
inline bool given(const boost::program_options::variables_map& vm, const char* name) {
  return vm.count(name) && !vm[name].defaulted();
}

}  // namespace ringattn
