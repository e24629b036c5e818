// `--auto`: the layout, schedule and Ulysses degree the cluster model (cluster_model.hpp,
// hybrid_model.hpp) predicts fastest for one job on the machine it runs on. Pure arithmetic over
// a ClusterSpec, which comes from a calibration file or from what machine_probe.hpp measured at
// start-up; unit-tested on its own.
//
// The block sizes are not among the choices: the kernels' query and key tiles are fixed per
// backend and ISA (64 query rows on the CPU, the CUDA kernels' own), and a ring step's block is a
// rank's whole shard, which the rank count fixes.
#pragma once

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/cli/json.hpp"
#include "launch/plan/hybrid_model.hpp"

namespace ringattn {

// What the user fixed on the command line next to --auto: those stay as given.
struct AutoFixed {
  std::optional<LayoutKind> layout;
  std::optional<Schedule> schedule;
  std::optional<int> ulysses;
};

struct AutoCandidate {
  LayoutKind layout = LayoutKind::contiguous;
  Schedule schedule = Schedule::direct;
  int ulysses = 1;
  HybridPrediction predicted;
  double seconds() const { return predicted.total_seconds(); }  // forward (+ backward when the job has one)
  std::optional<double> measured_s;  // its fastest trial pass, when it was tried (see trial_candidates)
};

struct AutoChoice {
  std::vector<AutoCandidate> candidates;  // in the order they were predicted (the default first)
  size_t best = 0;                        // the fastest that fits in memory: predicted, or measured when tried
  const AutoCandidate& chosen() const { return candidates[best]; }
  // The trials, when there were any: what each timed ("forward" or "forward+backward"), how many
  // rounds over the tried candidates were begun (the last may be cut short by the budget), and
  // their time in all; or why there were none.
  std::string trial_pass, no_trials;
  int trial_rounds = 0;
  double trial_seconds = 0.0;
};

// Every configuration of `w` (its layout and schedule are ignored) for `ranks` ranks that `fixed`
// allows: layouts x schedules x the Ulysses degrees that fit the heads. Where U = P (one group, no
// ring) layout and schedule change nothing: one candidate. The fastest wins; a tie (within 0.5%)
// keeps the earlier candidate, so that the defaults (zigzag when causal, else contiguous; direct;
// U = 1) are chosen when nothing is predicted to beat them.
// `allowed` (when given) drops configurations the job cannot run (a sequence the layout cannot shard).
using AutoAllowed = std::function<bool(LayoutKind, Schedule, int ulysses)>;
AutoChoice choose_configuration(const ClusterSpec& cluster, const Workload& w, const MaskView& mask, int ranks,
                                const AutoFixed& fixed, bool causal, const AutoAllowed& allowed = nullptr);

// The model is trusted where it separates the candidates; where it does not, they are tried: the
// candidates predicted within `margin` of the best (the plan's stated accuracy, 15%), at most
// `most`: the model's best first, then the best of each other Ulysses degree, then the rest by
// prediction; none when only the best is that close. Those that do not fit in memory are never tried.
constexpr double kTrialMargin = 0.15;
std::vector<size_t> trial_candidates(const AutoChoice& choice, double margin = kTrialMargin, size_t most = 4);

// After the trials: the fastest measured becomes the choice when it ran more than
// kTrialHysteresis faster than the model's choice; otherwise the model's choice stays.
constexpr double kTrialHysteresis = 0.05;
void choose_measured(AutoChoice& choice);

// Rank 0's account: where the model's machine came from, each candidate's predicted times, and
// the choice with the reason (its time against the runner-up's and the default's).
void print_auto_choice(std::FILE* out, const AutoChoice& choice, const ClusterSpec& cluster, const std::string& source,
                       bool backward);
Json auto_choice_json(const AutoChoice& choice, const ClusterSpec& cluster, const std::string& source);

}  // namespace ringattn
