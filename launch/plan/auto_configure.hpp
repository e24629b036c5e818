// `--auto` for the jobs that take it (the attention job and the scaling bench): its options, and
// the collective choice of layout, schedule and Ulysses degree for one job on the ranks it runs on.
//
// The cluster model (auto_choice.hpp) predicts every candidate over a machine from --calibration
// FILE or measured at start-up (machine_probe.hpp). Where it cannot tell the best candidates apart
// (predictions within its stated accuracy of each other), they are tried: one pass each of the
// job's own shape, in rounds while the budget lasts, and the fastest measured wins, as cuDNN's
// benchmark mode and Triton's autotuner settle what a heuristic cannot. Rank 0 prints both.
#pragma once

#include <optional>
#include <string>

#include <boost/program_options.hpp>

#include "launch/cli/json.hpp"
#include "launch/plan/auto_choice.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn {

class Session;

// --auto, --calibration FILE, --auto-budget SECONDS.
struct AutoOptions {
  bool enabled = false;
  std::string calibration;
  double budget_s = 10.0;  // the probe (without --calibration) and the trials
};
void add_auto_options(boost::program_options::options_description& run, AutoOptions& o);

// What --auto takes from the command line, validated: the machine of --calibration FILE (read and
// checked here, before any data moves), the budget. Throws ArgumentError naming the option;
// refuses --calibration and --auto-budget without --auto (they would have no effect).
struct AutoSettings {
  AutoOptions options;
  std::optional<ClusterSpec> machine;  // --calibration's; none: measured at start-up
  AutoFixed fixed;                     // what the command line fixed next to --auto (set by the job)
};
AutoSettings resolve_auto_options(const AutoOptions& o, const boost::program_options::variables_map& vm);

// One job to choose for: its shard (rows not needed), its spec (layout, schedule and Ulysses degree
// are what is chosen), its length, and whether it runs backward.
struct AutoJob {
  Shard shard;
  AttentionSpec spec;
  int64_t seq_len = 0;
  bool backward = false;
};

struct AutoConfigured {
  AttentionSpec spec;  // the job's, with the chosen layout, schedule and ulysses
  AutoCandidate chosen;
  Json json;  // the JSON's "auto": the machine, every candidate (predicted and measured), the choice
};

// Collective over the session's ranks (the probe, the trials): every rank gets rank 0's choice.
// Rank 0 prints the account to stdout when `print`.
AutoConfigured configure_automatically(Session& session, const AutoJob& job, const AutoSettings& settings, bool print);

}  // namespace ringattn
