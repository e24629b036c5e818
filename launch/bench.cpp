#include "launch/bench.hpp"

#include <algorithm>

#include "launch/kernel_bench.hpp"
#include "runtime/errors.hpp"

namespace ringattn {

int run_bench(LaunchContext& ctx) {
  if (std::find(ctx.args.begin(), ctx.args.end(), "--kernel") != ctx.args.end()) return run_kernel_bench(ctx, ctx.args);
  throw UsageError("ringattn bench: the scaling benchmark is not built yet; use ringattn bench --kernel");
}

}  // namespace ringattn
