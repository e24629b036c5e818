// The cluster model on synthetic inputs: the benchmark's arithmetic (percentiles, efficiency),
// visible pairs between shards against brute force, the step-by-step timing against the
// closed forms of the block-size condition (a step costs max(compute, transfer)), link sharing
// between nodes, memory, and a calibration that recovers the parameters that made its data.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "launch/plan/calibration.hpp"
#include "launch/plan/cluster_model.hpp"
#include "launch/plan/cluster_sim.hpp"
#include "kernels/mask/mask.hpp"

namespace ringattn {
namespace {

TEST(ScalingArithmetic, StrongScalingEfficiencyIsT1OverPTimesTP) {
  const ScalingSample one{1, 1e12, 10.0};
  EXPECT_DOUBLE_EQ(scaling_efficiency({4, 1e12, 2.5}, one), 1.0);
  EXPECT_DOUBLE_EQ(scaling_efficiency({4, 1e12, 3.125}, one), 0.8);
  EXPECT_DOUBLE_EQ(scaling_efficiency(one, one), 1.0);
  // Relative to a base of 2 ranks: T2 * 2 / (8 * T8).
  EXPECT_DOUBLE_EQ(scaling_efficiency({8, 1e12, 1.0}, {2, 1e12, 3.0}), 3.0 * 2 / (8 * 1.0));
}

TEST(ScalingArithmetic, WeakScalingComparesPerRankThroughput) {
  // Causal, tokens per rank fixed: 2 ranks hold 2x the tokens, so 4x the pairs.
  const ScalingSample one{1, 1e12, 1.0};
  EXPECT_DOUBLE_EQ(scaling_efficiency({2, 4e12, 2.0}, one), 1.0);  // per-rank time doubled: ideal
  EXPECT_NEAR(scaling_efficiency({2, 4e12, 2.2}, one), 2.0 / 2.2, 1e-15);
  EXPECT_DOUBLE_EQ(scaling_efficiency({2, 4e12, 0.0}, one), 0.0);  // not measured
}

// Every kind of mask, alone and combined, on a sequence of length L.
std::vector<Mask> masks_for(int64_t L) {
  const int64_t blocks = (L + 7) / 8;
  std::vector<Mask> m(10);  // m[0]: no mask
  m[1].causal = true;
  m[2].window_left = 3, m[2].window_right = 2;
  m[3].causal = true, m[3].window_left = 20;
  m[4].set_documents({L / 3, 0, L - L / 3 - 5, 5});
  m[5].causal = true, m[5].window_left = 7;
  m[5].set_documents({L / 2, L - L / 2});
  m[6].set_block_mask(bigbird_block_mask(blocks, 1, 1, 1, 7), blocks, 8);
  m[7].causal = true;
  m[7].set_block_mask(bigbird_block_mask(blocks, 0, 2, 1, 3), blocks, 8);
  m[8].window_left = 0, m[8].window_right = 0;  // each query sees only itself
  m[9].window_right = 5;                        // bounded on the right only
  return m;
}

TEST(VisiblePairs, BetweenShardsMatchBruteForceAndSumToTheTotal) {
  for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
    for (int64_t L : {1, 7, 64, 101})
      for (int P : {1, 2, 3, 5})
        for (const Mask& mask : masks_for(L)) {
          if (L < P) continue;
          const MaskView mv = mask.view();
          const ShardLayout layout(kind, L, P);
          for (int r = 0; r < P; ++r) {
            int64_t sum = 0;
            for (int s = 0; s < P; ++s) {
              int64_t brute = 0;
              for (int64_t i : layout.positions(r))
                for (int64_t j : layout.positions(s)) brute += visible(mv, i, j);
              const int64_t got = count_pairs_between(mv, layout.runs(r), layout.runs(s), L);
              ASSERT_EQ(got, brute) << layout_name(kind) << " L " << L << " P " << P << " mask " << mask.describe() << " r " << r
                                    << " s " << s;
              sum += got;
            }
            EXPECT_EQ(sum, count_visible_pairs(mv, layout.runs(r), L));
          }
        }
}

TEST(VisiblePairs, ClosedFormHandlesAMillionTokens) {
  Mask mask;
  mask.causal = true;
  const int64_t L = int64_t{1} << 20;
  const ShardLayout layout(LayoutKind::striped, L, 512);
  // Rank 3 holds positions 3 + 512 t; keys of rank 5 at 5 + 512 u are seen when 5 + 512 u <= 3 + 512 t,
  // i.e. u <= t - 1: sum over t of t = 2048 * 2047 / 2.
  EXPECT_EQ(count_pairs_between(mask.view(), layout.runs(3), layout.runs(5), L), int64_t{2048} * 2047 / 2);
}

Workload small_workload(int64_t L, LayoutKind layout, Schedule schedule, bool backward) {
  Workload w;
  w.seq_len = L;
  w.heads = 2;
  w.kv_heads = 1;
  w.head_dim = 16;
  w.layout = layout;
  w.schedule = schedule;
  w.backward = backward;
  return w;
}

// Only kernels and links cost: host work and messages are free.
ClusterSpec pure_cluster(double gflops, double link_gbps, double latency_us, int per_node) {
  ClusterSpec c;
  c.ranks_per_node = per_node;
  c.intra = {link_gbps, latency_us};
  c.inter = {link_gbps, latency_us};
  c.forward_gflops = c.backward_gflops = gflops;
  return c;
}

TEST(ClusterModel, OneRankIsItsKernelTime) {
  const Workload w = small_workload(1000, LayoutKind::contiguous, Schedule::direct, true);
  Mask mask;
  mask.causal = true;
  ClusterSpec c = pure_cluster(50.0, 1.0, 1.0, 1);
  c.step_overhead_us = 10.0;
  const Prediction p = predict(c, w, mask.view(), 1);
  const double flops = 4.0 * 2 * 16 * (1000.0 * 1001 / 2);
  EXPECT_DOUBLE_EQ(p.flops_forward, flops);
  EXPECT_NEAR(p.forward.seconds, flops / 50e9 + 10e-6, 1e-15);
  EXPECT_NEAR(p.backward.seconds, 2.5 * flops / 50e9 + 10e-6, 1e-15);
  EXPECT_EQ(p.forward.wait_seconds, 0.0);
  EXPECT_EQ(p.bytes_sent, 0u);
  EXPECT_NEAR(p.efficiency, (3.5 * flops / 50e9) / (3.5 * flops / 50e9 + 20e-6), 1e-12);
}

// Two ranks, full attention: step 0 computes c while step 1's K/V (x) travels, so the pass takes
// max(c, x) + c, and the wait is max(0, x - c): the block-size condition.
TEST(ClusterModel, ExposedCommunicationIsTransferBeyondCompute) {
  const Workload w = small_workload(2000, LayoutKind::contiguous, Schedule::direct, false);
  const Mask mask;
  const double c = 4.0 * 2 * 16 * 1000.0 * 1000 / 50e9;  // one block: 1000 x 1000 pairs
  const double bytes = kv_bytes(w, 1000);                 // 1000 rows of K and V
  for (double gbps : {10.0, 1.0, 0.1, 0.01}) {
    const double x = bytes / (gbps * 1e9) + 20e-6;
    const Prediction p = predict(pure_cluster(50.0, gbps, 20.0, 2), w, mask.view(), 2);
    EXPECT_NEAR(p.forward.seconds, std::max(c, x) + c, 1e-12) << gbps;
    EXPECT_NEAR(p.forward.wait_seconds, std::max(0.0, x - c), 1e-12) << gbps;
    EXPECT_NEAR(p.step_compute_seconds, c, 1e-15);
    EXPECT_NEAR(p.step_transfer_seconds, x, 1e-15);
  }
}

// The ring relay on P ranks: compute-bound it takes P * c; transfer-bound the relay is a chain,
// (P - 1) * x + c. The direct schedule posts everything a step ahead and also takes P * c.
TEST(ClusterModel, RingRelayIsComputeBoundOrAChainOfTransfers) {
  const int P = 5;
  const Workload ring = small_workload(500 * P, LayoutKind::contiguous, Schedule::ring, false);
  const Mask mask;
  const double c = 4.0 * 2 * 16 * 500.0 * 500 / 50e9;
  const double bytes = kv_bytes(ring, 500);
  const double fast = bytes / c * 4 / 1e9, slow = bytes / c / 3 / 1e9;  // GB/s: x = c/4, x = 3c
  const Prediction p_fast = predict(pure_cluster(50.0, fast, 0.0, P), ring, mask.view(), P);
  EXPECT_NEAR(p_fast.forward.seconds, P * c, 1e-12);
  EXPECT_NEAR(p_fast.forward.exposed_fraction, 0.0, 1e-12);
  const Prediction p_slow = predict(pure_cluster(50.0, slow, 0.0, P), ring, mask.view(), P);
  EXPECT_NEAR(p_slow.forward.seconds, (P - 1) * 3 * c + c, 1e-12);
  Workload direct = ring;
  direct.schedule = Schedule::direct;
  EXPECT_NEAR(predict(pure_cluster(50.0, fast, 0.0, P), direct, mask.view(), P).forward.seconds, P * c, 1e-12);
  EXPECT_EQ(p_fast.bytes_sent, uint64_t(bytes * P * (P - 1)));
}

TEST(ClusterModel, CausalDirectMovesOnlyWhatIsNeededAndBalancedLayoutsAreFaster) {
  Mask mask;
  mask.causal = true;
  const ClusterSpec c = pure_cluster(50.0, 1000.0, 1.0, 8);
  Workload w = small_workload(4096, LayoutKind::contiguous, Schedule::direct, true);
  const Prediction contiguous = predict(c, w, mask.view(), 4);
  w.layout = LayoutKind::zigzag;
  const Prediction zigzag = predict(c, w, mask.view(), 4);
  EXPECT_EQ(zigzag.bytes_sent, zigzag.bytes_needed);
  EXPECT_LT(zigzag.total_seconds(), 0.8 * contiguous.total_seconds());  // causal work balanced
  EXPECT_GT(zigzag.efficiency, 0.9);
  w.schedule = Schedule::ring;
  EXPECT_GT(predict(c, w, mask.view(), 4).bytes_sent, zigzag.bytes_sent);  // whole shards travel
}

TEST(ClusterModel, InterNodeBandwidthIsSharedByTheNodesFlowsUpToOneLinkEach) {
  // 4 ranks, 2 per node, direct, full attention: at step 2 every rank sends off its node (2
  // flows per node); at steps 1 and 3 one rank per node does.
  const Workload w = small_workload(4000, LayoutKind::contiguous, Schedule::direct, false);
  const Mask mask;
  ClusterSpec c = pure_cluster(50.0, 100.0, 0.0, 2);
  c.inter = {10.0, 0.0};
  const double bytes = kv_bytes(w, 1000);
  const ShardLayout layout(w.layout, w.seq_len, 4);
  const ClusterWork work = build_cluster_work(w, layout, mask.view());
  {
    const ClusterSimulation sim(c, w, work);  // one link: 10 GB/s alone, 5 GB/s each when shared
    EXPECT_NEAR(sim.typical_step_transfer(), bytes / 10e9, 1e-15);  // median of 10, 5, 10 GB/s steps
  }
  c.inter_links = 4;  // a flow uses one link of 2.5 GB/s
  const ClusterSimulation sim(c, w, work);
  EXPECT_NEAR(sim.typical_step_transfer(), bytes / 2.5e9, 1e-15);
}

TEST(ClusterModel, MemoryIsTheShardAndTheTransferBuffers) {
  Workload w = small_workload(1000, LayoutKind::contiguous, Schedule::direct, false);
  const Mask mask;
  const ShardLayout one(w.layout, 1000, 1);
  const double q = 2 * 16, kv = 16;
  EXPECT_EQ(memory_per_rank(w, one, RingPlan(one, mask.view(), w.schedule, 0)),
            uint64_t(1000 * (q + 2 * kv) * 4 + 1000 * q * 4 + 2 * 1000 * 4));
  const ShardLayout two(w.layout, 1000, 2);
  // Half the rows, plus two receive and two send slots of 500 K/V rows.
  EXPECT_EQ(memory_per_rank(w, two, RingPlan(two, mask.view(), w.schedule, 0)),
            uint64_t(500 * (q + 2 * kv) * 4 + 500 * q * 4 + 2 * 500 * 4 + 4 * kv_bytes(w, 500)));
}

TEST(Calibration, RecoversTheParametersThatMadeItsData) {
  ClusterSpec truth = pure_cluster(180.0, 0.0, 0.0, 1);
  truth.backward_gflops = 150.0;
  truth.step_overhead_us = 300.0;
  truth.host_copy_gbps = 6.0;
  truth.message_overhead_us = 40.0;
  std::vector<MeasuredPoint> points;
  for (int P : {1, 2, 4})
    for (int64_t L : {2048, 4096})
      for (double gbps : {0.0, 0.5})
        for (Schedule sched : {Schedule::direct, Schedule::ring}) {
          MeasuredPoint m;
          m.workload = small_workload(L, LayoutKind::zigzag, sched, true);
          m.mask.causal = true;
          m.ranks = P;
          m.emulated = gbps > 0;
          m.link = {gbps, 50.0};
          const Prediction p = predict(machine_for(truth, m), m.workload, m.mask.view(), P);
          m.forward_s = p.forward.seconds, m.forward_mean_s = p.forward.mean_seconds;
          m.forward_wait_s = p.forward.wait_seconds;
          m.backward_s = p.backward.seconds, m.backward_mean_s = p.backward.mean_seconds;
          m.backward_wait_s = p.backward.wait_seconds;
          points.push_back(std::move(m));
        }
  ClusterSpec start = pure_cluster(1.0, 0.0, 0.0, 1);
  const Calibration cal = calibrate(points, start);
  EXPECT_EQ(cal.points, int(points.size()) * 2);
  EXPECT_NEAR(cal.machine.forward_gflops, 180.0, 0.5);
  EXPECT_NEAR(cal.machine.backward_gflops, 150.0, 0.5);
  EXPECT_NEAR(cal.machine.step_overhead_us, 300.0, 3.0);
  EXPECT_NEAR(cal.machine.host_copy_gbps, 6.0, 0.1);
  EXPECT_NEAR(cal.machine.message_overhead_us, 40.0, 1.0);
  EXPECT_LT(cal.rms_relative_residual, 1e-3);
  for (const Comparison& c : compare(points, cal.machine)) EXPECT_LT(c.worst_error(), 0.01) << c.point->ranks;
}

TEST(Calibration, FitsTheMachinesOwnLink) {
  ClusterSpec truth = pure_cluster(180.0, 0.02, 400.0, 1);  // 20 MB/s, 400 us per message
  std::vector<MeasuredPoint> points;
  for (int P : {1, 2, 4})
    for (int64_t L : {256, 512}) {
      MeasuredPoint m;
      m.workload = small_workload(L, LayoutKind::zigzag, Schedule::direct, false);
      m.mask.causal = true;
      m.ranks = P;
      const Prediction p = predict(machine_for(truth, m), m.workload, m.mask.view(), P);
      m.forward_s = p.forward.seconds, m.forward_mean_s = p.forward.mean_seconds;
      m.forward_wait_s = p.forward.wait_seconds;
      points.push_back(std::move(m));
    }
  const Calibration cal = calibrate(points, pure_cluster(1.0, 0.0, 0.0, 1), true);
  EXPECT_NEAR(cal.machine.intra.gbps, 0.02, 0.0005);
  EXPECT_NEAR(cal.machine.intra.latency_us, 400.0, 20.0);
  for (const Comparison& c : compare(points, cal.machine)) EXPECT_LT(c.worst_error(), 0.01) << c.point->ranks;
}

// A point that spanned nodes (the JSON's nodes, as on the cluster in a box) has ranks / nodes on
// each, and its K/V crosses the link between nodes; on one node, the machine's own link.
TEST(Calibration, APointOnSeveralNodesCrossesTheLinkBetweenThem) {
  ClusterSpec machine = pure_cluster(180.0, 0.0, 0.0, 1);  // the machine's own link: unlimited
  machine.inter = {0.01, 100.0};                             // between nodes: 10 MB/s
  MeasuredPoint m;
  m.workload = small_workload(4096, LayoutKind::zigzag, Schedule::direct, true);
  m.mask.causal = true;
  m.ranks = 4;
  EXPECT_EQ(machine_for(machine, m).ranks_per_node, 4);
  m.nodes = 2;
  EXPECT_EQ(machine_for(machine, m).ranks_per_node, 2);
  m.nodes = 4;
  const ClusterSpec apart = machine_for(machine, m);
  EXPECT_EQ(apart.ranks_per_node, 1);
  const Prediction across = predict(apart, m.workload, m.mask.view(), 4);
  m.nodes = 1;
  const Prediction inside = predict(machine_for(machine, m), m.workload, m.mask.view(), 4);
  // Across nodes every step waits for 128 KiB of K/V at 10 MB/s (13 ms; the step computes for 1 ms).
  EXPECT_GT(across.forward.seconds, 3 * 0.0131);
  EXPECT_GT(across.forward.exposed_fraction, 0.8);
  EXPECT_LT(inside.forward.seconds, 0.25 * across.forward.seconds);
  EXPECT_EQ(inside.forward.exposed_fraction, 0.0);
}

}  // namespace
}  // namespace ringattn
