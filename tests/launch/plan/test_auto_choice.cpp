// --auto's choice (auto_choice.hpp): the fastest predicted configuration, the defaults on ties,
// what the command line fixed kept, and configurations the job cannot run left out.
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

}  // namespace
}  // namespace ringattn
