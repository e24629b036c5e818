// `ringattn bench --decode`: the CPU decode kernel on one process, its read rate against the
// memory read bandwidth of the same threads measured in the same run (interleaved with it).
#pragma once

#include <string>
#include <vector>

#include "launch/cli/context.hpp"

namespace ringattn {

int run_decode_bench(LaunchContext& ctx, const std::vector<std::string>& args);

}  // namespace ringattn
