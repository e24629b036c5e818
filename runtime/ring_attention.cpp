#include "runtime/ring_attention.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

namespace ringattn {

namespace {

enum Purpose : int { kForwardKV = 0, kBackwardKV = 1, kGradients = 2 };

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// Double-buffered transfer state of one step parity: step k uses slots[k % 2].
struct RingAttention::Slot {
  DeviceBuffer recv_buf;       // K/V arriving for this step
  DeviceBuffer send_buf;       // direct: own rows packed for the peer
  comm::Request recv;
  comm::Request send;          // the send that reads this slot's buffers
  DeviceBuffer grad_in, grad_out;
  comm::Request grad_recv, grad_send;
};

RingAttention::RingAttention(comm::Communicator& comm, AttentionBackend& backend, const ShardLayout& layout,
                             const Mask& mask, const RingOptions& options)
    : comm_(comm),
      backend_(backend),
      layout_(layout),
      mask_(mask),
      mask_view_(mask.view()),
      options_(options),
      plan_(layout, mask_view_, options.schedule, comm.rank()),
      positions_(layout.positions(comm.rank())) {}

size_t RingAttention::kv_row_bytes() const {
  const auto& d = options_.dims;
  return static_cast<size_t>(d.kv_heads * d.head_dim * dtype_bytes(options_.dtype));
}

size_t RingAttention::kv_message_bytes(int64_t rows) const {
  return 2 * static_cast<size_t>(options_.dims.batch * rows) * kv_row_bytes();
}

uint64_t RingAttention::bytes_needed() const { return kv_message_bytes(plan_.rows_needed()); }

std::vector<int64_t> RingAttention::source_positions(int source, const std::vector<RowRange>& rows) const {
  std::vector<int64_t> pos;
  pos.reserve(static_cast<size_t>(count_rows(rows)));
  const std::vector<PositionRun> runs = layout_.runs(source);
  for (const RowRange& r : rows) {
    int64_t offset = 0;
    for (const PositionRun& run : runs) {
      for (int64_t t = std::max(r.begin, offset); t < std::min(r.end, offset + run.count); ++t)
        pos.push_back(run.start + (t - offset) * run.stride);
      offset += run.count;
    }
  }
  return pos;
}

void RingAttention::wait(comm::Request& r, const std::string& what, PassStats& stats) {
  if (!r.valid()) return;
  const double t0 = now_seconds();
  comm_.wait(r, what);
  stats.wait_seconds += now_seconds() - t0;
}

// Posts the K/V transfers of `step` (receive and send), double-buffered by step parity.
void RingAttention::post_key_values(int step, int purpose, const void* k, const void* v, std::vector<Slot>& slots,
                                    DeviceBuffer& own_shard, comm::Request& own_send) {
  const int P = layout_.ranks();
  if (step >= P) return;
  const RingStep& st = plan_.steps()[static_cast<size_t>(step)];
  Slot& slot = slots[static_cast<size_t>(step % 2)];
  comm_.wait(slot.send, "a send of step " + std::to_string(step - 2) + " to finish");  // frees this slot
  const int64_t B = options_.dims.batch, rows = this->rows();
  const size_t row_bytes = kv_row_bytes();
  if (st.recv_peer >= 0)
    slot.recv = comm_.irecv(slot.recv_buf.data(), kv_message_bytes(st.recv_rows), st.recv_peer, tag(step, purpose));
  if (st.send_peer < 0) return;

  const int64_t n = count_rows(st.send_rows);
  if (options_.schedule == Schedule::direct) {
    char* out = slot.send_buf.as<char>();
    backend_.gather_rows(out, k, B, rows, row_bytes, st.send_rows);
    backend_.gather_rows(out + B * n * row_bytes, v, B, rows, row_bytes, st.send_rows);
    backend_.synchronize();
    slot.send = comm_.isend(out, kv_message_bytes(n), st.send_peer, tag(step, purpose));
  } else if (step == 1) {  // the relay starts with this rank's own shard
    char* out = own_shard.as<char>();
    backend_.gather_rows(out, k, B, rows, row_bytes, st.send_rows);
    backend_.gather_rows(out + B * n * row_bytes, v, B, rows, row_bytes, st.send_rows);
    backend_.synchronize();
    own_send = comm_.isend(out, kv_message_bytes(n), st.send_peer, tag(step, purpose));
  } else {  // pass on the shard received at the previous step
    Slot& held = slots[static_cast<size_t>((step - 1) % 2)];
    held.send = comm_.isend(held.recv_buf.data(), kv_message_bytes(n), st.send_peer, tag(step, purpose));
  }
}

PassStats RingAttention::forward(const void* q, const void* k, const void* v, float* o, float* lse) {
  PassStats stats;
  const double t_start = now_seconds();
  const uint64_t sent_before = comm_.bytes_sent();
  const auto& dims = options_.dims;
  const int P = layout_.ranks();
  const int64_t rows = this->rows();
  const int64_t B = dims.batch, H = dims.heads;
  const auto progress = [this] { comm_.progress(); };

  backend_.zero(o, sizeof(float) * static_cast<size_t>(B * rows * H * dims.head_dim));
  backend_.fill(lse, static_cast<size_t>(B * H * rows), -std::numeric_limits<float>::infinity());

  int64_t max_rows = 0;
  for (const RingStep& st : plan_.steps()) max_rows = std::max({max_rows, st.recv_rows, count_rows(st.send_rows)});
  std::vector<Slot> slots(2);
  for (Slot& s : slots) {
    s.recv_buf = DeviceBuffer(backend_, kv_message_bytes(max_rows));
    if (options_.schedule == Schedule::direct) s.send_buf = DeviceBuffer(backend_, kv_message_bytes(max_rows));
  }
  DeviceBuffer own_shard(backend_, options_.schedule == Schedule::ring && P > 1 ? kv_message_bytes(rows) : 0);
  comm::Request own_send;

  const kernels::QueryRows queries{q, options_.dtype, rows, positions_.data()};
  const kernels::AttentionState state{o, lse};
  auto compute = [&](const void* kk, const void* vv, int64_t n, const int64_t* pos) {
    const double t0 = now_seconds();
    backend_.forward(dims, queries, kernels::KeyValueRows{kk, vv, options_.dtype, n, pos}, mask_view_, state,
                     progress);
    stats.compute_seconds += now_seconds() - t0;
    ++stats.compute_steps;
  };

  post_key_values(1, kForwardKV, k, v, slots, own_shard, own_send);
  compute(k, v, rows, positions_.data());
  if (on_step) on_step(1, P);
  for (int step = 1; step < P; ++step) {
    const RingStep& st = plan_.steps()[static_cast<size_t>(step)];
    Slot& slot = slots[static_cast<size_t>(step % 2)];
    // Direct: the next step's buffers are free already, so post before waiting. Ring: the relay
    // forwards what this step receives, so it can only be posted once it arrived.
    if (options_.schedule == Schedule::direct) post_key_values(step + 1, kForwardKV, k, v, slots, own_shard, own_send);
    wait(slot.recv, "K/V of step " + std::to_string(step) + " from rank " + std::to_string(st.recv_peer), stats);
    if (options_.schedule == Schedule::ring) post_key_values(step + 1, kForwardKV, k, v, slots, own_shard, own_send);
    if (st.source >= 0) {
      const std::vector<int64_t> pos = source_positions(st.source, st.source_rows);
      const int64_t n = static_cast<int64_t>(pos.size());
      const char* buf = slot.recv_buf.as<char>();
      compute(buf, buf + B * n * kv_row_bytes(), n, pos.data());
    }
    if (on_step) on_step(step + 1, P);
  }
  for (Slot& s : slots) wait(s.send, "forward sends to finish", stats);
  wait(own_send, "forward sends to finish", stats);
  backend_.synchronize();
  stats.bytes_sent = comm_.bytes_sent() - sent_before;
  stats.seconds = now_seconds() - t_start;
  return stats;
}

PassStats RingAttention::backward(const void* q, const void* k, const void* v, const float* o, const float* lse,
                                  const void* dout, float* dq, float* dk, float* dv) {
  PassStats stats;
  const double t_start = now_seconds();
  const uint64_t sent_before = comm_.bytes_sent();
  const auto& dims = options_.dims;
  const int P = layout_.ranks();
  const int rank = comm_.rank();
  const int64_t rows = this->rows();
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim;
  const int64_t grad_row = Hkv * D;  // fp32 elements of one dK (or dV) row
  auto grad_bytes = [&](int64_t n) { return 2 * sizeof(float) * static_cast<size_t>(B * n * grad_row); };
  const auto progress = [this] { comm_.progress(); };
  const bool ring = options_.schedule == Schedule::ring;

  backend_.zero(dq, sizeof(float) * static_cast<size_t>(B * rows * H * D));
  backend_.zero(dk, sizeof(float) * static_cast<size_t>(B * rows * grad_row));
  backend_.zero(dv, sizeof(float) * static_cast<size_t>(B * rows * grad_row));
  DeviceBuffer delta(backend_, sizeof(float) * static_cast<size_t>(B * H * rows));
  backend_.delta(dims, rows, o, dout, options_.dtype, delta.as<float>());

  int64_t max_rows = 0;
  for (const RingStep& st : plan_.steps()) max_rows = std::max({max_rows, st.recv_rows, count_rows(st.send_rows)});
  if (ring) max_rows = std::max(max_rows, layout_.max_rows());
  std::vector<Slot> slots(2);
  for (Slot& s : slots) {
    s.recv_buf = DeviceBuffer(backend_, kv_message_bytes(max_rows));
    if (!ring) s.send_buf = DeviceBuffer(backend_, kv_message_bytes(max_rows));
    s.grad_in = DeviceBuffer(backend_, grad_bytes(max_rows));
    s.grad_out = DeviceBuffer(backend_, grad_bytes(max_rows));
  }
  DeviceBuffer own_shard(backend_, ring && P > 1 ? kv_message_bytes(rows) : 0);
  comm::Request own_send;

  const kernels::QueryRows queries{q, options_.dtype, rows, positions_.data()};
  auto compute = [&](const void* kk, const void* vv, int64_t n, const int64_t* pos, float* gk, float* gv) {
    const double t0 = now_seconds();
    backend_.backward(dims, queries, kernels::KeyValueRows{kk, vv, options_.dtype, n, pos}, dout, lse,
                      delta.as<float>(), dq, gk, gv, mask_view_, progress);
    stats.compute_seconds += now_seconds() - t0;
    ++stats.compute_steps;
  };
  // Direct: partial dK/dV for this rank's rows, computed by rank + k at step k, added in step
  // order one step later (so the wait overlaps the next step's compute).
  auto absorb_direct = [&](int step) {
    const RingStep& st = plan_.steps()[static_cast<size_t>(step)];
    if (st.send_peer < 0) return;
    Slot& slot = slots[static_cast<size_t>(step % 2)];
    wait(slot.grad_recv, "dK/dV of step " + std::to_string(step) + " from rank " + std::to_string(st.send_peer),
         stats);
    const int64_t n = count_rows(st.send_rows);
    const float* part = slot.grad_in.as<float>();
    backend_.scatter_add_rows(dk, part, B, rows, grad_row, st.send_rows);
    backend_.scatter_add_rows(dv, part + B * n * grad_row, B, rows, grad_row, st.send_rows);
  };

  post_key_values(1, kBackwardKV, k, v, slots, own_shard, own_send);
  compute(k, v, rows, positions_.data(), dk, dv);
  if (on_step) on_step(1, P);
  for (int step = 1; step < P; ++step) {
    const RingStep& st = plan_.steps()[static_cast<size_t>(step)];
    Slot& slot = slots[static_cast<size_t>(step % 2)];
    const int source = (rank - step + P) % P;
    const int64_t n = ring ? layout_.rows(source) : st.recv_rows;
    // Gradients arriving at this step: direct, from the rank we sent K/V to; ring, the running
    // sum for the shard we now hold, from the previous rank.
    if (!ring && st.send_peer >= 0)
      slot.grad_recv = comm_.irecv(slot.grad_in.data(), grad_bytes(count_rows(st.send_rows)), st.send_peer,
                                   tag(step, kGradients));
    if (ring && step >= 2)
      slot.grad_recv = comm_.irecv(slot.grad_in.data(), grad_bytes(n), (rank - 1 + P) % P, tag(step - 1, kGradients));
    if (!ring) post_key_values(step + 1, kBackwardKV, k, v, slots, own_shard, own_send);
    wait(slot.recv, "K/V of step " + std::to_string(step) + " from rank " + std::to_string(st.recv_peer), stats);
    if (ring) post_key_values(step + 1, kBackwardKV, k, v, slots, own_shard, own_send);

    wait(slot.grad_send, "a gradient send of step " + std::to_string(step - 2), stats);
    float* part = slot.grad_out.as<float>();
    const bool sends_back = ring || st.source >= 0;
    if (sends_back) backend_.zero(part, grad_bytes(n));
    if (st.source >= 0) {
      const std::vector<int64_t> pos = source_positions(st.source, st.source_rows);
      const char* buf = slot.recv_buf.as<char>();
      compute(buf, buf + B * n * kv_row_bytes(), n, pos.data(), part, part + B * n * grad_row);
    }
    if (ring && step >= 2) {
      wait(slot.grad_recv, "dK/dV running sum of step " + std::to_string(step - 1) + " from rank " +
                               std::to_string((rank - 1 + P) % P),
           stats);
      backend_.add(part, slot.grad_in.as<float>(), static_cast<size_t>(2 * B * n * grad_row));
    }
    if (sends_back) {
      backend_.synchronize();
      const int to = ring ? (rank + 1) % P : st.source;
      slot.grad_send = comm_.isend(part, grad_bytes(n), to, tag(step, kGradients));
    }
    if (!ring && step >= 2) absorb_direct(step - 1);
    if (on_step) on_step(step + 1, P);
  }
  if (!ring && P >= 2) absorb_direct(P - 1);
  if (ring && P >= 2) {  // the running sum of this rank's own shard comes home after P - 1 hops
    DeviceBuffer home(backend_, grad_bytes(rows));
    comm::Request r = comm_.irecv(home.data(), grad_bytes(rows), (rank - 1 + P) % P, tag(P - 1, kGradients));
    wait(r, "dK/dV of this rank's shard from rank " + std::to_string((rank - 1 + P) % P), stats);
    backend_.add(dk, home.as<float>(), static_cast<size_t>(B * rows * grad_row));
    backend_.add(dv, home.as<float>() + B * rows * grad_row, static_cast<size_t>(B * rows * grad_row));
  }
  for (Slot& s : slots) {
    wait(s.send, "backward sends to finish", stats);
    wait(s.grad_send, "gradient sends to finish", stats);
  }
  wait(own_send, "backward sends to finish", stats);
  backend_.synchronize();
  stats.bytes_sent = comm_.bytes_sent() - sent_before;
  stats.seconds = now_seconds() - t_start;
  return stats;
}

}  // namespace ringattn
