// A cluster description as a JSON file: what `ringattn plan --cluster FILE` reads, what
// `plan --save-calibration FILE` writes, and what `ringattn --auto --calibration FILE` predicts with.
// Keys: name, ranks_per_node, intra_bandwidth_gbps, intra_latency_us, inter_bandwidth_gbps,
// inter_links, inter_latency_us, forward_tflops (or forward_gflops), backward_tflops (or
// backward_gflops), step_overhead_us, message_overhead_us, host_copy_gbps, memory_gib.
#pragma once

#include <string>

#include "launch/cli/json.hpp"
#include "launch/plan/cluster_model.hpp"

namespace ringattn {

// Throws ArgumentError naming `flag` and the file for an unreadable file or a bad value. Keys that
// are absent are 0 (ranks_per_node and inter_links: 1).
ClusterSpec read_cluster_file(const std::string& path, const std::string& flag);

Json cluster_json(const ClusterSpec& c);

}  // namespace ringattn
