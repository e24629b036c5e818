#include "launch/bench/bench.hpp"

#include <algorithm>

#include "launch/bench/decode_bench.hpp"
#include "launch/bench/kernel_bench.hpp"
#include "launch/bench/scaling_bench.hpp"

namespace ringattn {

int run_bench(LaunchContext& ctx) {
  if (std::find(ctx.args.begin(), ctx.args.end(), "--kernel") != ctx.args.end()) return run_kernel_bench(ctx, ctx.args);
  if (std::find(ctx.args.begin(), ctx.args.end(), "--decode") != ctx.args.end()) return run_decode_bench(ctx, ctx.args);
  return run_scaling_bench(ctx, ctx.args);
}

}  // namespace ringattn
