// `ringattn bench`: the scaling benchmark (default) and the kernel benchmark (--kernel).
#pragma once

#include "launch/cli/context.hpp"

namespace ringattn {

int run_bench(LaunchContext& ctx);

}  // namespace ringattn
