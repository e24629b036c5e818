// The hybrid's cost (--ulysses U, runtime/ulysses_attention.hpp) on a cluster: the ring across the
// P/U groups predicted by the ring model (cluster_model.hpp) on H/U heads, plus the all-to-alls
// inside the groups, which are not overlapped with compute (the runtime runs them before and after
// the ring). Pure arithmetic, like the ring model.
//
// The all-to-all model (the same link model as the ring's):
//   one all-to-all of a tensor whose per-member slice has `slice` heads of `elem` bytes sends, from
//   each rank, U - 1 messages of B x rows x slice x D x elem bytes (rows = L / P) and receives as
//   many; they queue on the rank's outgoing and incoming link, so it costs
//   latency + (U - 1) x message / bandwidth (the runtime posts them in shifted order, r + 1, r + 2,
//   ..., so no link carries more than its own U - 1), plus per message overheads (send and
//   receive) and the copies that pack and unpack the blocks (2 x the tensor) at host_copy_gbps;
//   the link is the intra-node one when a group lies in a node (ranks_per_node a multiple of U),
//   else the inter-node one, shared by the node's ranks (every rank exchanges at once);
//   forward: Q, K, V in (storage type), O and LSE out (fp32); backward: dO in, dQ, dK, dV out (fp32);
//   K/V slices are Hkv / U heads, or one replicated head when Hkv < U.
// The ring part: the workload with H/U query heads and the K/V slice, over P/U ranks, on a cluster
// of ranks_per_node / U ranks per node whose inter-node bandwidth is shared by the min(U, ranks per
// node) rings that run at once (one per member index).
#pragma once

#include "launch/plan/cluster_model.hpp"

namespace ringattn {

struct HybridPrediction {
  int ulysses = 1;
  Prediction ring;                    // the ring across groups (ranks = P / U)
  double a2a_forward_seconds = 0.0;   // all-to-alls of a forward pass (not overlapped)
  double a2a_backward_seconds = 0.0;  // of a backward pass
  uint64_t a2a_bytes_sent = 0;        // forward all-to-all payload, all ranks
  double forward_seconds() const { return ring.forward.seconds + a2a_forward_seconds; }
  double backward_seconds() const { return ring.backward.seconds + a2a_backward_seconds; }
  double total_seconds() const { return forward_seconds() + backward_seconds(); }
  // Exposed communication of the forward pass: the ring's waits and the all-to-alls.
  double exposed_forward() const {
    const double t = forward_seconds();
    return t > 0 ? (ring.forward.wait_seconds + a2a_forward_seconds) / t : 0.0;
  }
};

// Whether U is a possible degree for P ranks and these heads (check_ulysses without the throw).
bool ulysses_fits(int ulysses, int ranks, int64_t heads, int64_t kv_heads);

// Seconds of one all-to-all on this cluster; `slice_heads` heads of `elem` bytes per member.
double alltoall_seconds(const ClusterSpec& c, const Workload& w, int ranks, int ulysses, int64_t slice_heads,
                        int64_t elem, int64_t width_d, const LinkSpec* group_link = nullptr);

// group_link: the link inside groups when it is not the cluster's (link emulation on one machine,
// where each rank has its own emulated ports: --emulate-intra-* inside groups).
HybridPrediction predict_hybrid(const ClusterSpec& cluster, const Workload& w, const MaskView& mask, int ranks,
                                int ulysses, const LinkSpec* group_link = nullptr);

}  // namespace ringattn
