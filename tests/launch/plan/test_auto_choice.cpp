// --auto's choice (auto_choice.hpp): the fastest predicted configuration, the defaults on ties,
// what the command line fixed kept, and configurations the job cannot run left out; which
// candidates are tried where the model cannot separate them, and how their measurements decide.
#include <gtest/gtest.h>

#include "kernels/mask/mask.hpp"
#include "launch/plan/auto_choice.hpp"

namespace ringattn {
namespace {

ClusterSpec cluster(double inter_gbps) {
  ClusterSpec c;
  c.ranks_per_node = 4;
  c.intra = {100.0, 2.0};
  c.inter = {inter_gbps, 10.0};
  c.forward_gflops = c.backward_gflops = 1000.0;
  return c;
}

Workload workload() {
  Workload w;
  w.seq_len = 16384, w.heads = 8, w.kv_heads = 8, w.head_dim = 64, w.dtype_bytes = 2;
  return w;
}

TEST(AutoChoice, CausalWorkIsBalanced) {
  Mask mask;
  mask.causal = true;
  const AutoChoice c = choose_configuration(cluster(1000.0), workload(), mask.view(), 4, {}, true);
  EXPECT_NE(c.chosen().layout, LayoutKind::contiguous);  // 4 ranks: the last has 7x the first's work
  for (const AutoCandidate& a : c.candidates) EXPECT_LE(c.chosen().seconds(), a.seconds() * 1.005);
}

TEST(AutoChoice, TiesKeepTheDefaults) {
  Mask mask;  // no mask, fast links: every configuration computes the same and hides its transfers
  ClusterSpec fast = cluster(1e6);
  fast.intra = fast.inter = {1e6, 0.0};
  const AutoChoice c = choose_configuration(fast, workload(), mask.view(), 4, {}, false);
  EXPECT_EQ(c.best, 0u);
  EXPECT_EQ(c.chosen().layout, LayoutKind::contiguous);
  EXPECT_EQ(c.chosen().schedule, Schedule::direct);
  EXPECT_EQ(c.chosen().ulysses, 1);
}

TEST(AutoChoice, SlowNetworkAvoidsTheDirectScheduleAcrossNodes) {
  Mask mask;
  mask.causal = true;
  Workload w = workload();
  w.kv_heads = 2;  // GQA: the ring's K/V are small, and still a 1 GB/s network cannot hide them
  ClusterSpec slow = cluster(1.0);
  slow.inter.latency_us = 50.0;
  const AutoChoice c = choose_configuration(slow, w, mask.view(), 16, {}, true);
  // The default (zigzag, direct: 15 messages a step share a node's slow link) waits for its data;
  // the ring's relay (one neighbour each, mostly inside a node) or groups inside nodes hide it.
  ASSERT_NE(c.best, 0u);
  EXPECT_TRUE(c.chosen().schedule == Schedule::ring || c.chosen().ulysses > 1);
  EXPECT_LT(c.chosen().seconds(), 0.7 * c.candidates[0].seconds());
  // With the schedule fixed to direct, groups inside nodes are what is left.
  AutoFixed direct;
  direct.schedule = Schedule::direct;
  EXPECT_GT(choose_configuration(slow, w, mask.view(), 16, direct, true).chosen().ulysses, 1);
}

TEST(AutoChoice, FixedChoicesStayAndUnrunnableOnesGo) {
  Mask mask;
  mask.causal = true;
  AutoFixed fixed;
  fixed.schedule = Schedule::ring;
  const AutoAllowed no_striped = [](LayoutKind l, Schedule, int) { return l != LayoutKind::striped; };
  const AutoChoice c = choose_configuration(cluster(10.0), workload(), mask.view(), 4, fixed, true, no_striped);
  ASSERT_FALSE(c.candidates.empty());
  for (const AutoCandidate& a : c.candidates) {
    EXPECT_EQ(a.schedule, Schedule::ring);
    EXPECT_NE(a.layout, LayoutKind::striped);
  }
  // Degrees that do not fit the heads are never candidates: 8 heads, 4 ranks: U in {1, 2, 4}; U = 4
  // is one group (no ring), a single candidate.
  int u4 = 0;
  for (const AutoCandidate& a : c.candidates) u4 += a.ulysses == 4;
  EXPECT_EQ(u4, 1);
}

// Candidates by hand: predicted totals (forward only), Ulysses degrees.
AutoChoice made_up(std::vector<std::pair<double, int>> predicted_and_u, size_t best) {
  AutoChoice c;
  for (auto [seconds, U] : predicted_and_u) {
    AutoCandidate a;
    a.ulysses = U;
    a.predicted.ring.forward.seconds = seconds;
    a.predicted.ring.fits_memory = true;
    c.candidates.push_back(a);
  }
  c.best = best;
  return c;
}

TEST(AutoChoice, TrialsTakeTheCloseCandidatesOfEachUlyssesDegreeFirst) {
  // The model's best (index 1), three U = 1 twins just behind it, the best U = 4 and U = 2 within
  // the margin, one U = 2 beyond it.
  const AutoChoice c = made_up({{1.01, 1}, {1.00, 1}, {1.01, 1}, {1.02, 1}, {1.10, 4}, {1.12, 2}, {1.30, 2}}, 1);
  const std::vector<size_t> tried = trial_candidates(c, 0.15, 4);
  ASSERT_EQ(tried.size(), 4u);
  EXPECT_EQ(tried[0], 1u);  // the model's best first
  EXPECT_EQ(tried[1], 4u);  // then the best of each other degree, by prediction
  EXPECT_EQ(tried[2], 5u);
  EXPECT_EQ(tried[3], 0u);  // then the rest by prediction
  EXPECT_TRUE(trial_candidates(made_up({{1.0, 1}, {1.5, 4}}, 0), 0.15, 4).empty());  // separated: no trials
  AutoChoice big = made_up({{1.0, 1}, {1.01, 4}}, 0);
  big.candidates[1].predicted.ring.fits_memory = false;
  EXPECT_TRUE(trial_candidates(big, 0.15, 4).empty());  // never one that does not fit
}

TEST(AutoChoice, MeasuredFastestWinsOnlyWhenClearlyFaster) {
  AutoChoice c = made_up({{1.00, 1}, {1.05, 4}, {1.08, 2}}, 0);
  c.candidates[0].measured_s = 1.00, c.candidates[1].measured_s = 0.97, c.candidates[2].measured_s = 1.20;
  choose_measured(c);
  EXPECT_EQ(c.best, 0u);  // 3% faster: within the noise, the model's choice stays
  c.candidates[1].measured_s = 0.80;
  choose_measured(c);
  EXPECT_EQ(c.best, 1u);  // 20% faster: the measurement decides
}

}  // namespace
}  // namespace ringattn
