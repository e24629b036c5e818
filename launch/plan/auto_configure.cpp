#include "launch/plan/auto_configure.hpp"

#include <algorithm>
#include <cstdio>

#include "launch/cli/options_util.hpp"
#include "launch/plan/cluster_file.hpp"
#include "launch/plan/machine_probe.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/errors.hpp"
#include "runtime/session.hpp"
#include "util/stopwatch.hpp"

namespace po = boost::program_options;

namespace ringattn {

void add_auto_options(po::options_description& run, AutoOptions& o) {
  run.add_options()
      ("auto", po::bool_switch(&o.enabled),
       "choose --layout, --schedule and --ulysses (those not given) by the cluster model's predicted time, "
       "trying the candidates it cannot tell apart; prints each candidate's times")
      ("calibration", po::value(&o.calibration)->value_name("FILE.json"),
       "--auto: the machine to predict with (ringattn plan --save-calibration, or a --cluster file); "
       "default: measured at start-up")
      ("auto-budget", po::value(&o.budget_s)->default_value(10.0, "10")->value_name("SECONDS"),
       "--auto: time for measuring this machine at start-up (without --calibration) and for trying the "
       "candidates the model cannot tell apart (0 with --calibration: the model alone)");
}

AutoSettings resolve_auto_options(const AutoOptions& o, const po::variables_map& vm) {
  AutoSettings s;
  s.options = o;
  if (!o.enabled) {
    for (const char* name : {"calibration", "auto-budget"})
      if (given(vm, name)) throw usage_error(std::string("--") + name + " has no effect without --auto");
    return s;
  }
  const double floor = o.calibration.empty() ? 0.0 : -1e-12;  // the probe needs time; the model alone does not
  if (!(o.budget_s > floor && o.budget_s <= 600))
    throw usage_error("--auto-budget " + std::to_string(o.budget_s) + ": must be " +
                      (o.calibration.empty() ? "more than 0" : "at least 0") + " and at most 600 seconds");
  if (!o.calibration.empty()) {
    s.machine = read_cluster_file(o.calibration, "--calibration");
    if (s.machine->forward_gflops <= 0)
      throw usage_error("--calibration " + o.calibration + ": needs the kernel rate forward_gflops (or forward_tflops): "
                        "a ringattn plan --save-calibration file");
    if (s.machine->backward_gflops <= 0) s.machine->backward_gflops = 0.8 * s.machine->forward_gflops;
  }
  return s;
}

namespace {

AttentionSpec candidate_spec(const AttentionSpec& job, LayoutKind layout, Schedule schedule, int ulysses) {
  AttentionSpec s = job;
  s.layout = layout_spec(layout_name(layout));  // the command line's one mapping to the spec
  s.schedule = schedule_spec(schedule_name(schedule));
  s.ulysses = ulysses;
  return s;
}

AttentionSpec candidate_spec(const AttentionSpec& job, const AutoCandidate& c) {
  return candidate_spec(job, c.layout, c.schedule, c.ulysses);
}

// The trials: rounds of one pass per close candidate while `budget_s` lasts, timing the job's
// forward and backward when a round of them is predicted to fit, else the forward alone. Rank 0
// decides whether another round fits, from what the rounds so far took; every rank follows.
void try_close_candidates(Session& session, const AutoJob& job, AutoChoice& choice, double budget_s) {
  const std::vector<size_t> close = trial_candidates(choice);
  if (close.empty()) {
    choice.no_trials = "the model separates the candidates (none within " +
                       std::to_string(int(100 * kTrialMargin)) + "% of the best)";
    return;
  }
  double predicted_forward = 0, predicted_total = 0;
  for (size_t i : close) {
    predicted_forward += choice.candidates[i].predicted.forward_seconds();
    predicted_total += choice.candidates[i].seconds();
  }
  const bool backward = job.backward && predicted_total <= budget_s;
  if (!backward && predicted_forward > budget_s) {
    choice.no_trials = "a round of the close candidates' forward passes is predicted to take longer than the " +
                       std::to_string(budget_s).substr(0, 4) + " s left of --auto-budget";
    return;
  }
  choice.trial_pass = backward ? "forward+backward" : "forward";
  Stopwatch clock;
  double predicted_done = 0;  // of the passes tried so far: their time against the model's scales the next
  // One round: a pass of each close candidate, while the next is predicted (the model's time, scaled
  // by what the passes so far took against theirs) to end inside the budget. False when cut short.
  auto round = [&](int r) {
    for (size_t n = 0; n < close.size(); ++n) {
      AutoCandidate& c = choice.candidates[close[n]];
      const double predicted = backward ? c.seconds() : c.predicted.forward_seconds();
      if (r > 0 || n >= 2) {  // the model's best and one other are always tried
        const double elapsed = clock.seconds();
        int go = elapsed + elapsed / predicted_done * predicted <= budget_s;
        session.world().broadcast(&go, sizeof go, 0);
        if (!go) return false;
      }
      choice.trial_rounds = r + 1;  // begun
      const TimedPasses t =
          time_passes(session, job.shard, candidate_spec(job.spec, c), job.seq_len, backward, /*warm_up=*/false);
      const double seconds = backward ? t.total_s() : t.forward_s;
      c.measured_s = c.measured_s ? std::min(*c.measured_s, seconds) : seconds;
      predicted_done += predicted;
    }
    return true;
  };
  constexpr int kMostRounds = 3;  // the fastest of three: enough to see past one disturbed pass
  for (int r = 0; r < kMostRounds && round(r); ++r) {
  }
  choice.trial_seconds = clock.seconds();
  choose_measured(choice);
}

}  // namespace

AutoConfigured configure_automatically(Session& session, const AutoJob& job, const AutoSettings& settings, bool print) {
  const int P = session.size();
  Stopwatch clock;
  ClusterSpec machine;
  std::string source;
  if (settings.machine) {
    machine = *settings.machine;
    source = "--calibration " + settings.options.calibration;
  } else {
    // Half of the budget at most for the machine, the rest for the trials.
    const MachineProbe probe =
        probe_machine(session, job.shard, job.spec, job.seq_len, job.backward, settings.options.budget_s / 2);
    machine = probe.machine;
    source = probe.account;
  }
  // Where the ranks are is known here, whatever the file said: the nodes MPI found.
  const NodeMap& nodes = session.nodes();
  machine.ranks_per_node = 1;
  for (int r = 0; r < P; ++r) machine.ranks_per_node = std::max(machine.ranks_per_node, nodes.local_ranks(r));
  if (nodes.nodes() == 1) machine.ranks_per_node = P;

  Workload w;
  w.batch = job.shard.batch, w.seq_len = job.seq_len, w.heads = job.shard.heads, w.kv_heads = job.shard.kv_heads;
  w.head_dim = job.shard.head_dim, w.dtype_bytes = job.shard.dtype == ElementType::float32 ? 4 : 2;
  w.backward = job.backward;
  const Mask mask = api::build_mask(job.spec, job.seq_len);
  const AutoAllowed runnable = [&](LayoutKind layout, Schedule schedule, int ulysses) {
    return !api::check_call(job.shard, candidate_spec(job.spec, layout, schedule, ulysses), job.seq_len, P);
  };
  AutoChoice choice = choose_configuration(machine, w, mask.view(), P, settings.fixed, job.spec.mask.causal, runnable);
  // Every rank predicted from the same (reduced or read) machine; the trials' list is rank 0's all the same.
  int best = static_cast<int>(choice.best);
  session.world().broadcast(&best, sizeof best, 0);
  choice.best = static_cast<size_t>(best);
  try_close_candidates(session, job, choice, std::max(0.0, settings.options.budget_s - clock.seconds()));
  // The choice everywhere is rank 0's (its measurements decide).
  best = static_cast<int>(choice.best);
  session.world().broadcast(&best, sizeof best, 0);
  choice.best = static_cast<size_t>(best);

  AutoConfigured out;
  out.chosen = choice.chosen();
  out.spec = candidate_spec(job.spec, out.chosen);
  out.json = auto_choice_json(choice, machine, source);
  if (print && session.rank() == 0) {
    print_auto_choice(stdout, choice, machine, source, job.backward);
    std::fflush(stdout);
  }
  return out;
}

}  // namespace ringattn
