// `ringattn bench`: the kernel benchmark (--kernel) and the scaling benchmark.
#pragma once

#include "launch/context.hpp"

namespace ringattn {

int run_bench(LaunchContext& ctx);

}  // namespace ringattn
