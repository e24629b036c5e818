// `ringattn [attention]`: the main job (docs/reference.md "Command line").
#pragma once

#include "launch/cli/context.hpp"

namespace ringattn {

// Runs the job on every rank of ctx.world; returns the exit code (throws JobFailed after an
// agreed failure).
int run_attention(LaunchContext& ctx);

}  // namespace ringattn
