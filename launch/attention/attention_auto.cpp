#include "launch/attention/attention_auto.hpp"

#include <cstdio>

#include "launch/cli/options_util.hpp"
#include "launch/plan/machine_probe.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/session.hpp"

namespace ringattn {

Json choose_auto_configuration(Job& job, Session& session) {
  const int P = session.size();
  ClusterSpec machine;
  std::string source;
  if (job.auto_machine) {
    machine = *job.auto_machine;
    source = "--calibration " + job.opt.calibration;
  } else {
    const MachineProbe probe = probe_machine(session, job.shard, job.spec, job.seq_len, job.backward, job.opt.auto_budget);
    machine = probe.machine;
    source = probe.account;
  }
  // Where the ranks are is known here, whatever the file said: the nodes MPI found.
  const NodeMap& nodes = session.nodes();
  machine.ranks_per_node = 1;
  for (int r = 0; r < P; ++r) machine.ranks_per_node = std::max(machine.ranks_per_node, nodes.local_ranks(r));
  if (nodes.nodes() == 1) machine.ranks_per_node = P;

  Workload w;
  w.batch = job.shard.batch, w.seq_len = job.seq_len, w.heads = job.shard.heads, w.kv_heads = job.shard.kv_heads;
  w.head_dim = job.shard.head_dim, w.dtype_bytes = job.shard.dtype == ElementType::float32 ? 4 : 2;
  w.backward = job.backward;
  const Mask mask = api::build_mask(job.spec, job.seq_len);
  auto spec_of = [&](LayoutKind layout, Schedule schedule, int ulysses) {
    AttentionSpec s = job.spec;
    s.layout = layout_spec(layout_name(layout));  // the command line's one mapping to the spec
    s.schedule = schedule_spec(schedule_name(schedule));
    s.ulysses = ulysses;
    return s;
  };
  const AutoAllowed runnable = [&](LayoutKind layout, Schedule schedule, int ulysses) {
    return !api::check_call(job.shard, spec_of(layout, schedule, ulysses), job.seq_len, P);
  };
  const AutoChoice choice = choose_configuration(machine, w, mask.view(), P, job.auto_fixed, job.spec.mask.causal, runnable);
  // The same choice everywhere: rank 0's (the probe's numbers were rank 0's already).
  int chosen = static_cast<int>(choice.best);
  session.world().broadcast(&chosen, sizeof chosen, 0);
  const AutoCandidate& c = choice.candidates[static_cast<size_t>(chosen)];
  job.spec = spec_of(c.layout, c.schedule, c.ulysses);
  job.opt.layout = layout_name(c.layout), job.opt.schedule = schedule_name(c.schedule), job.opt.ulysses = c.ulysses;
  if (session.rank() == 0) {
    print_auto_choice(stdout, choice, machine, source, job.backward);
    std::fflush(stdout);
  }
  return auto_choice_json(choice, machine, source);
}

}  // namespace ringattn
