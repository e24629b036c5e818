// `ringattn bench --kernel`: the CPU attention kernels on one process, against this machine's
// sgemm and FMA peak measured in the same run (and PyTorch's CPU SDPA when it is installed).
#pragma once

#include <string>
#include <vector>

#include "launch/cli/context.hpp"

namespace ringattn {

int run_kernel_bench(LaunchContext& ctx, const std::vector<std::string>& args);

}  // namespace ringattn
