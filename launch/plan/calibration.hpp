// Fitting the cluster model to measured benchmark points, and comparing its predictions with
// them (`ringattn plan --calibrate`). Pure arithmetic over what the benchmark measured.
//
// The fit: without waiting, a rank's pass time is kernel time plus host time, which in the model
// is linear in its parameters,
//   time - wait = GFLOP / rate + kernel calls * step_overhead + host bytes / host_copy_gbps
//                 + messages * message_overhead,
// with separate forward and backward rates. The counts on the right come from the same RingPlan
// simulation that predicts (cluster_sim.hpp); the measured means over ranks are on the left. A
// non-negative least-squares fit, weighted for relative error, gives the parameters; the links
// are what the run had (its emulated link, or none), and predictions then include the waiting.
#pragma once

#include <string>
#include <vector>

#include "launch/plan/cluster_model.hpp"
#include "kernels/mask/mask.hpp"

namespace ringattn {

struct MeasuredPoint {
  std::string label;  // where it came from, e.g. "bench.json point 2"
  Workload workload;
  Mask mask;
  int ranks = 1;
  int nodes = 1;          // the nodes its ranks spanned, ranks / nodes on each: between them the machine's inter link
  bool emulated = false;  // run with link emulation over `link` (and the machine's own transport)
  LinkSpec link;
  // Medians over iterations: the slowest rank's time, and means over ranks of each rank's own
  // time and of its time blocked waiting for data. Backward values are 0 when not run.
  double forward_s = 0.0, forward_mean_s = 0.0, forward_wait_s = 0.0;
  double backward_s = 0.0, backward_mean_s = 0.0, backward_wait_s = 0.0;
  double exposed_fraction = 0.0;  // forward, as the benchmark reports it
  // --ulysses U (hybrid_model.hpp): the all-to-all's link inside groups, emulated or the machine's own.
  int ulysses = 1;
  bool group_emulated = false;
  LinkSpec group_link;
};

struct Calibration {
  ClusterSpec machine;  // `start` with the fitted kernel rates and host costs
  int points = 0;       // passes used in the fit
  double rms_relative_residual = 0.0;
};

// Fits forward_gflops, backward_gflops, step_overhead_us, host_copy_gbps and message_overhead_us
// of `start` (whose other fields are kept) to the points; a parameter no point constrains keeps
// its value from `start`. With fit_machine_link, the machine's own link (start.intra: the
// transport between its ranks as the runtime drives it, polling included) is then chosen, its
// bandwidth and latency, to best match the wall times of the points run without emulation.
Calibration calibrate(const std::vector<MeasuredPoint>& points, const ClusterSpec& start, bool fit_machine_link = false);

struct Comparison {
  const MeasuredPoint* point = nullptr;
  Prediction predicted;
  double forward_error = 0.0;   // (predicted - measured) / measured
  double backward_error = 0.0;  // 0 when the point has no backward
  double worst_error() const;   // the larger magnitude of the two
};

// The machine's predictions for the points, each with its own link (emulated, or machine.intra).
std::vector<Comparison> compare(const std::vector<MeasuredPoint>& points, const ClusterSpec& machine);

// `machine` with the point's ranks on its nodes (consecutive ranks on a node, as mpirun places them
// by default: intra link inside, inter between; one node unless the point spanned several); an
// emulated point's links are the slower of the emulated link and the machine's own (a transfer
// completes when both are done).
ClusterSpec machine_for(const ClusterSpec& machine, const MeasuredPoint& p);

// The machine as the point's own run saw it (`plan --calibrate --same-run`): machine_for, with
// the kernel rates of that run, from its time not blocked (each rank's pass time less its waits,
// mean over ranks; with --ulysses, the all-to-alls count as waits), so that the per-call,
// per-message and host-copy costs it includes are set to 0. On a loaded or oversubscribed machine
// (4 ranks on 2 cores run their kernels at about half a core each) a rate fitted to other runs
// misses by the load's change between runs; with each run's own rate, what is compared is the
// model of the links and of the waiting.
ClusterSpec machine_of_run(const ClusterSpec& machine, const MeasuredPoint& p);

// compare() with machine_of_run for each point.
std::vector<Comparison> compare_same_run(const std::vector<MeasuredPoint>& points, const ClusterSpec& machine);

}  // namespace ringattn
