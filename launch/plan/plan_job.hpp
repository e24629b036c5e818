// `ringattn plan`: what a run would cost on a cluster that is described, not present. For a
// cluster (flags or a JSON file: ranks per node, links, kernel rate) and a workload (shape, mask)
// it predicts per-step compute and transfer, pass times, efficiency and memory per rank for every
// layout and schedule with the model of launch/plan/cluster_model.hpp, and recommends one.
// `--calibrate bench.json` fits the model's kernel rate and host costs to measured benchmark
// points of this machine and compares its predictions with every measured time.
#pragma once

#include "launch/cli/context.hpp"

namespace ringattn {

int run_plan(LaunchContext& ctx);

}  // namespace ringattn
