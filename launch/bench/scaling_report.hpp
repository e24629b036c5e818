// What `ringattn bench` reports: the table on stdout (nccl-tests style: '#' lines describe the
// run, one fixed-width row per point), the --json document {"config", "points"} of docs/reference.md, and
// --csv.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launch/cli/json.hpp"
#include "launch/cli/mask_options.hpp"

namespace ringattn {

// One measured point.
struct ScalingPoint {
  int ranks = 1;
  int ulysses = 1;  // --ulysses: all-to-all inside groups of this many ranks, the ring across
  int nodes = 1;    // the nodes its ranks span
  int64_t seq_len = 0;
  double flops_forward = 0.0;  // counted (docs/reference.md), all ranks
  // Per pass: the median over iterations of the slowest rank's time, its 95th percentile, and
  // medians of the means over ranks of each rank's own time, kernel time and waiting time.
  double forward_s = 0, forward_p95_s = 0, forward_mean_s = 0, forward_compute_s = 0, forward_wait_s = 0;
  double backward_s = 0, backward_p95_s = 0, backward_mean_s = 0, backward_compute_s = 0, backward_wait_s = 0;
  double exposed_forward = 0.0, exposed_backward = 0.0;  // mean over ranks of wait / pass time
  uint64_t bytes_sent = 0, bytes_needed = 0, peak_rss = 0;
  uint64_t a2a_bytes_sent = 0;  // forward all-to-all payload, all ranks (--ulysses > 1)
  bool checked = false, check_passed = true;
  double max_abs_err = 0.0;
  int wrong = 0;  // checked tensors (of o, lse, dq, dk, dv) beyond their tolerance
  std::string layout, schedule;   // the point's (with --auto, chosen for it)
  std::optional<Json> auto_choice;  // --auto: the candidates and the choice
  double efficiency = 0.0, efficiency_forward = 0.0, efficiency_backward = 0.0;
};

// What every point of a run shares.
struct ScalingSetup {
  bool weak = false, backward = true;
  std::vector<int> ranks;
  int job_ranks = 1, nodes = 1, hardware_threads = 1, threads = 1;
  int64_t seq_len = 0, tokens_per_rank = 0, batch = 1, heads = 1, kv_heads = 1, head_dim = 1;
  std::string mask, layout, schedule, dtype, backend, comm, host, cpu, isa;  // layout, schedule: "auto" with --auto
  MaskOptions mask_options;
  int iters = 1, warmup = 0, check_rows = 0;
  uint64_t seed = 0;
  double emulate_bandwidth = 0.0, emulate_latency = 0.0;
  double emulate_intra_bandwidth = 0.0, emulate_intra_latency = 0.0;  // inside --ulysses groups
};

void print_scaling_header(const ScalingSetup& s);
void print_scaling_row(const ScalingPoint& p, const ScalingSetup& s);
void print_scaling_footer(const std::vector<ScalingPoint>& points, const ScalingSetup& s);

Json scaling_config_json(const ScalingSetup& s);
Json scaling_point_json(const ScalingPoint& p, const ScalingSetup& s);
std::string scaling_csv(const std::vector<ScalingPoint>& points, const ScalingSetup& s);

}  // namespace ringattn
