// `ringattn decode` (docs/reference.md "Command line"): a prompt prefilled into a KV cache sharded across
// the ranks (or the cache filled with random K/V, --prefill-method none), then decode steps
// against it, timed, with time to first token, per-token latency, bytes moved, cache rows and
// memory per rank, the decode kernel's share of the memory bandwidth measured in the same run,
// and --check against fp64 attention over the whole sequence.
#pragma once

#include "launch/cli/context.hpp"

namespace ringattn {

int run_decode(LaunchContext& ctx);

}  // namespace ringattn
