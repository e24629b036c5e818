// The hybrid's model (hybrid_model.hpp): U = 1 is the ring's prediction; the all-to-all's bytes and
// time follow its formula on the link a group lies on; more groups per node never slow the ring.
#include <gtest/gtest.h>

#include "kernels/mask/mask.hpp"
#include "launch/plan/hybrid_model.hpp"

namespace ringattn {
namespace {

ClusterSpec test_cluster() {
  ClusterSpec c;
  c.ranks_per_node = 4;
  c.intra = {100.0, 2.0};
  c.inter = {10.0, 10.0};
  c.inter_links = 1;
  c.forward_gflops = c.backward_gflops = 1000.0;
  return c;
}

Workload test_workload() {
  Workload w;
  w.seq_len = 4096, w.heads = 8, w.kv_heads = 2, w.head_dim = 64, w.dtype_bytes = 2;
  w.layout = LayoutKind::zigzag;
  return w;
}

TEST(HybridModel, OneRankPerGroupIsTheRing) {
  Mask mask;
  mask.causal = true;
  const ClusterSpec c = test_cluster();
  const Workload w = test_workload();
  const Prediction ring = predict(c, w, mask.view(), 8);
  const HybridPrediction h = predict_hybrid(c, w, mask.view(), 8, 1);
  EXPECT_DOUBLE_EQ(h.forward_seconds(), ring.forward.seconds);
  EXPECT_DOUBLE_EQ(h.backward_seconds(), ring.backward.seconds);
  EXPECT_EQ(h.a2a_bytes_sent, 0u);
}

TEST(HybridModel, AlltoallFollowsItsLinkAndBytes) {
  ClusterSpec c = test_cluster();
  const Workload w = test_workload();
  // 8 ranks, U = 4 inside a node of 4: 3 messages of 1 x 512 rows x 2 heads x 64 x 2 bytes.
  const double message = 512.0 * 2 * 64 * 2;
  EXPECT_NEAR(alltoall_seconds(c, w, 8, 4, 2, 2, 64), 2e-6 + 3 * message / 100e9, 1e-12);
  // U = 8 spans nodes: the inter-node link, its bandwidth shared by the node's 4 ranks.
  EXPECT_NEAR(alltoall_seconds(c, w, 8, 8, 1, 2, 64), 10e-6 + 7 * (message / 2) / (10e9 / 4), 1e-12);
  Mask mask;
  const HybridPrediction h = predict_hybrid(c, w, mask.view(), 8, 4);
  // Forward: Q (2 heads) and K, V (one replicated head each since Hkv = 2 < U = 4) in bf16, O fp32, LSE fp32.
  const double per_rank = 3 * 512.0 * ((2 + 2 * 1) * 64 * 2 + 2 * 65 * 4);
  EXPECT_EQ(h.a2a_bytes_sent, uint64_t(8 * per_rank));
  EXPECT_GT(h.a2a_forward_seconds, 0.0);
  EXPECT_GT(h.a2a_backward_seconds, 0.0);
}

// With a slow network, groups inside nodes move the sequence traffic onto the fast link: at 16
// ranks (4 nodes) the hybrid with U = 4 beats the ring, and the plan would recommend it.
TEST(HybridModel, SlowNetworkFavoursGroupsInsideNodes) {
  ClusterSpec c = test_cluster();
  c.inter = {1.0, 50.0};
  Workload w = test_workload();
  w.seq_len = 16384;
  Mask mask;
  mask.causal = true;
  const HybridPrediction ring = predict_hybrid(c, w, mask.view(), 16, 1);
  const HybridPrediction hybrid = predict_hybrid(c, w, mask.view(), 16, 4);
  EXPECT_LT(hybrid.total_seconds(), ring.total_seconds());
  EXPECT_LT(hybrid.exposed_forward(), ring.exposed_forward());
  EXPECT_TRUE(ulysses_fits(4, 16, 8, 2));
  EXPECT_FALSE(ulysses_fits(3, 16, 8, 2));
  EXPECT_FALSE(ulysses_fits(4, 16, 6, 2));
}

}  // namespace
}  // namespace ringattn
