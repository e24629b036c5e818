// `ringattn --auto`: the layout, schedule and Ulysses degree the cluster model predicts fastest
// for this job on this machine (launch/plan/auto_choice.hpp), with the machine from
// --calibration FILE or measured at start-up (launch/plan/machine_probe.hpp). Rank 0 prints
// every candidate's predicted time and the choice.
#pragma once

#include "launch/attention/attention_options.hpp"
#include "launch/cli/json.hpp"

namespace ringattn {

class Session;

// Collective (the probe runs passes and ping-pongs): sets job.spec's and job.opt's layout, schedule
// and ulysses on every rank, the same everywhere (rank 0's choice). Returns the choice as JSON.
Json choose_auto_configuration(Job& job, Session& session);

}  // namespace ringattn
