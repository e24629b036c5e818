// The options of `ringattn attention` and the job they describe, resolved and validated: every
// bad value, bad input file and unsupported combination is refused here with an ArgumentError that
// names the option or file (docs/reference.md "Exit codes"), before any data moves. The values the library
// takes are judged by the library (runtime/api/arguments.hpp) and named by the command line's
// table (launch/cli/argument_names.hpp).
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "kernels/attention.hpp"
#include "launch/cli/context.hpp"
#include "launch/cli/execution.hpp"
#include "launch/cli/mask_options.hpp"
#include "launch/cli/options_util.hpp"
#include "launch/plan/auto_configure.hpp"
#include "kernels/mask/mask.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/io/npy.hpp"
#include "runtime/ring_plan.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

struct Options : ExecutionOptions {
  std::string q, k, v, dout;
  std::string out, lse, dq, dk, dv;
  int64_t seq_len = 8192, batch = 1, heads = 8, kv_heads = 0, head_dim = 128;
  uint64_t seed = 0;
  double scale = 0.0;
  bool backward = false;
  MaskOptions mask;
  bool check = false;
  int check_rows = 16;
  bool check_finite = false, no_check_finite = false;
  std::string json;
  bool progress = false;
  int ulysses = 1;  // hybrid parallelism: all-to-all inside groups of U ranks, the ring across
  double emulate_intra_bandwidth = 0.0, emulate_intra_latency = 0.0;
  // --auto: layout, schedule and Ulysses degree from the cluster model (launch/plan/auto_configure.hpp).
  AutoOptions auto_options;
};

// Every option, with its default, bound to `o`.
boost::program_options::options_description describe_attention_options(Options& o);

// Everything the job needs, resolved and validated.
struct Job {
  Options opt;
  int64_t seq_len = 0;
  bool files = false;
  bool backward = false;
  // What the job computes, as the library takes it (shard.rows: 0, every rank's comes with the plan).
  AttentionSpec spec;
  Shard shard;
  ContextOptions context;  // backend, comm, threads (resolved), timeout, link emulation
  std::optional<NpyInfo> q_info, k_info, v_info, dout_info;
  AutoSettings auto_settings;  // --auto: the file's machine, the budget, what the command line fixed

  DType dtype() const { return api::dtype_of(shard.dtype); }
  int threads() const { return context.threads; }
  // The shapes and scale the kernels and the check work with.
  kernels::AttentionDims dims() const;
};

// The command line's names for the arguments whose values come from the input files, when they
// do (the heads of --q FILE, not --heads), for ArgumentNames.
std::map<std::string, std::string, std::less<>> file_argument_names(const Options& o);

// Validates the options and inspects the input files' headers (reading no data); the library
// judges the shard and the spec (api::check_*). Throws ArgumentError.
Job resolve_attention_job(const Options& o, const boost::program_options::variables_map& vm, const LaunchContext& ctx);

// Shape (B, L, heads, D) of a Q/K/V/dO file: 4-D, or 3-D with B = 1.
std::vector<int64_t> as_bshd(const NpyInfo& info);

// What every rank must agree on beyond its options ("name=value" lines): the shapes and dtypes
// it read from the files and a digest of its mask.
std::string resolved_lines(const Job& job, const Mask& mask);

}  // namespace ringattn
