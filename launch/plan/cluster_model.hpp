// The performance model behind `ringattn plan` and the scaling benchmark's arithmetic: what a
// ring attention pass costs on a cluster, from the real RingPlan (who sends which rows to whom at
// each step) and the mask's visible pairs (the work of each rank at each step). Pure arithmetic,
// no communication: unit-tested on its own and used to project clusters this machine is not.
//
// The model (stated once, used everywhere):
//   compute of rank r at step k   = visible pairs (r's queries, the step's keys) x 4*B*H*D / rate
//                                    (+ a fixed cost per kernel call); backward FLOPs are 2.5x;
//   a transfer of n bytes         = latency + n / bandwidth, on the sender's outgoing and the
//                                    receiver's incoming link, which carry one message at a time
//                                    (later messages queue); between nodes a node's bandwidth is
//                                    shared by its ranks' concurrent flows, one flow using at most
//                                    one of its links (NICs);
//   overlap                        the transfers of step k+1 are posted before the compute of
//                                    step k (direct) or as soon as step k's data arrived (ring
//                                    relay), so step k starts at max(end of compute k-1, arrival
//                                    of k): a step costs max(compute, transfer) once the pipeline
//                                    runs; the local step 0 hides the first transfer only as far
//                                    as its compute lasts, and the last sends are waited for;
//   grouped steps                  a step's sends and receives are posted together and complete
//                                    together (one NCCL group): waiting for step k's data also
//                                    waits for this rank's send of step k; backward's gradient
//                                    returns of step k are one step posted after the compute of
//                                    step k, receive included;
//   host costs                     packing rows, adding gradients and zeroing outputs move bytes
//                                    at host_copy_gbps and each message costs message_overhead_us,
//                                    not overlapped;
//   a pass                         ends when its slowest rank ends.
// The simulation follows RingAttention::forward/backward step by step (what waits for what), so
// the measured and predicted times can be compared point by point (see calibration.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mask/mask_view.hpp"
#include "runtime/ring_plan.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

// ---- Scaling efficiency (the benchmark's column) ----

// One measured or predicted point of a scaling series.
struct ScalingSample {
  int ranks = 1;
  double flops = 0.0;    // counted FLOPs of the work (docs/reference.md), all ranks together
  double seconds = 0.0;  // wall time
};
// Per-rank throughput relative to the base point: (flops / (ranks * seconds)) /
// (base.flops / (base.ranks * base.seconds)). With the same work at every point (strong scaling)
// this is T_base * P_base / (P * T_P); with fixed tokens per rank (weak scaling) it compares
// per-rank GFLOP/s, which is fair although the work grows as L^2.
double scaling_efficiency(const ScalingSample& point, const ScalingSample& base);

// ---- Work: visible pairs between shards ----

// Visible (query, key) pairs between the query positions `queries` and the key positions `keys`
// (both as runs of a ShardLayout) under the mask, keys within [0, seq_len). Summed over every
// rank's keys it equals count_visible_pairs. Closed form (floor sums) without a block mask,
// one pass over the queries with one.
int64_t count_pairs_between(const MaskView& mask, const std::vector<PositionRun>& queries,
                            const std::vector<PositionRun>& keys, int64_t seq_len);

// ---- The cluster and the workload ----

struct LinkSpec {
  double gbps = 0.0;        // GB/s (1e9 bytes/s) per direction
  double latency_us = 0.0;
};

struct ClusterSpec {
  std::string name = "cluster";
  int ranks_per_node = 1;       // GPUs (or CPU ranks) per node
  LinkSpec intra;               // between two ranks of a node, per rank and direction
  LinkSpec inter;               // between nodes: the whole node's bandwidth per direction
  int inter_links = 1;          // NICs per node; one transfer uses one (inter.gbps / inter_links)
  double forward_gflops = 0.0;   // attention kernel rate per rank (counted FLOPs per second / 1e9)
  double backward_gflops = 0.0;  // backward (its FLOPs count 2.5x forward)
  double step_overhead_us = 0.0;     // per kernel call (launch, tiles that are partly masked)
  double message_overhead_us = 0.0;  // per message posted, not overlapped
  double host_copy_gbps = 0.0;       // packing, gradient adds, zeroing; 0 = free (device copies)
  double memory_gib = 0.0;           // per rank; 0 = unknown
};

struct Workload {
  int64_t batch = 1, seq_len = 0, heads = 1, kv_heads = 1, head_dim = 128;
  int64_t dtype_bytes = 4;  // storage and transfer type of Q, K, V, dO (fp32 4, bf16 2)
  LayoutKind layout = LayoutKind::contiguous;
  Schedule schedule = Schedule::direct;
  bool backward = true;
};

// ---- Predictions ----

struct PassPrediction {
  double seconds = 0.0;           // wall time: the slowest rank
  double compute_seconds = 0.0;   // kernels, mean over ranks
  double wait_seconds = 0.0;      // blocked waiting for data, mean over ranks
  double host_seconds = 0.0;      // host copies and message costs, mean over ranks
  double mean_seconds = 0.0;      // each rank's own time, mean over ranks
  double exposed_fraction = 0.0;  // mean over ranks of wait / that rank's time
};

struct Prediction {
  int ranks = 1;
  double flops_forward = 0.0;  // counted, all ranks
  PassPrediction forward, backward;
  // A typical step (the median over steps 1..P-1 of the slowest rank at that step): forward
  // compute, and the forward K/V transfer (latency + bytes / bandwidth of the link it takes).
  double step_compute_seconds = 0.0;
  double step_transfer_seconds = 0.0;
  uint64_t bytes_sent = 0;    // forward K/V, all ranks
  uint64_t bytes_needed = 0;  // the least any schedule moves, all ranks
  uint64_t memory_bytes = 0;  // per rank, the largest (see memory_per_rank)
  bool fits_memory = true;
  // Ideal time (the counted FLOPs at the kernel rate, spread evenly over the ranks) divided by
  // the predicted time: forward + backward when the workload has a backward.
  double efficiency = 0.0;
  double total_seconds() const { return forward.seconds + backward.seconds; }
};

// Bytes RingAttention holds on one rank: inputs, outputs and the transfer buffers, which it
// allocates once (forward's when built, backward's at the first backward) and keeps.
uint64_t memory_per_rank(const Workload& w, const ShardLayout& layout, const RingPlan& plan);

// Rank r's node is r / ranks_per_node.
Prediction predict(const ClusterSpec& cluster, const Workload& w, const MaskView& mask, int ranks);

// Bytes of a K/V message of n rows: K and V, every batch entry.
inline double kv_bytes(const Workload& w, int64_t rows) {
  return 2.0 * double(w.batch) * double(rows) * double(w.kv_heads * w.head_dim * w.dtype_bytes);
}

}  // namespace ringattn
