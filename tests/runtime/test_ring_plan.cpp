// The communication plan against brute force: for every layout, mask, rank count and length,
// the direct schedule moves exactly the K/V rows some query of the receiver sees (bytes sent ==
// bytes needed), skips steps with nothing to move, and the ring relays whole shards.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "kernels/mask/mask.hpp"
#include "runtime/ring_plan.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {
namespace {

Mask make_mask(int variant, int64_t L) {
  Mask m;
  const int64_t n = (L + 7) / 8;
  switch (variant) {
    case 0: break;
    case 1: m.causal = true; break;
    case 2: m.window_left = 3; m.window_right = 2; break;  // shorter than a shard: halo only
    case 3: m.causal = true; m.window_left = 20; break;
    case 4: m.set_documents({L / 3, 0, L - L / 3 - 5, 5}); break;
    case 5: m.causal = true; m.set_documents({L / 2, L - L / 2}); break;
    case 6: m.set_block_mask(bigbird_block_mask(n, 1, 1, 1, 7), n, 8); break;
    case 7: {
      std::mt19937 gen(3);
      std::vector<uint8_t> bm(static_cast<size_t>(n * n));
      for (auto& x : bm) x = gen() % 4 == 0;
      m.set_block_mask(bm, n, 8);
      m.causal = true;
      break;
    }
    case 8: m.window_left = 0; m.window_right = 0; break;  // each query sees only itself
  }
  return m;
}
constexpr int kMaskVariants = 9;

// Local rows of `s` seen by some query of `r`, by brute force over all pairs.
std::set<int64_t> needed_rows(const ShardLayout& layout, const MaskView& m, int r, int s) {
  std::set<int64_t> out;
  const auto qp = layout.positions(r), kp = layout.positions(s);
  for (size_t j = 0; j < kp.size(); ++j)
    for (int64_t i : qp)
      if (visible(m, i, kp[j])) {
        out.insert(static_cast<int64_t>(j));
        break;
      }
  return out;
}

std::set<int64_t> as_set(const std::vector<RowRange>& ranges) {
  std::set<int64_t> s;
  for (const RowRange& r : ranges)
    for (int64_t j = r.begin; j < r.end; ++j) s.insert(j);
  return s;
}

TEST(RingPlan, DirectMovesExactlyTheNeededRows) {
  for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
    for (int P = 1; P <= 5; ++P)
      for (int64_t L : {int64_t(61), int64_t(96)})
        for (int variant = 0; variant < kMaskVariants; ++variant) {
          const ShardLayout layout(kind, L, P);
          const Mask mask = make_mask(variant, L);
          const MaskView m = mask.view();
          int64_t sent = 0, needed = 0;
          for (int r = 0; r < P; ++r) {
            const RingPlan plan(layout, m, Schedule::direct, r);
            needed += plan.rows_needed();
            sent += plan.rows_sent();
            for (int k = 1; k < P; ++k) {
              const RingStep& st = plan.steps()[static_cast<size_t>(k)];
              const int from = (r - k + P) % P, to = (r + k) % P;
              const auto want_in = needed_rows(layout, m, r, from);
              const auto want_out = needed_rows(layout, m, to, r);
              SCOPED_TRACE(std::string(layout_name(kind)) + " P=" + std::to_string(P) + " L=" + std::to_string(L) +
                           " mask " + mask.describe() + " rank " + std::to_string(r) + " step " + std::to_string(k));
              EXPECT_EQ(as_set(st.source_rows), want_in);
              EXPECT_EQ(st.recv_rows, static_cast<int64_t>(want_in.size()));
              EXPECT_EQ(st.recv_peer, want_in.empty() ? -1 : from);  // nothing to receive: no receive posted
              EXPECT_EQ(as_set(st.send_rows), want_out);
              EXPECT_EQ(st.send_peer, want_out.empty() ? -1 : to);
            }
          }
          EXPECT_EQ(sent, needed) << "bytes sent must equal bytes needed for the direct schedule";
        }
}

TEST(RingPlan, CausalContiguousSendsNothingBackward) {
  const ShardLayout layout(LayoutKind::contiguous, 400, 4);
  Mask mask;
  mask.causal = true;
  const RingPlan first(layout, mask.view(), Schedule::direct, 0);
  EXPECT_EQ(first.rows_needed(), 0);  // rank 0's queries precede every other key
  EXPECT_EQ(first.compute_steps(), 1);
  const RingPlan last(layout, mask.view(), Schedule::direct, 3);
  EXPECT_EQ(last.rows_sent(), 0);  // nobody after rank 3
  EXPECT_EQ(last.rows_needed(), 300);
}

TEST(RingPlan, ShortWindowMovesOnlyTheHalo) {
  const ShardLayout layout(LayoutKind::contiguous, 1000, 4);  // shards of 250
  Mask mask;
  mask.causal = true;
  mask.window_left = 16;
  for (int r = 1; r < 4; ++r) {
    const RingPlan plan(layout, mask.view(), Schedule::direct, r);
    EXPECT_EQ(plan.rows_needed(), 16) << "one hop, 16 rows";
    EXPECT_EQ(plan.steps()[1].recv_rows, 16);
    EXPECT_EQ(plan.compute_steps(), 2);
    for (int k = 2; k < 4; ++k) EXPECT_EQ(plan.steps()[static_cast<size_t>(k)].recv_peer, -1);
  }
}

TEST(RingPlan, RingRelaysWholeShards) {
  const ShardLayout layout(LayoutKind::zigzag, 101, 3);
  Mask mask;
  mask.causal = true;
  int64_t sent = 0, needed = 0;
  for (int r = 0; r < 3; ++r) {
    const RingPlan plan(layout, mask.view(), Schedule::ring, r);
    int64_t expect_sent = 0;
    for (int k = 1; k < 3; ++k) {
      const RingStep& st = plan.steps()[static_cast<size_t>(k)];
      EXPECT_EQ(st.recv_peer, (r + 2) % 3);
      EXPECT_EQ(st.send_peer, (r + 1) % 3);
      EXPECT_EQ(st.recv_rows, layout.rows((r - k + 3) % 3));
      expect_sent += layout.rows((r - k + 1 + 3) % 3);
    }
    EXPECT_EQ(plan.rows_sent(), expect_sent);
    sent += plan.rows_sent();
    needed += plan.rows_needed();
  }
  EXPECT_EQ(sent, 2 * 101);  // every shard makes P - 1 hops
  EXPECT_GT(sent, needed);
}

TEST(RingPlan, VisiblePairsMatchBruteForce) {
  for (int variant = 0; variant < kMaskVariants; ++variant)
    for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped}) {
      const int64_t L = 77;
      const Mask mask = make_mask(variant, L);
      const MaskView m = mask.view();
      const ShardLayout layout(kind, L, 3);
      for (int r = 0; r < 3; ++r) {
        int64_t brute = 0;
        for (int64_t i : layout.positions(r))
          for (int64_t j = 0; j < L; ++j) brute += visible(m, i, j);
        EXPECT_EQ(count_visible_pairs(m, layout.runs(r), L), brute) << mask.describe();
      }
    }
}

}  // namespace
}  // namespace ringattn
