#include "launch/plan/machine_probe.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "launch/plan/calibration.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/ring_plan.hpp"
#include "runtime/session.hpp"
#include "util/stopwatch.hpp"

namespace ringattn {
namespace {

// Probe points: at `rows` rows per rank, balanced (zigzag when causal) and direct, with the job's
// shape and mask kind, as a benchmark's point would be.
MeasuredPoint probe_pass(Session& session, const Shard& shard, const AttentionSpec& job_spec, int64_t rows,
                         bool backward) {
  const int P = session.size();
  AttentionSpec spec;
  spec.mask.causal = job_spec.mask.causal;
  spec.mask.window_left = job_spec.mask.window_left;
  spec.mask.window_right = job_spec.mask.window_right;
  spec.softmax_scale = job_spec.softmax_scale;
  spec.kernel = job_spec.kernel;
  // Balanced (zigzag when causal): every rank computes all along, as in the jobs worth choosing; an
  // unbalanced probe would measure ranks that ran faster once their peers were done and idle.
  spec.layout = job_spec.mask.causal ? SequenceLayout::zigzag : SequenceLayout::contiguous;
  spec.schedule = KeyValueSchedule::direct;
  const int64_t seq_len = rows * P;
  const TimedPasses t = time_passes(session, shard, spec, seq_len, backward, /*warm_up=*/true);
  MeasuredPoint p;
  p.label = "probe at " + std::to_string(rows) + " rows per rank";
  p.ranks = P;
  p.nodes = session.nodes().nodes();
  Workload& w = p.workload;
  w.batch = shard.batch, w.seq_len = seq_len, w.heads = shard.heads, w.kv_heads = shard.kv_heads;
  w.head_dim = shard.head_dim, w.dtype_bytes = shard.dtype == ElementType::float32 ? 4 : 2, w.backward = backward;
  w.layout = api::layout_kind(spec), w.schedule = Schedule::direct;
  p.mask = api::build_mask(spec, seq_len);
  p.forward_s = t.forward_s, p.forward_mean_s = t.forward_mean_s, p.forward_wait_s = t.forward_wait_s;
  p.backward_s = t.backward_s, p.backward_mean_s = t.backward_mean_s, p.backward_wait_s = t.backward_wait_s;
  return p;
}

// Round trips of `bytes` between ranks a and b (the others wait): the median one-way time.
double one_way_seconds(comm::Communicator& transport, AttentionBackend& backend, int a, int b, size_t bytes, int trips) {
  const int me = transport.rank();
  if (me != a && me != b) return 0.0;
  DeviceBuffer buf(backend, bytes);
  const int peer = me == a ? b : a;
  std::vector<double> times;
  for (int t = 0; t < trips + 1; ++t) {  // the first is a warm-up (connection set-up)
    Stopwatch clock;
    for (int leg = 0; leg < 2; ++leg) {
      const bool sending = (leg == 0) == (me == a);
      const comm::StepTransfer x = sending ? comm::StepTransfer::send(buf.data(), bytes, peer)
                                           : comm::StepTransfer::recv(buf.data(), bytes, peer);
      comm::StepHandle h = transport.post_step(std::span<const comm::StepTransfer>(&x, 1));
      transport.wait_step(h, "the --auto link probe");
    }
    if (t > 0) times.push_back(clock.seconds() / 2);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// The link between ranks a and b: latency from small messages, bandwidth from messages doubling
// up to `largest` bytes while one takes under 50 ms. Meaningful on rank a; {0, 0} when a == b.
LinkSpec probe_link(Session& session, int a, int b, size_t largest) {
  comm::Communicator& transport = session.transport();
  AttentionBackend& backend = session.backend();
  LinkSpec link;
  double latency = one_way_seconds(transport, backend, a, b, 4096, 5);
  size_t bytes = 256 << 10;
  double gbps = 0.0;
  for (;;) {
    double t = one_way_seconds(transport, backend, a, b, bytes, 2);
    session.world().broadcast(&t, sizeof t, a);  // every rank takes the same branch
    if (t > latency) gbps = double(bytes) / (t - latency) / 1e9;
    if (bytes >= largest || t > 0.05) break;
    bytes *= 2;
  }
  link.latency_us = latency * 1e6;
  link.gbps = gbps;
  return link;
}

}  // namespace

TimedPasses time_passes(Session& session, const Shard& shard, const AttentionSpec& spec, int64_t seq_len, bool backward,
                        bool warm_up) {
  const int P = session.size();
  AttentionPlan& plan = session.plan(shard, spec, seq_len);
  const int64_t rows = plan.rows();
  AttentionBackend& backend = session.backend();
  const size_t elem = shard.dtype == ElementType::float32 ? 4 : 2;
  const size_t q_elems = size_t(shard.batch * rows * shard.heads * shard.head_dim);
  const size_t kv_elems = size_t(shard.batch * rows * shard.kv_heads * shard.head_dim);
  // Zeros: the kernels' speed does not depend on the values (no subnormals, no NaN).
  std::vector<uint8_t> zeros(std::max(q_elems, kv_elems) * 4, 0);
  auto buffer = [&](size_t bytes) {
    DeviceBuffer b(backend, bytes);
    backend.upload(b.data(), zeros.data(), bytes);
    return b;
  };
  DeviceBuffer q = buffer(q_elems * elem), k = buffer(kv_elems * elem), v = buffer(kv_elems * elem);
  DeviceBuffer o = buffer(q_elems * 4), lse = buffer(size_t(shard.batch * shard.heads * rows) * 4);
  UlyssesAttention& attention = plan.attention();
  comm::Communicator& world = session.world();
  if (warm_up) attention.forward(q.data(), k.data(), v.data(), o.as<float>(), lse.as<float>());
  world.barrier();
  const PassStats f = attention.forward(q.data(), k.data(), v.data(), o.as<float>(), lse.as<float>());
  PassStats b;
  if (backward) {
    DeviceBuffer dout = buffer(q_elems * elem), dq = buffer(q_elems * 4), dk = buffer(kv_elems * 4),
                 dv = buffer(kv_elems * 4);
    world.barrier();
    b = attention.backward(q.data(), k.data(), v.data(), o.as<float>(), lse.as<float>(), dout.data(), dq.as<float>(),
                           dk.as<float>(), dv.as<float>(), attention.last_forward());
  }
  // The slowest rank's times, and the means over ranks of each rank's time and of its waits.
  double slowest[2] = {f.seconds, b.seconds}, sums[4] = {f.seconds, f.wait_seconds, b.seconds, b.wait_seconds};
  world.allreduce(slowest, 2, DType::f64, comm::ReduceOp::max);
  world.allreduce(sums, 4, DType::f64, comm::ReduceOp::sum);
  session.forget(plan);
  TimedPasses t;
  t.forward_s = slowest[0], t.forward_mean_s = sums[0] / P, t.forward_wait_s = sums[1] / P;
  t.backward_s = slowest[1], t.backward_mean_s = sums[2] / P, t.backward_wait_s = sums[3] / P;
  return t;
}

MachineProbe probe_machine(Session& session, const Shard& shard, const AttentionSpec& spec, int64_t seq_len,
                           bool backward, double budget_s) {
  Stopwatch clock;
  MachineProbe out;
  const int P = session.size();
  ClusterSpec& m = out.machine;
  m.name = "measured at start-up";
  const NodeMap& nodes = session.nodes();
  m.inter_links = 1;  // ranks_per_node: the caller's, from the same NodeMap

  // Points for the fit: probes at 256, 512, ... rows per rank up to the job's shard, at least two
  // (work grows as rows^2, copies and messages as rows: the fit tells the rates from the costs).
  std::vector<MeasuredPoint> points;
  const int64_t job_rows = std::max<int64_t>(seq_len / P, 2);
  for (int64_t rows = std::min<int64_t>(256, job_rows / 2);;) {
    rows = std::max<int64_t>(2, rows - rows % 2);  // zigzag-able and even
    points.push_back(probe_pass(session, shard, spec, rows, backward));
    const double wall = points.back().forward_s + points.back().backward_s;
    if (points.size() >= 2 && (rows * 2 > job_rows || wall * 2 > budget_s / 4 || clock.seconds() > budget_s / 2)) break;
    rows *= 2;
  }

  // Links: from rank 0 to the first rank of another node, and to another rank of its own.
  int other_node = -1, same_node = -1;
  for (int r = 1; r < P; ++r) {
    if (nodes.node_of_rank[r] != nodes.node_of_rank[0] && other_node < 0) other_node = r;
    if (nodes.node_of_rank[r] == nodes.node_of_rank[0] && same_node < 0) same_node = r;
  }
  const size_t step_kv = size_t(2 * shard.batch * job_rows * shard.kv_heads * shard.head_dim) *
                         (shard.dtype == ElementType::float32 ? 4 : 2);
  const size_t largest = std::clamp<size_t>(step_kv, 256 << 10, 64 << 20);
  if (same_node > 0) m.intra = probe_link(session, 0, same_node, largest);
  if (other_node > 0) m.inter = probe_link(session, 0, other_node, largest);
  else m.inter = m.intra;
  session.world().broadcast(&m.intra, sizeof m.intra, 0);
  session.world().broadcast(&m.inter, sizeof m.inter, 0);

  // What a step costs beyond its bytes when the ranks run: a ring pass of 16 rows per rank computes
  // next to nothing, so its time over its P steps is a step's latency as the ring meets it (a
  // peer's data arriving while this rank is not running: several ranks per core, other jobs). The
  // ping-pong's latency is the idle link's; the larger of the two is the model's.
  if (P > 1) {
    const MeasuredPoint tiny = probe_pass(session, shard, spec, std::min<int64_t>(16, job_rows), false);
    const double step_us = tiny.forward_s / P * 1e6;
    LinkSpec& link = other_node > 0 ? m.inter : m.intra;
    link.latency_us = std::max(link.latency_us, step_us);
    if (other_node < 0) m.inter = m.intra;
  }

  // The fit, on rank 0's numbers (every rank has the same: they were reduced), kept as every rank's.
  ClusterSpec start = m;
  start.forward_gflops = start.backward_gflops = 100.0;
  m = calibrate(points, start).machine;
  // A fit to two or three noisy points (other jobs on the cores) can put nearly all of the time
  // into the per-call and per-message costs and give a kernel rate far beyond any the passes ran
  // at. Then the largest probe's own rates (its time not waiting, as `plan --same-run` takes them)
  // are the machine's, and nothing else: a plain model beats a wild one.
  const ClusterSpec own = machine_of_run(m, points.back());
  if (m.forward_gflops > 3 * own.forward_gflops || (backward && m.backward_gflops > 3 * own.backward_gflops)) {
    const LinkSpec intra = m.intra, inter = m.inter;
    m = own;
    m.intra = intra, m.inter = inter;
  }
  m.name = "measured at start-up";

  out.seconds = clock.seconds();
  char text[256];
  std::snprintf(text, sizeof text, "measured at start-up in %.2f s of a %.3g s budget, %zu probes up to %lld rows per rank",
                out.seconds, budget_s, points.size(), static_cast<long long>(points.back().workload.seq_len / P));
  out.account = text;
  return out;
}

}  // namespace ringattn
