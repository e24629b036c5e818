#include "launch/plan/cluster_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "launch/plan/cluster_sim.hpp"

namespace ringattn {

// ---- Scaling efficiency ----

double scaling_efficiency(const ScalingSample& point, const ScalingSample& base) {
  if (point.seconds <= 0 || base.seconds <= 0 || base.flops <= 0 || point.ranks < 1 || base.ranks < 1) return 0.0;
  const double per_rank = point.flops / (double(point.ranks) * point.seconds);
  const double base_per_rank = base.flops / (double(base.ranks) * base.seconds);
  return per_rank / base_per_rank;
}

// ---- Visible pairs between shards ----

namespace {

using int128 = __int128;

// sum_{u=0}^{n-1} floor((a*u + b) / m) for n, a, b >= 0 and m > 0 (the Euclid-like reduction:
// take the whole multiples out, then swap the roles of the slope and the modulus).
int128 floor_sum(int128 n, int128 m, int128 a, int128 b) {
  int128 total = 0;
  while (n > 0) {
    if (a >= m) {
      total += n * (n - 1) / 2 * (a / m);
      a %= m;
    }
    if (b >= m) {
      total += n * (b / m);
      b %= m;
    }
    const int128 top = a * n + b;
    if (top < m) break;
    n = top / m;
    b = top % m;
    std::swap(m, a);
  }
  return total;
}

int64_t ceil_div(int64_t x, int64_t y) { return x >= 0 ? (x + y - 1) / y : -((-x) / y); }
int64_t floor_div(int64_t x, int64_t y) { return x >= 0 ? x / y : -((-x + y - 1) / y); }

// The part of a run whose positions lie in [lo, hi] (count 0 when none).
PositionRun restrict_run(const PositionRun& r, int64_t lo, int64_t hi) {
  if (r.count == 0 || hi < lo) return {r.start, 0, r.stride};
  const int64_t t0 = std::max<int64_t>(0, ceil_div(lo - r.start, r.stride));
  const int64_t t1 = std::min<int64_t>(r.count - 1, floor_div(hi - r.start, r.stride));
  if (t0 > t1) return {r.start, 0, r.stride};
  return {r.start + t0 * r.stride, t1 - t0 + 1, r.stride};
}

// sum over the queries i of q of #{keys of k at positions <= i + offset}.
int128 keys_up_to(const PositionRun& q, const PositionRun& k, int64_t offset) {
  if (q.count == 0 || k.count == 0) return 0;
  const int64_t s = q.count > 1 ? q.stride : 1, t = k.count > 1 ? k.stride : 1;
  // Keys at or below x: clamp(floor((x - k.start) / t) + 1, 0, k.count), nondecreasing in the query.
  const int64_t c = q.start + offset - k.start;  // x - k.start = s*u + c for query u
  const int64_t u0 = std::clamp<int64_t>(ceil_div(-c, s), 0, q.count);  // first with >= 1 key
  const int64_t u1 = std::clamp<int64_t>(ceil_div((k.count - 1) * t - c, s), u0, q.count);  // first with all
  const int64_t n = u1 - u0;
  int128 total = int128(q.count - u1) * k.count + n;
  if (n > 0) total += floor_sum(n, t, s, int128(s) * u0 + c);
  return total;
}

// Pairs between two runs under causal / window limits only (every key of k lies in one document).
int128 run_pairs(const MaskView& m, const PositionRun& q, const PositionRun& k) {
  // Query i sees keys in [i - left, i + right_end] (clipped; both ends always contain i).
  const bool bounded_right = m.causal || m.window_right >= 0;
  const int64_t right = m.causal ? (m.window_right >= 0 ? std::min<int64_t>(0, m.window_right) : 0) : m.window_right;
  int128 upto = bounded_right ? keys_up_to(q, k, right) : int128(q.count) * k.count;
  if (m.window_left >= 0) upto -= keys_up_to(q, k, -m.window_left - 1);
  return upto;
}

// One pass over the queries, for block masks.
int64_t block_mask_pairs(const MaskView& m, const PositionRun& q, const PositionRun& k, int64_t seq_len) {
  int64_t pairs = 0;
  for (int64_t u = 0; u < q.count; ++u) pairs += count_visible_keys(m, q.start + u * q.stride, k, seq_len);
  return pairs;
}

}  // namespace

int64_t count_pairs_between(const MaskView& mask, const std::vector<PositionRun>& queries,
                            const std::vector<PositionRun>& keys, int64_t seq_len) {
  int128 total = 0;
  for (const PositionRun& q0 : queries)
    for (const PositionRun& k0 : keys) {
      const PositionRun q = restrict_run(q0, 0, seq_len - 1), k = restrict_run(k0, 0, seq_len - 1);
      if (q.count == 0 || k.count == 0) continue;
      if (mask.has_block_mask()) {
        total += block_mask_pairs(mask, q, k, seq_len);
      } else if (!mask.has_docs()) {
        total += run_pairs(mask, q, k);
      } else {  // document by document: within one, only causal and window limits remain
        const int64_t first = document_of(mask, std::max(q.start, k.start));
        const int64_t last = document_of(mask, std::min(q.last(), k.last()));
        for (int64_t d = first; d <= last; ++d) {
          const int64_t lo = mask.doc_offsets[d], hi = mask.doc_offsets[d + 1] - 1;
          total += run_pairs(mask, restrict_run(q, lo, hi), restrict_run(k, lo, hi));
        }
      }
    }
  return static_cast<int64_t>(total);
}

// ---- Memory ----

uint64_t memory_per_rank(const Workload& w, const ShardLayout& layout, const RingPlan& plan) {
  const double B = double(w.batch), rows = double(layout.rows(plan.rank()));
  const double q_row = double(w.heads * w.head_dim), kv_row = double(w.kv_heads * w.head_dim);
  const double dt = double(w.dtype_bytes);
  int64_t max_rows = 0;  // as RingAttention's constructor sizes its buffers
  for (const RingStep& st : plan.steps()) max_rows = std::max({max_rows, st.recv_rows, count_rows(st.send_rows)});
  const bool ring = plan.schedule() == Schedule::ring, several = layout.ranks() > 1;
  if (ring) max_rows = std::max(max_rows, layout.max_rows());

  double inputs = B * rows * (q_row + 2 * kv_row) * dt;              // q, k, v
  double outputs = B * rows * q_row * 4 + B * double(w.heads) * rows * 4;  // o, lse
  // The ring's buffers, allocated once per RingAttention and used by both passes: K/V receive
  // (and, direct, send) slots, the relay's own shard; backward adds dK/dV in and out slots and delta.
  double buffers = several ? 2 * kv_bytes(w, max_rows) * (ring ? 1 : 2) : 0.0;
  if (several && ring) buffers += kv_bytes(w, int64_t(rows));
  if (w.backward) {
    inputs += B * rows * q_row * dt;                            // dout
    outputs += B * rows * (q_row + 2 * kv_row) * 4;             // dq, dk, dv
    const double grad = 2 * B * double(max_rows) * kv_row * 4;  // one dK/dV message
    buffers += (several ? 4 * grad : 0.0) + B * double(w.heads) * rows * 4;
  }
  return static_cast<uint64_t>(inputs + outputs + buffers);
}

// ---- Prediction ----

Prediction predict(const ClusterSpec& cluster, const Workload& w, const MaskView& mask, int ranks) {
  const ShardLayout layout(w.layout, w.seq_len, ranks);
  const ClusterWork work = build_cluster_work(w, layout, mask);
  Prediction p;
  p.ranks = ranks;
  p.flops_forward = work.flops_forward;
  p.bytes_sent = static_cast<uint64_t>(work.bytes_sent);
  p.bytes_needed = static_cast<uint64_t>(work.bytes_needed);
  p.memory_bytes = work.memory_bytes;
  p.fits_memory = cluster.memory_gib <= 0 || double(work.memory_bytes) <= cluster.memory_gib * double(1ull << 30);

  const ClusterSimulation sim(cluster, w, work);
  p.forward = sim.forward();
  if (w.backward) p.backward = sim.backward();
  p.step_compute_seconds = sim.typical_step_compute();
  p.step_transfer_seconds = sim.typical_step_transfer();

  double ideal = work.flops_forward / double(ranks) / (cluster.forward_gflops * 1e9);
  if (w.backward) ideal += 2.5 * work.flops_forward / double(ranks) / (cluster.backward_gflops * 1e9);
  p.efficiency = p.total_seconds() > 0 ? ideal / p.total_seconds() : 0.0;
  return p;
}

}  // namespace ringattn
