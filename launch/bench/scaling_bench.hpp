// `ringattn bench` (the default benchmark): strong and weak scaling of ring attention over rank
// counts 1, 2, 4, ... inside one mpirun (a sub-communicator per point; ranks outside a point
// wait at a barrier), or one point per launch when launch/cluster/ sweeps node counts. Like
// nccl-tests, the benchmark is also a test: every point is checked against an fp64 reference on
// sampled rows, and a wrong result ends the run with exit code 3.
#pragma once

#include <string>
#include <vector>

#include "launch/cli/context.hpp"

namespace ringattn {

int run_scaling_bench(LaunchContext& ctx, const std::vector<std::string>& args);

}  // namespace ringattn
