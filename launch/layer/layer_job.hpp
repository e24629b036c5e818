// `ringattn layer`: the LoRA attention layer over the ranks (docs/layer.md):
// forward, backward, merged weights, training steps, and the teacher/student demo.
#pragma once

#include "launch/cli/context.hpp"

namespace ringattn {

// Runs the job on every rank of ctx.world; returns the exit code (throws JobFailed after an
// agreed failure).
int run_layer(LaunchContext& ctx);

}  // namespace ringattn
