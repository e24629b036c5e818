#include "launch/plan/hybrid_model.hpp"

#include <algorithm>

namespace ringattn {
namespace {

int64_t kv_slice(const Workload& w, int ulysses) { return w.kv_heads >= ulysses ? w.kv_heads / ulysses : 1; }

bool group_in_node(const ClusterSpec& c, int ulysses) { return c.ranks_per_node % ulysses == 0; }

}  // namespace

bool ulysses_fits(int ulysses, int ranks, int64_t heads, int64_t kv_heads) {
  return ulysses >= 1 && ranks % ulysses == 0 && heads % ulysses == 0 &&
         (kv_heads % ulysses == 0 || ulysses % kv_heads == 0);
}

double alltoall_seconds(const ClusterSpec& c, const Workload& w, int ranks, int ulysses, int64_t slice_heads,
                        int64_t elem, int64_t width_d, const LinkSpec* group_link) {
  if (ulysses <= 1) return 0.0;
  const double rows = double(w.seq_len) / ranks;
  const double message = double(w.batch) * rows * double(slice_heads * width_d * elem);
  const double sent = (ulysses - 1) * message;
  LinkSpec link = c.intra;
  if (group_link) {
    link = *group_link;
  } else if (!group_in_node(c, ulysses)) {  // the node's ranks all exchange at once over its links
    link = c.inter;
    link.gbps = std::min(c.inter.gbps / c.inter_links, c.inter.gbps / std::max(1, c.ranks_per_node));
  }
  double t = link.latency_us * 1e-6 + (link.gbps > 0 ? sent / (link.gbps * 1e9) : 0.0);
  t += 2.0 * (ulysses - 1) * c.message_overhead_us * 1e-6;
  if (c.host_copy_gbps > 0) t += 2.0 * ulysses * message / (c.host_copy_gbps * 1e9);  // pack, unpack
  return t;
}

HybridPrediction predict_hybrid(const ClusterSpec& c, const Workload& w, const MaskView& mask, int ranks, int ulysses,
                                const LinkSpec* group_link) {
  HybridPrediction h;
  h.ulysses = ulysses;
  Workload ring_work = w;
  ring_work.heads = w.heads / ulysses;
  ring_work.kv_heads = kv_slice(w, ulysses);
  ClusterSpec ring_cluster = c;
  if (ulysses > 1) {
    const int concurrent = std::min(ulysses, c.ranks_per_node);
    ring_cluster.ranks_per_node = std::max(1, c.ranks_per_node / ulysses);
    ring_cluster.inter.gbps = c.inter.gbps / concurrent;
    ring_cluster.inter_links = std::max(1, c.inter_links / concurrent);
  }
  h.ring = predict(ring_cluster, ring_work, mask, ranks / ulysses);
  // The ring's FLOPs are those of H/U heads on P/U ranks: restate them for the whole problem.
  h.ring.flops_forward *= ulysses;
  if (ulysses == 1) return h;
  const int64_t D = w.head_dim, q_slice = w.heads / ulysses, kv = kv_slice(w, ulysses);
  auto a2a = [&](int64_t slice, int64_t elem, int64_t width) {
    return alltoall_seconds(c, w, ranks, ulysses, slice, elem, width, group_link);
  };
  h.a2a_forward_seconds = a2a(q_slice, w.dtype_bytes, D) + 2 * a2a(kv, w.dtype_bytes, D) + a2a(q_slice, 4, D) +
                          a2a(q_slice, 4, 1);
  if (w.backward)
    h.a2a_backward_seconds = a2a(q_slice, w.dtype_bytes, D) + a2a(q_slice, 4, D) + 2 * a2a(kv, 4, D);
  const double rows = double(w.seq_len) / ranks;
  const double per_rank = (ulysses - 1) * double(w.batch) * rows *
                          double((q_slice + 2 * kv) * D * w.dtype_bytes + q_slice * (D + 1) * 4);
  h.a2a_bytes_sent = uint64_t(per_rank * ranks);
  return h;
}

}  // namespace ringattn
