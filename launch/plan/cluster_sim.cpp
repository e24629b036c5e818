#include "launch/plan/cluster_sim.hpp"

#include <algorithm>
#include <limits>

#include "launch/cli/statistics.hpp"

namespace ringattn {

ClusterWork build_cluster_work(const Workload& w, const ShardLayout& layout, const MaskView& mask) {
  const int P = layout.ranks();
  const int64_t L = layout.seq_len();
  const double flops_per_pair = 4.0 * double(w.batch * w.heads * w.head_dim);
  const double grad_row_bytes = 2.0 * double(w.batch * w.kv_heads * w.head_dim) * 4.0;  // fp32 dK and dV
  ClusterWork cw;
  cw.ranks = P;
  cw.rows.resize(static_cast<size_t>(P));
  cw.steps.assign(static_cast<size_t>(P), std::vector<StepWork>(static_cast<size_t>(P)));
  std::vector<std::vector<PositionRun>> runs(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    runs[size_t(r)] = layout.runs(r);
    cw.rows[size_t(r)] = layout.rows(r);
  }
  for (int r = 0; r < P; ++r) {
    const RingPlan plan(layout, mask, w.schedule, r);
    cw.memory_bytes = std::max(cw.memory_bytes, memory_per_rank(w, layout, plan));
    cw.bytes_needed += kv_bytes(w, plan.rows_needed());
    for (int k = 0; k < P; ++k) {
      const RingStep& st = plan.steps()[size_t(k)];
      StepWork& s = cw.steps[size_t(r)][size_t(k)];
      s.source = st.source;
      if (s.source >= 0)
        s.flops = flops_per_pair * double(count_pairs_between(mask, runs[size_t(r)], runs[size_t(s.source)], L));
      cw.flops_forward += s.flops;
      if (k == 0) continue;
      s.recv_peer = st.recv_peer;
      s.recv_bytes = st.recv_peer >= 0 ? kv_bytes(w, st.recv_rows) : 0.0;
      s.send_peer = st.send_peer;
      s.send_bytes = st.send_peer >= 0 ? kv_bytes(w, count_rows(st.send_rows)) : 0.0;
      cw.bytes_sent += s.send_bytes;
      if (w.schedule == Schedule::direct) {
        s.pack_bytes = s.send_bytes;  // own rows gathered for the peer
        s.grad_bytes = s.source >= 0 ? grad_row_bytes * double(st.recv_rows) : 0.0;
      } else {
        s.pack_bytes = k == 1 ? s.send_bytes : 0.0;  // the relay starts from a packed own shard
        s.grad_bytes = grad_row_bytes * double(layout.rows((r - k + P) % P));  // relayed even if unseen
      }
    }
  }
  return cw;
}

namespace {
constexpr double kInfinite = std::numeric_limits<double>::infinity();
}  // namespace

// One rank's clock and what its time went to.
struct ClusterSimulation::Tally {
  double t = 0.0, compute = 0.0, wait = 0.0, host = 0.0;
  PassCounts counts;

