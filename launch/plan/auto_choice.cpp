#include "launch/plan/auto_choice.hpp"

#include <algorithm>

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

std::vector<size_t> trial_candidates(const AutoChoice& choice, double margin, size_t most) {
  std::vector<size_t> close;
  const AutoCandidate& best = choice.chosen();
  for (size_t i = 0; i < choice.candidates.size(); ++i) {
    const AutoCandidate& c = choice.candidates[i];
    if (i != choice.best && c.predicted.ring.fits_memory && c.seconds() <= best.seconds() * (1 + margin))
      close.push_back(i);
  }
  std::stable_sort(close.begin(), close.end(), [&](size_t a, size_t b) {
    return choice.candidates[a].seconds() < choice.candidates[b].seconds();
  });
  // The model's best first; then the best of each other Ulysses degree (the configurations that
  // differ most: an all-to-all against a ring); then the rest by prediction. Layouts that balance
  // alike (zigzag and striped) predict alike, and trying both would crowd out the others.
  std::vector<size_t> order{choice.best};
  std::vector<bool> taken(choice.candidates.size(), false);
  taken[choice.best] = true;
  for (size_t i : close) {
    const int U = choice.candidates[i].ulysses;
    const bool seen = std::any_of(order.begin(), order.end(), [&](size_t j) { return choice.candidates[j].ulysses == U; });
    if (!seen) order.push_back(i), taken[i] = true;
  }
  for (size_t i : close)
    if (!taken[i]) order.push_back(i);
  if (order.size() > most) order.resize(most);
  if (order.size() < 2) order.clear();
  return order;
}

void choose_measured(AutoChoice& choice) {
  const auto& model = choice.candidates[choice.best].measured_s;
  std::optional<size_t> fastest;
  for (size_t i = 0; i < choice.candidates.size(); ++i) {
    const auto& m = choice.candidates[i].measured_s;
    if (m && (!fastest || *m < *choice.candidates[*fastest].measured_s)) fastest = i;
  }
  // The model's choice stays unless another ran clearly faster: within the noise of a few passes
  // the ties keep the defaults, as the model's do.
  if (fastest && (!model || *choice.candidates[*fastest].measured_s < *model * (1 - kTrialHysteresis)))
    choice.best = *fastest;
}

namespace {

std::string describe(const AutoCandidate& c) {
  return std::string("--layout ") + layout_name(c.layout) + " --schedule " + schedule_name(c.schedule) +
         " --ulysses " + std::to_string(c.ulysses);
}

}  // namespace

void print_auto_choice(std::FILE* out, const AutoChoice& choice, const ClusterSpec& c, const std::string& source,
                       bool backward) {
  std::fprintf(out, "  auto      the model's machine (%s): %.3g GFLOP/s forward", source.c_str(), c.forward_gflops);
  if (backward) std::fprintf(out, ", %.3g backward", c.backward_gflops);  // a forward job measures none
  std::fprintf(out, " per rank; %d ranks per node", c.ranks_per_node);
  auto link = [&](const char* what, const LinkSpec& l) {
    if (l.gbps > 0) std::fprintf(out, "; %s %.3g GB/s, %.0f us", what, l.gbps, l.latency_us);
    else std::fprintf(out, "; %s unlimited", what);
  };
  link("within a node", c.intra);
  link("between nodes", c.inter);
  std::fprintf(out, "\n            costs not overlapped: %.0f us per kernel call, %.0f us per message, host copies %s",
               c.step_overhead_us, c.message_overhead_us,
               c.host_copy_gbps > 0 ? (std::to_string(c.host_copy_gbps).substr(0, 5) + " GB/s").c_str() : "free");
  const bool tried = !choice.trial_pass.empty();
  std::fprintf(out, "\n            %-10s %-8s %3s %12s %12s %12s %8s%s\n", "layout", "schedule", "U", "forward_ms",
               backward ? "backward_ms" : "", "total_ms", "exposed", tried ? "   measured_ms" : "");
  for (size_t i = 0; i < choice.candidates.size(); ++i) {
    const AutoCandidate& a = choice.candidates[i];
    char bwd[32] = "";
    if (backward) std::snprintf(bwd, sizeof bwd, "%12.3f", a.predicted.backward_seconds() * 1e3);
    char measured[32] = "";
    if (a.measured_s) std::snprintf(measured, sizeof measured, "%14.3f", *a.measured_s * 1e3);
    std::fprintf(out, "          %s %-10s %-8s %3d %12.3f %12s %12.3f %7.1f%%%s%s\n", i == choice.best ? "->" : "  ",
                 layout_name(a.layout), schedule_name(a.schedule), a.ulysses, a.predicted.forward_seconds() * 1e3, bwd,
                 a.seconds() * 1e3, 100 * a.predicted.exposed_forward(), measured,
                 a.predicted.ring.fits_memory ? "" : "  (does not fit in memory)");
  }
  const AutoCandidate& best = choice.chosen();
  if (tried)
    std::fprintf(out, "            tried the %zu candidates the model put within %.0f%% of its best: %d round%s of one %s "
                      "pass each in %.2f s; the fastest measured wins if %.0f%% faster than the model's choice\n",
                 static_cast<size_t>(std::count_if(choice.candidates.begin(), choice.candidates.end(),
                                                   [](const AutoCandidate& c) { return c.measured_s.has_value(); })),
                 100 * kTrialMargin, choice.trial_rounds, choice.trial_rounds == 1 ? "" : "s", choice.trial_pass.c_str(),
                 choice.trial_seconds, 100 * kTrialHysteresis);
  else if (!choice.no_trials.empty())
    std::fprintf(out, "            no trials: %s\n", choice.no_trials.c_str());
  std::fprintf(out, "            chose %s: predicted %.3f ms", describe(best).c_str(), best.seconds() * 1e3);
  if (best.measured_s) std::fprintf(out, " (measured %.3f ms)", *best.measured_s * 1e3);
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
    c["measured_s"] = a.measured_s ? Json(*a.measured_s) : Json();
    all.push_back(c);
  }
  j["candidates"] = all;
  j["chosen"] = static_cast<int64_t>(choice.best);
  Json trials = Json::object();
  trials["pass"] = choice.trial_pass.empty() ? Json() : Json(choice.trial_pass);
  trials["rounds"] = choice.trial_rounds;
  trials["seconds"] = choice.trial_seconds;
  trials["margin"] = kTrialMargin;
  if (!choice.no_trials.empty()) trials["none_because"] = choice.no_trials;
  j["trials"] = trials;
  return j;
}

}  // namespace ringattn
