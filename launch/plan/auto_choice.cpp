#include "launch/plan/auto_choice.hpp"

#include "launch/plan/cluster_file.hpp"

namespace ringattn {

AutoChoice choose_configuration(const ClusterSpec& cluster, const Workload& w, const MaskView& mask, int ranks,
                                const AutoFixed& fixed, bool causal, const AutoAllowed& allowed) {
  // The defaults first: they win ties.
  const LayoutKind default_layout = causal ? LayoutKind::zigzag : LayoutKind::contiguous;
  std::vector<LayoutKind> layouts{default_layout};
  for (LayoutKind l : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
    if (l != default_layout) layouts.push_back(l);
  if (fixed.layout) layouts = {*fixed.layout};
  std::vector<Schedule> schedules{Schedule::direct, Schedule::ring};
  if (fixed.schedule) schedules = {*fixed.schedule};
  std::vector<int> degrees;
  for (int U = 1; U <= ranks; ++U)
    if ((!fixed.ulysses || *fixed.ulysses == U) && ulysses_fits(U, ranks, w.heads, w.kv_heads)) degrees.push_back(U);

  AutoChoice choice;
  for (int U : degrees)
    for (LayoutKind layout : layouts)
      for (Schedule schedule : schedules) {
        const bool no_ring = ranks / U == 1;
        if (no_ring && !choice.candidates.empty() && choice.candidates.back().ulysses == U) continue;
        if (allowed && !allowed(layout, schedule, U)) continue;
        AutoCandidate c;
        c.layout = layout, c.schedule = schedule, c.ulysses = U;
        Workload x = w;
        x.layout = layout, x.schedule = schedule;
        c.predicted = predict_hybrid(cluster, x, mask, ranks, U);
        choice.candidates.push_back(c);
      }
  for (size_t i = 1; i < choice.candidates.size(); ++i) {
    const AutoCandidate& c = choice.candidates[i];
    const AutoCandidate& b = choice.candidates[choice.best];
    const bool fits = c.predicted.ring.fits_memory, best_fits = b.predicted.ring.fits_memory;
    if ((fits && !best_fits) || (fits == best_fits && c.seconds() < b.seconds() * (1 - 0.005))) choice.best = i;
  }
  return choice;
}

namespace {

std::string describe(const AutoCandidate& c) {
  return std::string("--layout ") + layout_name(c.layout) + " --schedule " + schedule_name(c.schedule) +
         " --ulysses " + std::to_string(c.ulysses);
}

}  // namespace

void print_auto_choice(std::FILE* out, const AutoChoice& choice, const ClusterSpec& c, const std::string& source,
                       bool backward) {
  std::fprintf(out, "  auto      the model's machine (%s): %.3g GFLOP/s forward, %.3g backward per rank; %d ranks per node",
               source.c_str(), c.forward_gflops, c.backward_gflops, c.ranks_per_node);
  auto link = [&](const char* what, const LinkSpec& l) {
    if (l.gbps > 0) std::fprintf(out, "; %s %.3g GB/s, %.0f us", what, l.gbps, l.latency_us);
    else std::fprintf(out, "; %s unlimited", what);
  };
  link("within a node", c.intra);
  link("between nodes", c.inter);
  std::fprintf(out, "\n            costs not overlapped: %.0f us per kernel call, %.0f us per message, host copies %s",
               c.step_overhead_us, c.message_overhead_us,
               c.host_copy_gbps > 0 ? (std::to_string(c.host_copy_gbps).substr(0, 5) + " GB/s").c_str() : "free");
  std::fprintf(out, "\n            %-10s %-8s %3s %12s %12s %12s %8s\n", "layout", "schedule", "U", "forward_ms",
               backward ? "backward_ms" : "", "total_ms", "exposed");
  for (size_t i = 0; i < choice.candidates.size(); ++i) {
    const AutoCandidate& a = choice.candidates[i];
    char bwd[32] = "";
    if (backward) std::snprintf(bwd, sizeof bwd, "%12.3f", a.predicted.backward_seconds() * 1e3);
    std::fprintf(out, "          %s %-10s %-8s %3d %12.3f %12s %12.3f %7.1f%%%s\n", i == choice.best ? "->" : "  ",
                 layout_name(a.layout), schedule_name(a.schedule), a.ulysses, a.predicted.forward_seconds() * 1e3, bwd,
                 a.seconds() * 1e3, 100 * a.predicted.exposed_forward(),
                 a.predicted.ring.fits_memory ? "" : "  (does not fit in memory)");
  }
  const AutoCandidate& best = choice.chosen();
  std::fprintf(out, "            chose %s: predicted %.3f ms", describe(best).c_str(), best.seconds() * 1e3);
  if (choice.candidates.size() > 1) {
    size_t second = choice.best == 0 ? 1 : 0;
    for (size_t i = 0; i < choice.candidates.size(); ++i)
      if (i != choice.best && choice.candidates[i].seconds() < choice.candidates[second].seconds()) second = i;
    std::fprintf(out, ", the next best (%s) %.3f ms", describe(choice.candidates[second]).c_str(),
                 choice.candidates[second].seconds() * 1e3);
    if (choice.best != 0 && second != 0)
      std::fprintf(out, ", the default %.3f ms", choice.candidates[0].seconds() * 1e3);
  }
  std::fprintf(out, "\n");
}

Json auto_choice_json(const AutoChoice& choice, const ClusterSpec& cluster, const std::string& source) {
  Json j = Json::object();
  j["source"] = source;
  j["machine"] = cluster_json(cluster);
  Json all = Json::array();
  for (const AutoCandidate& a : choice.candidates) {
    Json c = Json::object();
    c["layout"] = layout_name(a.layout);
    c["schedule"] = schedule_name(a.schedule);
    c["ulysses"] = a.ulysses;
    c["forward_s"] = a.predicted.forward_seconds();
    c["backward_s"] = a.predicted.backward_seconds();
    c["total_s"] = a.seconds();
    all.push_back(c);
  }
  j["candidates"] = all;
  j["chosen"] = static_cast<int64_t>(choice.best);
  return j;
}

}  // namespace ringattn