  void wait_until(double when) {
    if (when > t) wait += when - t, t = when;
  }
  void host_work(const ClusterSpec& c, double bytes, int messages) {
    const double s = (c.host_copy_gbps > 0 ? bytes / (c.host_copy_gbps * 1e9) : 0.0) + messages * c.message_overhead_us * 1e-6;
    t += s, host += s;
    counts.host_bytes += bytes;
    counts.messages += messages;
  }
};

ClusterSimulation::ClusterSimulation(const ClusterSpec& cluster, const Workload& w, const ClusterWork& work)
    : cluster_(cluster), w_(w), work_(work), P_(work.ranks) {
  const int per_node = std::max(1, cluster.ranks_per_node);
  const int nodes = (P_ + per_node - 1) / per_node;
  off_node_senders_.assign(size_t(P_), std::vector<int>(size_t(nodes), 0));
  for (int r = 0; r < P_; ++r)
    for (int k = 1; k < P_; ++k) {
      const int to = work_.steps[size_t(r)][size_t(k)].send_peer;
      if (to >= 0 && to / per_node != r / per_node) ++off_node_senders_[size_t(k)][size_t(r / per_node)];
    }
}

void ClusterSimulation::link(int from, int to, int k, double& latency, double& bandwidth) const {
  const int per_node = std::max(1, cluster_.ranks_per_node);
  if (from / per_node == to / per_node) {
    latency = cluster_.intra.latency_us * 1e-6;
    bandwidth = cluster_.intra.gbps > 0 ? cluster_.intra.gbps * 1e9 : kInfinite;
    return;
  }
  latency = cluster_.inter.latency_us * 1e-6;
  const double node = cluster_.inter.gbps > 0 ? cluster_.inter.gbps * 1e9 : kInfinite;
  const int sharing = std::max(1, off_node_senders_[size_t(k)][size_t(from / per_node)]);
  bandwidth = std::min(node / std::max(1, cluster_.inter_links), node / sharing);
}

double ClusterSimulation::compute_seconds(const StepWork& s, bool backward) const {
  const double flops = backward ? 2.5 * s.flops : s.flops;
  const double rate = (backward ? cluster_.backward_gflops : cluster_.forward_gflops) * 1e9;
  return flops / rate + cluster_.step_overhead_us * 1e-6;
}

PassPrediction ClusterSimulation::run(bool backward, PassCounts* counts) const {
  const int P = P_;
  const bool ring = w_.schedule == Schedule::ring;
  const auto& S = work_.steps;
  auto step = [&](int r, int k) -> const StepWork& { return S[size_t(r)][size_t(k)]; };
  std::vector<Tally> ranks(static_cast<size_t>(P));
  std::vector<double> out_free(size_t(P), 0.0), in_free(size_t(P), 0.0);
  auto grid = [&] { return std::vector<std::vector<double>>(size_t(P), std::vector<double>(size_t(P) + 1, 0.0)); };
  // [rank][step]: when K/V were posted, arrived, and the sender saw its send complete; likewise
  // for the gradient messages of the backward pass.
  auto posted = grid(), arrived = grid(), sent = grid();
  auto grad_posted = grid(), grad_recv_posted = grid(), grad_sent = grid();
  std::vector<double> home_recv_posted(size_t(P), 0.0);

  // A message occupies the sender's outgoing and the receiver's incoming link from the moment
  // both ends posted it and both links are free; it arrives `latency` after it left.
  auto transfer = [&](int from, int to, int k, double bytes, double t_send, double t_recv) {
    double latency = 0.0, bandwidth = kInfinite;
    link(from, to, k, latency, bandwidth);
    const double start = std::max({t_send, t_recv, out_free[size_t(from)], in_free[size_t(to)]});
    const double done = start + bytes / bandwidth;
    out_free[size_t(from)] = in_free[size_t(to)] = done;
    return done + latency;
  };
  auto compute = [&](int r, const StepWork& s) {
    Tally& T = ranks[size_t(r)];
    const double c = compute_seconds(s, backward);
    T.t += c, T.compute += c;
    T.counts.compute_steps += 1;
    T.counts.gflop += (backward ? 2.5 : 1.0) * s.flops / 1e9;
  };
  auto post_key_values = [&](int r, int k) {  // RingAttention::post_key_values
    if (k >= P) return;
    const StepWork& s = step(r, k);
    // Host bytes: the rows packed, and (CPU transports) the message copied out and in.
    ranks[size_t(r)].host_work(cluster_, s.pack_bytes + s.send_bytes + s.recv_bytes, (s.recv_peer >= 0) + (s.send_peer >= 0));
    posted[size_t(r)][size_t(k)] = ranks[size_t(r)].t;
  };
  // Direct backward: partial dK/dV for r's rows from the rank r sent K/V to at step k.
  auto absorb = [&](int r, int k) {
    const int from = step(r, k).send_peer;
    if (from < 0) return;
    const double bytes = step(from, k).grad_bytes;
    const double at = transfer(from, r, k, bytes, grad_posted[size_t(from)][size_t(k)], grad_recv_posted[size_t(r)][size_t(k)]);
    grad_sent[size_t(from)][size_t(k)] = at;
    ranks[size_t(r)].wait_until(at);
    ranks[size_t(r)].host_work(cluster_, 2 * bytes, 0);  // copied in, added
  };

  const double B = double(w_.batch), H = double(w_.heads), D = double(w_.head_dim);
  const double kv_row = double(w_.kv_heads) * D;
  for (int r = 0; r < P; ++r) {  // zero the outputs (backward: also delta = rowsum(dO * O))
    const double rows = double(work_.rows[size_t(r)]);
    const double bytes = backward ? B * rows * ((H * D + 2 * kv_row) * 4 + H * D * (4 + double(w_.dtype_bytes)) + H * 4)
                                  : B * rows * (H * D * 4 + H * 4);
    ranks[size_t(r)].host_work(cluster_, bytes, 0);
    post_key_values(r, 1);
    compute(r, step(r, 0));
  }
  for (int k = 1; k < P; ++k) {
    for (int r = 0; r < P; ++r) {  // the K/V of step k
      const StepWork& s = step(r, k);
      if (s.recv_peer < 0) continue;
      const double at = transfer(s.recv_peer, r, k, s.recv_bytes, posted[size_t(s.recv_peer)][size_t(k)], posted[size_t(r)][size_t(k)]);
      arrived[size_t(r)][size_t(k)] = at;
      sent[size_t(s.recv_peer)][size_t(k)] = at;
    }
    for (int r = 0; r < P; ++r) {
      Tally& T = ranks[size_t(r)];
      const StepWork& s = step(r, k);
      if (!ring && k + 1 < P) {  // direct: the next step's buffers are free once its send of k-1 is done
        T.wait_until(sent[size_t(r)][size_t(k - 1)]);
        post_key_values(r, k + 1);
      }
      if (s.recv_peer >= 0) T.wait_until(arrived[size_t(r)][size_t(k)]);
      if (s.send_peer >= 0) T.wait_until(sent[size_t(r)][size_t(k)]);  // the step completes as a unit
      if (ring && k + 1 < P) {  // ring: relay what arrived, once the previous relay left
        T.wait_until(sent[size_t(r)][size_t(k)]);
        post_key_values(r, k + 1);
      }
      if (!backward) {
        if (s.source >= 0) compute(r, s);
        continue;
      }
      if (k >= 2) T.wait_until(grad_sent[size_t(r)][size_t(k - 2)]);  // its buffer is reused
      const bool sends_back = ring || s.source >= 0;
      if (sends_back) T.host_work(cluster_, s.grad_bytes, 0);  // zero the partial dK/dV
      if (s.source >= 0) compute(r, s);
      if (ring && k >= 2) {  // add the running sum arriving from the previous rank
        const int from = (r - 1 + P) % P;
        const double at = transfer(from, r, k - 1, step(from, k - 1).grad_bytes, grad_posted[size_t(from)][size_t(k - 1)],
                                   grad_recv_posted[size_t(r)][size_t(k)]);
        grad_sent[size_t(from)][size_t(k - 1)] = at;
        T.wait_until(at);
        T.host_work(cluster_, 2 * s.grad_bytes, 0);  // copied in, added
      }
      if (sends_back) {
        T.host_work(cluster_, s.grad_bytes, 1);  // copied out
        grad_posted[size_t(r)][size_t(k)] = T.t;
      }
      // The gradient step's receive, posted with its send: direct, the partial of r's rows
      // computed at step k; ring, the running sum r holds at step k + 1 (home after P - 1).
      if (ring || s.send_peer >= 0) {
        T.host_work(cluster_, 0.0, 1);
        if (ring && k + 1 < P) grad_recv_posted[size_t(r)][size_t(k + 1)] = T.t;
        if (ring && k + 1 == P) home_recv_posted[size_t(r)] = T.t;
        if (!ring) grad_recv_posted[size_t(r)][size_t(k)] = T.t;
      }
      if (!ring && k >= 2) absorb(r, k - 1);
    }
  }
  if (backward && P > 1) {
    for (int r = 0; r < P; ++r) {
      if (!ring) {
        absorb(r, P - 1);
        continue;
      }
      Tally& T = ranks[size_t(r)];  // this shard's sum comes home after P - 1 hops
      const int from = (r - 1 + P) % P;
      const double at = transfer(from, r, P - 1, step(from, P - 1).grad_bytes, grad_posted[size_t(from)][size_t(P - 1)],
                                 home_recv_posted[size_t(r)]);
      grad_sent[size_t(from)][size_t(P - 1)] = at;
      T.wait_until(at);
      T.host_work(cluster_, 2 * 2.0 * B * double(work_.rows[size_t(r)]) * kv_row * 4.0, 0);  // copied in, added
    }
  }

  PassPrediction out;
  PassCounts mean_counts;
  for (int r = 0; r < P; ++r) {  // every send must have left
    Tally& T = ranks[size_t(r)];
    for (int k = 1; k < P; ++k) {
      if (step(r, k).send_peer >= 0) T.wait_until(sent[size_t(r)][size_t(k)]);
      if (backward) T.wait_until(grad_sent[size_t(r)][size_t(k)]);
    }
    out.seconds = std::max(out.seconds, T.t);
    out.mean_seconds += T.t / P;
    out.compute_seconds += T.compute / P;
    out.wait_seconds += T.wait / P;
    out.host_seconds += T.host / P;
    out.exposed_fraction += (T.t > 0 ? T.wait / T.t : 0.0) / P;
    mean_counts.gflop += T.counts.gflop / P;
    mean_counts.compute_steps += T.counts.compute_steps / P;
    mean_counts.host_bytes += T.counts.host_bytes / P;
    mean_counts.messages += T.counts.messages / P;
  }
  if (counts) *counts = mean_counts;
  return out;
}

PassCounts ClusterSimulation::forward_counts() const {
  PassCounts c;
  run(false, &c);
  return c;
}

PassCounts ClusterSimulation::backward_counts() const {
  PassCounts c;
  run(true, &c);
  return c;
}

double ClusterSimulation::typical_step_compute() const {
  if (P_ == 1) return compute_seconds(work_.steps[0][0], false);
  std::vector<double> per_step;
  for (int k = 1; k < P_; ++k) {
    double worst = 0.0;
    for (int r = 0; r < P_; ++r) {
      const StepWork& s = work_.steps[size_t(r)][size_t(k)];
      if (s.source >= 0) worst = std::max(worst, compute_seconds(s, false));
    }
    per_step.push_back(worst);
  }
  return median_of(per_step);
}

double ClusterSimulation::typical_step_transfer() const {
  std::vector<double> per_step;
  for (int k = 1; k < P_; ++k) {
    double worst = 0.0;
    for (int r = 0; r < P_; ++r) {
      const StepWork& s = work_.steps[size_t(r)][size_t(k)];
      if (s.recv_peer < 0) continue;
      double latency = 0.0, bandwidth = kInfinite;
      link(s.recv_peer, r, k, latency, bandwidth);
      worst = std::max(worst, latency + s.recv_bytes / bandwidth);
    }
    per_step.push_back(worst);
  }
  return per_step.empty() ? 0.0 : median_of(per_step);
}

}  // namespace ringattn
