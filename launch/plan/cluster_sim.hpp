// Inside the cluster model: the work and traffic of every rank at every step (from the RingPlan
// of each rank), and the step-by-step timing of a forward and a backward pass that follows what
// RingAttention waits for. See cluster_model.hpp for the model in words.
#pragma once

#include <cstdint>
#include <vector>

#include "launch/plan/cluster_model.hpp"

namespace ringattn {

// What one rank does at one step, as RingAttention does it.
struct StepWork {
  int source = -1;           // whose keys it computes on; -1: no compute at this step
  double flops = 0.0;        // counted forward FLOPs of that compute
  int recv_peer = -1;        // K/V arriving from
  double recv_bytes = 0.0;
  int send_peer = -1;        // K/V leaving to
  double send_bytes = 0.0;
  double pack_bytes = 0.0;   // own rows gathered into a send buffer on the host
  double grad_bytes = 0.0;   // backward: the fp32 dK/dV of the keys computed on, sent on
};

struct ClusterWork {
  int ranks = 1;
  std::vector<int64_t> rows;                 // per rank
  std::vector<std::vector<StepWork>> steps;  // [rank][step], step 0 is local
  double flops_forward = 0.0;                // all ranks
  double bytes_sent = 0.0, bytes_needed = 0.0;
  uint64_t memory_bytes = 0;                 // the largest rank's
};

ClusterWork build_cluster_work(const Workload& w, const ShardLayout& layout, const MaskView& mask);

// Counts per pass, averaged over ranks, that do not depend on the cluster's rates: what the
// calibration regresses the measured times on.
struct PassCounts {
  double gflop = 0.0;          // counted GFLOP computed (backward: 2.5x forward's pairs)
  double compute_steps = 0.0;  // kernel calls
  double host_bytes = 0.0;     // bytes packed, zeroed, added on the host
  double messages = 0.0;       // sends and receives posted
};

class ClusterSimulation {
 public:
  ClusterSimulation(const ClusterSpec& cluster, const Workload& w, const ClusterWork& work);

  PassPrediction forward() const { return run(false, nullptr); }
  PassPrediction backward() const { return run(true, nullptr); }
  PassCounts forward_counts() const;
  PassCounts backward_counts() const;
  // The median over steps 1..P-1 of the slowest rank's forward compute, and of the longest
  // forward K/V transfer (latency + bytes / bandwidth) at that step.
  double typical_step_compute() const;
  double typical_step_transfer() const;

 private:
  struct Tally;
  PassPrediction run(bool backward, PassCounts* counts) const;
  double compute_seconds(const StepWork& s, bool backward) const;
  // Latency (s) and bandwidth (bytes/s) of a message from `from` to `to` at step k.
  void link(int from, int to, int k, double& latency, double& bandwidth) const;

  const ClusterSpec& cluster_;
  const Workload& w_;
  const ClusterWork& work_;
  int P_;
  std::vector<std::vector<int>> off_node_senders_;  // [step][node]: ranks sending to another node
};

}  // namespace ringattn
