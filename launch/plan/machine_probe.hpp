// What `--auto` measures at start-up when no calibration file is given: this machine as the
// cluster model (cluster_model.hpp) describes it, within a time budget.
//   kernel rates   short ring passes of the job's shape and mask kind (causal, window) at growing
//                  sizes, balanced (zigzag when causal) and direct, until a pass takes about a quarter of the budget
//                  or the job's own size is reached: counted FLOPs over the time in the kernels,
//                  summed over ranks, forward and (when the job has one) backward;
//   links          ping-pong between rank 0 and a rank of another node (between nodes) and of its
//                  own node (within a node), on the transport the ring uses: latency from 4 KiB
//                  round trips, bandwidth from messages growing to one ring step's K/V;
// Per-call, per-message and host-copy costs are 0, as in `plan --same-run`: what the candidates
// differ in is their balance and their transfers. Collective; every rank gets rank 0's result.
#pragma once

#include <string>

#include "launch/plan/cluster_model.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn {

class Session;

struct MachineProbe {
  ClusterSpec machine;
  double seconds = 0.0;  // what the probe took
  std::string account;   // how it was measured, one line
};

// One pass (forward, and backward when asked) of `spec` at `seq_len` on inputs of zeros (the
// kernels' speed does not depend on the values), after a warm-up forward when asked: the slowest
// rank's time of each and the means over ranks. The plan is made for it and forgotten. Collective.
struct TimedPasses {
  double forward_s = 0, forward_mean_s = 0, forward_wait_s = 0;
  double backward_s = 0, backward_mean_s = 0, backward_wait_s = 0;
  double total_s() const { return forward_s + backward_s; }
};
TimedPasses time_passes(Session& session, const Shard& shard, const AttentionSpec& spec, int64_t seq_len, bool backward,
                        bool warm_up);

MachineProbe probe_machine(Session& session, const Shard& shard, const AttentionSpec& spec, int64_t seq_len,
                           bool backward, double budget_s);

}  // namespace ringattn
