#include "launch/plan/calibration.hpp"
#include "launch/plan/hybrid_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

#include "launch/plan/cluster_sim.hpp"

namespace ringattn {

namespace {

constexpr int kParams = 5;  // s/GFLOP forward, s/GFLOP backward, s per kernel call, s per GB, s per message
using Features = std::array<double, kParams>;

struct Observation {
  Features x{};
  double y = 0.0;  // measured kernel + host seconds (mean over ranks)
};

// Non-negative least squares by cyclic coordinate descent on the normal equations, columns scaled
// to unit norm; each observation is weighted by 1 / y so that the fit minimises relative error.
// Columns that no observation touches are left out (their parameter stays `fallback`).
Features fit_nonnegative(const std::vector<Observation>& obs, const Features& fallback) {
  Features scale{};
  for (const Observation& o : obs)
    for (int j = 0; j < kParams; ++j) scale[j] += (o.x[j] / o.y) * (o.x[j] / o.y);
  for (double& s : scale) s = std::sqrt(s);
  std::array<std::array<double, kParams>, kParams> G{};
  Features h{};
  for (const Observation& o : obs)
    for (int j = 0; j < kParams; ++j) {
      if (scale[j] == 0) continue;
      const double xj = o.x[j] / o.y / scale[j];
      h[j] += xj;  // y / y = 1
      for (int k = 0; k < kParams; ++k)
        if (scale[k] > 0) G[j][k] += xj * (o.x[k] / o.y / scale[k]);
    }
  Features z{};
  for (int sweep = 0; sweep < 20000; ++sweep)
    for (int j = 0; j < kParams; ++j) {
      if (scale[j] == 0 || G[j][j] <= 0) continue;
      double g = h[j];
      for (int k = 0; k < kParams; ++k) g -= G[j][k] * z[k];
      z[j] = std::max(0.0, z[j] + g / G[j][j]);
    }
  Features theta{};
  for (int j = 0; j < kParams; ++j) theta[j] = scale[j] > 0 ? z[j] / scale[j] : fallback[j];
  return theta;
}

Features parameters_of(const ClusterSpec& c) {
  return {c.forward_gflops > 0 ? 1.0 / c.forward_gflops : 0.0, c.backward_gflops > 0 ? 1.0 / c.backward_gflops : 0.0,
          c.step_overhead_us * 1e-6, c.host_copy_gbps > 0 ? 1.0 / c.host_copy_gbps : 0.0, c.message_overhead_us * 1e-6};
}

Features features_of(const PassCounts& c, bool backward) {
  return {backward ? 0.0 : c.gflop, backward ? c.gflop : 0.0, c.compute_steps, c.host_bytes / 1e9, c.messages};
}

}  // namespace

ClusterSpec machine_for(const ClusterSpec& machine, const MeasuredPoint& p) {
  ClusterSpec c = machine;
  const int nodes = std::clamp(p.nodes, 1, std::max(1, p.ranks));
  c.ranks_per_node = (p.ranks + nodes - 1) / nodes;
  if (p.emulated) {  // a transfer completes when both the emulated link and the transport are done
    for (LinkSpec* own : {&c.intra, &c.inter}) {
      const double emulated = p.link.gbps;  // 0 = unlimited
      own->gbps = own->gbps > 0 && emulated > 0 ? std::min(own->gbps, emulated) : std::max(own->gbps, emulated);
      own->latency_us = std::max(own->latency_us, p.link.latency_us);
    }
  }
  return c;
}

namespace {

// Sum of squared relative errors of the wall times of the points run without emulation.
double machine_link_misfit(const std::vector<MeasuredPoint>& points, const ClusterSpec& machine) {
  double sum = 0.0;
  for (const MeasuredPoint& p : points) {
    if (p.emulated) continue;
    const Prediction pred = predict(machine_for(machine, p), p.workload, p.mask.view(), p.ranks);
    const double f = p.forward_s > 0 ? (pred.forward.seconds - p.forward_s) / p.forward_s : 0.0;
    const double b = p.workload.backward && p.backward_s > 0 ? (pred.backward.seconds - p.backward_s) / p.backward_s : 0.0;
    sum += f * f + b * b;
  }
  return sum;
}

}  // namespace

Calibration calibrate(const std::vector<MeasuredPoint>& points, const ClusterSpec& start, bool fit_machine_link) {
  // The counts do not depend on the rates, but the simulation divides by them.
  ClusterSpec counting = start;
  if (counting.forward_gflops <= 0) counting.forward_gflops = 1.0;
  if (counting.backward_gflops <= 0) counting.backward_gflops = 1.0;
  std::vector<Observation> obs;
  for (const MeasuredPoint& p : points) {
    const ClusterSpec c = machine_for(counting, p);
    const ShardLayout layout(p.workload.layout, p.workload.seq_len, p.ranks);
    const ClusterWork work = build_cluster_work(p.workload, layout, p.mask.view());
    const ClusterSimulation sim(c, p.workload, work);
    if (p.forward_mean_s > 0)
      obs.push_back({features_of(sim.forward_counts(), false), p.forward_mean_s - p.forward_wait_s});
    if (p.workload.backward && p.backward_mean_s > 0)
      obs.push_back({features_of(sim.backward_counts(), true), p.backward_mean_s - p.backward_wait_s});
  }
  std::erase_if(obs, [](const Observation& o) { return !(o.y > 0); });

  Calibration cal;
  cal.machine = start;
  cal.points = static_cast<int>(obs.size());
  if (obs.empty()) return cal;
  const Features theta = fit_nonnegative(obs, parameters_of(start));
  ClusterSpec& m = cal.machine;
  if (theta[0] > 0) m.forward_gflops = 1.0 / theta[0];
  if (theta[1] > 0) m.backward_gflops = 1.0 / theta[1];
  m.step_overhead_us = theta[2] * 1e6;
  m.host_copy_gbps = theta[3] > 0 ? 1.0 / theta[3] : 0.0;
  m.message_overhead_us = theta[4] * 1e6;
  double sum = 0.0;
  for (const Observation& o : obs) {
    double fit = 0.0;
    for (int j = 0; j < kParams; ++j) fit += theta[j] * o.x[j];
    sum += (fit - o.y) * (fit - o.y) / (o.y * o.y);
  }
  cal.rms_relative_residual = std::sqrt(sum / double(obs.size()));

  if (fit_machine_link) {
    constexpr double kMaxLogLatencyUs = 3.0;
    // A scan of bandwidths (0.03 GB/s .. unlimited) and latencies (none .. 1 ms: more than any
    // message between ranks of one machine or cluster costs; a larger "latency" would only absorb
    // other misfit and then spoil every prediction over a slower link) in steps of a quarter
    // decade, then golden-section refinement of each around the best.
    auto link_at = [](double log_gbps, double log_us) {
      return LinkSpec{log_gbps >= 4.0 ? 0.0 : std::pow(10.0, log_gbps), log_us < 0.0 ? 0.0 : std::pow(10.0, log_us)};
    };
    auto misfit = [&](double log_gbps, double log_us) {
      ClusterSpec c = m;
      c.intra = link_at(log_gbps, log_us);
      return machine_link_misfit(points, c);
    };
    double bw = 4.0, lat = -0.25, best = misfit(bw, lat);
    for (double g = -1.5; g <= 4.0; g += 0.25)
      for (double u = -0.25; u <= kMaxLogLatencyUs; u += 0.25)
        if (const double e = misfit(g, u); e < best) bw = g, lat = u, best = e;
    const double golden = (std::sqrt(5.0) - 1) / 2;
    auto refine = [&](double& x, const std::function<double(double)>& f) {
      double lo = x - 0.25, hi = x + 0.25;
      for (int i = 0; i < 24; ++i) {
        const double a = hi - golden * (hi - lo), b = lo + golden * (hi - lo);
        if (f(a) < f(b)) hi = b;
        else lo = a;
      }
      const double mid = 0.5 * (lo + hi);
      if (f(mid) < f(x)) x = mid;
    };
    for (int round = 0; round < 8; ++round) {
      if (bw < 4.0) refine(bw, [&](double g) { return misfit(std::min(g, 3.99), lat); });
      if (lat >= 0.0) refine(lat, [&](double u) { return misfit(bw, std::clamp(u, 0.0, kMaxLogLatencyUs)); });
    }
    m.intra = link_at(bw, lat);
  }
  return cal;
}

double Comparison::worst_error() const { return std::max(std::abs(forward_error), std::abs(backward_error)); }

namespace {

// The point predicted on `machine` (machine_for has been applied: its intra link is the ring's,
// emulated); `own` is the machine's own link, which the group's emulated link slows likewise.
Comparison compare_point(const MeasuredPoint& p, const LinkSpec& own, const ClusterSpec& machine) {
  Comparison c;
  c.point = &p;
  if (p.ulysses > 1) {  // the hybrid: the ring across groups plus the all-to-alls inside them
    LinkSpec group = own;
    if (p.group_emulated) {
      const double emulated = p.group_link.gbps;
      group.gbps = own.gbps > 0 && emulated > 0 ? std::min(own.gbps, emulated) : std::max(own.gbps, emulated);
      group.latency_us = std::max(own.latency_us, p.group_link.latency_us);
    }
    const HybridPrediction h = predict_hybrid(machine, p.workload, p.mask.view(), p.ranks, p.ulysses, &group);
    c.predicted = h.ring;
    c.predicted.ranks = p.ranks;
    c.predicted.forward.seconds = h.forward_seconds();
    c.predicted.backward.seconds = h.backward_seconds();
    c.predicted.forward.exposed_fraction = h.exposed_forward();
  } else {
    c.predicted = predict(machine, p.workload, p.mask.view(), p.ranks);
  }
  if (p.forward_s > 0) c.forward_error = (c.predicted.forward.seconds - p.forward_s) / p.forward_s;
  if (p.workload.backward && p.backward_s > 0)
    c.backward_error = (c.predicted.backward.seconds - p.backward_s) / p.backward_s;
  return c;
}

}  // namespace

std::vector<Comparison> compare(const std::vector<MeasuredPoint>& points, const ClusterSpec& machine) {
  std::vector<Comparison> out;
  for (const MeasuredPoint& p : points) out.push_back(compare_point(p, machine.intra, machine_for(machine, p)));
  return out;
}

ClusterSpec machine_of_run(const ClusterSpec& machine, const MeasuredPoint& p) {
  ClusterSpec c = machine_for(machine, p);
  c.step_overhead_us = c.message_overhead_us = c.host_copy_gbps = 0.0;  // in the run's busy time
  c.forward_gflops = c.backward_gflops = 1.0;                          // for the counts only
  // The ring of the point: with --ulysses, across the P/U groups on H/U heads (hybrid_model.hpp).
  Workload w = p.workload;
  int ranks = p.ranks;
  if (p.ulysses > 1) {
    w.heads /= p.ulysses;
    w.kv_heads = w.kv_heads >= p.ulysses ? w.kv_heads / p.ulysses : 1;
    ranks /= p.ulysses;
  }
  const ShardLayout layout(w.layout, w.seq_len, ranks);
  const ClusterWork work = build_cluster_work(w, layout, p.mask.view());
  const ClusterSimulation sim(c, w, work);
  const double forward_busy = p.forward_mean_s - p.forward_wait_s;
  const double backward_busy = p.backward_mean_s - p.backward_wait_s;
  c.forward_gflops = forward_busy > 0 ? sim.forward_counts().gflop / forward_busy : machine.forward_gflops;
  c.backward_gflops =
      w.backward && backward_busy > 0 ? sim.backward_counts().gflop / backward_busy : machine.backward_gflops;
  return c;
}

std::vector<Comparison> compare_same_run(const std::vector<MeasuredPoint>& points, const ClusterSpec& machine) {
  std::vector<Comparison> out;
  for (const MeasuredPoint& p : points) out.push_back(compare_point(p, machine.intra, machine_of_run(machine, p)));
  return out;
}

}  // namespace ringattn
