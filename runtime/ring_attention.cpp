#include "runtime/ring_attention.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "runtime/errors.hpp"
#include "util/stopwatch.hpp"

namespace ringattn {

namespace {

// This rank's position among `ranks` (empty: its rank).
int position_of(const comm::Communicator& comm, const std::vector<int>& ranks, int layout_ranks) {
  if (ranks.empty()) {
    if (layout_ranks != comm.size())
      throw std::invalid_argument("RingAttention: a layout over " + std::to_string(layout_ranks) +
                                  " ranks on a communicator of " + std::to_string(comm.size()));
    return comm.rank();
  }
  if (ranks.size() != static_cast<size_t>(layout_ranks))
    throw std::invalid_argument("RingAttention: " + std::to_string(ranks.size()) + " ring ranks for a layout over " +
                                std::to_string(layout_ranks));
  const auto it = std::find(ranks.begin(), ranks.end(), comm.rank());
  if (it == ranks.end()) throw std::invalid_argument("RingAttention: this rank is not one of the ring's ranks");
  return static_cast<int>(it - ranks.begin());
}

void count_step(PassStats& stats, StepKernel ran) {
  ++stats.compute_steps;
  ++(ran == StepKernel::cudnn ? stats.cudnn_steps : stats.own_steps);
}

}  // namespace

RingAttention::RingAttention(comm::Communicator& comm, AttentionBackend& backend, const ShardLayout& layout,
                             const Mask& mask, const RingOptions& options, std::vector<int> ranks)
    : comm_(comm),
      ranks_(std::move(ranks)),
      position_(position_of(comm, ranks_, layout.ranks())),
      backend_(backend),
      layout_(layout),
      mask_(mask),
      mask_view_(mask.view()),
      options_(options),
      plan_(layout, mask_view_, options.schedule, position_),
      positions_(layout.positions(position_)) {
  const int P = layout_.ranks();
  const bool ring = options_.schedule == Schedule::ring;
  for (const RingStep& st : plan_.steps()) max_rows_ = std::max({max_rows_, st.recv_rows, count_rows(st.send_rows)});
  if (ring) max_rows_ = std::max(max_rows_, layout_.max_rows());  // backward relays whole shards' sums
  if (P > 1)
    for (int i = 0; i < 2; ++i) {
      kv_in_[i] = DeviceBuffer(backend_, kv_message_bytes(max_rows_));
      if (!ring) kv_out_[i] = DeviceBuffer(backend_, kv_message_bytes(max_rows_));
    }
  if (ring && P > 1) own_shard_ = DeviceBuffer(backend_, kv_message_bytes(rows()));
  prepare_backend();
}

RingAttention::~RingAttention() { backend_.forget_steps(step_ids_); }

// Device copies of the mask, room for the positions of every step and the kernels' workspace (on
// the cuDNN path: every step's calls and graphs), so that no kernel call of a pass allocates.
void RingAttention::prepare_backend() {
  PrepareRequest request;
  request.dims = options_.dims;
  request.dtype = options_.dtype;
  request.mask = mask_view_;
  request.max_rows = std::max(max_rows_, rows());
  request.kernel = options_.kernel;
  request.deterministic = options_.deterministic;
  std::vector<std::vector<int64_t>> keys(plan_.steps().size());
  std::vector<size_t> steps;  // the step of each request entry
  for (const RingStep& st : plan_.steps()) {
    if (st.source < 0) continue;
    std::vector<int64_t>& k = keys[size_t(st.step)];
    k = st.step == 0 ? positions_ : source_positions(st.source, st.source_rows);
    request.steps.push_back({positions_.data(), rows(), k.data(), int64_t(k.size())});
    steps.push_back(size_t(st.step));
  }
  const std::vector<int> ids = backend_.prepare(request);
  step_ids_.assign(plan_.steps().size(), -1);
  for (size_t t = 0; t < steps.size() && t < ids.size(); ++t) step_ids_[steps[t]] = ids[t];
}

KernelChoice parse_kernel_choice(const std::string& name) {
  if (name == "auto") return KernelChoice::automatic;
  if (name == "cudnn") return KernelChoice::cudnn;
  if (name == "own") return KernelChoice::own;
  throw ArgumentError("kernel", "{kernel} '" + name + "': expected auto, cudnn or own");
}

const char* kernel_choice_name(KernelChoice k) {
  return k == KernelChoice::cudnn ? "cudnn" : k == KernelChoice::own ? "own" : "auto";
}

size_t RingAttention::kv_row_bytes() const {
  const auto& d = options_.dims;
  return static_cast<size_t>(d.kv_heads * d.head_dim * dtype_bytes(options_.dtype));
}

size_t RingAttention::kv_message_bytes(int64_t rows) const {
  return 2 * static_cast<size_t>(options_.dims.batch * rows) * kv_row_bytes();
}

// dK and dV partials (fp32) of `rows` key rows.
size_t RingAttention::grad_message_bytes(int64_t rows) const {
  const auto& d = options_.dims;
  return 2 * sizeof(float) * static_cast<size_t>(d.batch * rows * d.kv_heads * d.head_dim);
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

void RingAttention::allocate_backward_buffers() {
  if (backward_buffers_) return;
  backward_buffers_ = true;
  const auto& d = options_.dims;
  delta_ = DeviceBuffer(backend_, sizeof(float) * static_cast<size_t>(d.batch * d.heads * rows()));
  if (layout_.ranks() > 1)
    for (int i = 0; i < 2; ++i) {
      grad_in_[i] = DeviceBuffer(backend_, grad_message_bytes(max_rows_));
      grad_out_[i] = DeviceBuffer(backend_, grad_message_bytes(max_rows_));
    }
}

std::string RingAttention::from_text(int position) const {
  return position >= 0 ? " from rank " + std::to_string(rank_at(position)) : "";
}

comm::StepHandle RingAttention::post(comm::StepTransfer* transfers, size_t count) {
  for (size_t t = 0; t < count; ++t) transfers[t].peer = rank_at(transfers[t].peer);
  return comm_.post_step(std::span<const comm::StepTransfer>(transfers, count));
}

void RingAttention::wait_step(comm::StepHandle& h, const std::string& what, PassStats& stats) {
  if (!h.valid()) return;
  const double t0 = now_seconds();
  comm_.wait_step(h, what);
  stats.wait_seconds += now_seconds() - t0;
}

// The K/V step `step`: receive into kv_in_[step % 2]; send own rows (direct), own shard (ring,
// step 1) or the shard received at the previous step (ring). The caller has made sure the
// buffers of step - 2 are free (that step was waited for) and, for the ring, that the previous
// step has arrived.
comm::StepHandle RingAttention::post_key_values(int step, const void* k, const void* v) {
  const RingStep& st = plan_.steps()[static_cast<size_t>(step)];
  const int i = step % 2;
  const int64_t B = options_.dims.batch;
  const size_t row_bytes = kv_row_bytes();
  comm::StepTransfer transfers[2];
  size_t count = 0;
  if (st.recv_peer >= 0)
    transfers[count++] = comm::StepTransfer::recv(kv_in_[i].data(), kv_message_bytes(st.recv_rows), st.recv_peer);
  if (st.send_peer >= 0) {
    const int64_t n = count_rows(st.send_rows);
    const void* out = nullptr;
    if (options_.schedule == Schedule::direct || step == 1) {
      char* packed = options_.schedule == Schedule::direct ? kv_out_[i].as<char>() : own_shard_.as<char>();
      backend_.gather_rows(packed, k, B, rows(), row_bytes, st.send_rows);
      backend_.gather_rows(packed + B * n * row_bytes, v, B, rows(), row_bytes, st.send_rows);
      backend_.synchronize();  // the transport reads the buffer as soon as the step is posted
      out = packed;
    } else {
      out = kv_in_[(step - 1) % 2].data();  // pass on the shard received at the previous step
    }
    transfers[count++] = comm::StepTransfer::send(out, kv_message_bytes(n), st.send_peer);
  }
  return post(transfers, count);
}

PassStats RingAttention::forward(const void* q, const void* k, const void* v, float* o, float* lse) {
  PassStats stats;
  const double t_start = now_seconds();
  const uint64_t sent_before = comm_.bytes_sent();
  const auto& dims = options_.dims;
  const int P = layout_.ranks();
  const int64_t rows = this->rows();
  const int64_t B = dims.batch, H = dims.heads;
  const bool ring = options_.schedule == Schedule::ring;
  const auto progress = [this] { comm_.progress(); };

  backend_.zero(o, sizeof(float) * static_cast<size_t>(B * rows * H * dims.head_dim));
  backend_.fill(lse, static_cast<size_t>(B * H * rows), -std::numeric_limits<float>::infinity());

  const kernels::QueryRows queries{q, options_.dtype, rows, positions_.data()};
  const kernels::AttentionState state{o, lse};
  auto compute = [&](int step, const void* kk, const void* vv, int64_t n, const int64_t* pos) {
    const double t0 = now_seconds();
    const StepKernel ran = backend_.forward(dims, queries, kernels::KeyValueRows{kk, vv, options_.dtype, n, pos, step_id(step)},
                                            mask_view_, state, progress);
    stats.compute_seconds += now_seconds() - t0;
    count_step(stats, ran);
  };

  comm::StepHandle kv[2];
  if (P > 1) kv[1] = post_key_values(1, k, v);
  compute(0, k, v, rows, positions_.data());
  if (on_step) on_step(1, P);
  for (int step = 1; step < P; ++step) {
    const RingStep& st = plan_.steps()[static_cast<size_t>(step)];
    const int i = step % 2;
    // Direct: the next step's buffers are free already (step - 1 was waited for and computed
    // on), so post before waiting. Ring: the relay forwards what this step receives, so it can
    // only be posted once it arrived.
    if (!ring && step + 1 < P) kv[1 - i] = post_key_values(step + 1, k, v);
    wait_step(kv[i], "K/V of step " + std::to_string(step) + from_text(st.recv_peer), stats);
    if (ring && step + 1 < P) kv[1 - i] = post_key_values(step + 1, k, v);
    if (st.source >= 0) {
      const std::vector<int64_t> pos = source_positions(st.source, st.source_rows);
      const int64_t n = static_cast<int64_t>(pos.size());
      const char* buf = kv_in_[i].as<char>();
      compute(step, buf, buf + B * n * kv_row_bytes(), n, pos.data());
    }
    if (on_step) on_step(step + 1, P);
  }
  backend_.synchronize();
  stats.bytes_sent = comm_.bytes_sent() - sent_before;
  stats.seconds = now_seconds() - t_start;
  return stats;
}

PassStats RingAttention::backward(const void* q, const void* k, const void* v, const float* o, const float* lse,
                                  const void* dout, float* dq, float* dk, float* dv) {
  allocate_backward_buffers();  // first pass only, before any transfer is posted
  PassStats stats;
  const double t_start = now_seconds();
  const uint64_t sent_before = comm_.bytes_sent();
  const auto& dims = options_.dims;
  const int P = layout_.ranks();
  const int rank = position_;  // in the ring
  const int64_t rows = this->rows();
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim;
  const int64_t grad_row = Hkv * D;  // fp32 elements of one dK (or dV) row
  const auto progress = [this] { comm_.progress(); };
  const bool ring = options_.schedule == Schedule::ring;
  const int next = (rank + 1) % P, previous = (rank - 1 + P) % P;

  backend_.zero(dq, sizeof(float) * static_cast<size_t>(B * rows * H * D));
  backend_.zero(dk, sizeof(float) * static_cast<size_t>(B * rows * grad_row));
  backend_.zero(dv, sizeof(float) * static_cast<size_t>(B * rows * grad_row));
  float* delta = delta_.as<float>();
  backend_.delta(dims, rows, o, dout, options_.dtype, delta);

  const kernels::QueryRows queries{q, options_.dtype, rows, positions_.data()};
  auto compute = [&](int step, const void* kk, const void* vv, int64_t n, const int64_t* pos, float* gk, float* gv) {
    const double t0 = now_seconds();
    const StepKernel ran = backend_.backward(dims, queries, kernels::KeyValueRows{kk, vv, options_.dtype, n, pos, step_id(step)},
                                             dout, lse, delta, dq, gk, gv, mask_view_, progress);
    stats.compute_seconds += now_seconds() - t0;
    count_step(stats, ran);
  };
  // The gradient step of ring step `step`, posted right after its compute. Direct: the partial
  // dK/dV of the source's rows goes back to the source, and the partial of this rank's rows
  // that send_peer computed arrives (into grad_in_[step % 2]). Ring: the running sum for the
  // shard held at this step goes on to the next rank, and the running sum for the shard held at
  // the next step arrives from the previous one (into grad_in_[(step + 1) % 2]; after step P - 1
  // that is this rank's own shard, home).
  auto post_gradients = [&](int step, int64_t n_out) {
    const RingStep& st = plan_.steps()[static_cast<size_t>(step)];
    comm::StepTransfer transfers[2];
    size_t count = 0;
    if (ring) {
      const int64_t n_in = layout_.rows((rank - step - 1 + 2 * P) % P);
      transfers[count++] = comm::StepTransfer::recv(grad_in_[(step + 1) % 2].data(), grad_message_bytes(n_in), previous);
      transfers[count++] = comm::StepTransfer::send(grad_out_[step % 2].data(), grad_message_bytes(n_out), next);
    } else {
      if (st.send_peer >= 0)
        transfers[count++] = comm::StepTransfer::recv(grad_in_[step % 2].data(),
                                                      grad_message_bytes(count_rows(st.send_rows)), st.send_peer);
      if (st.source >= 0)
        transfers[count++] = comm::StepTransfer::send(grad_out_[step % 2].data(), grad_message_bytes(n_out), st.source);
    }
    return post(transfers, count);
  };
  // Direct: partials of this rank's rows computed by rank + k at step k, added in step order
  // one step later (so the wait overlaps the next step's compute).
  comm::StepHandle kv[2], grads[2];
  auto absorb_direct = [&](int step) {
    const RingStep& st = plan_.steps()[static_cast<size_t>(step)];
    wait_step(grads[step % 2],
              "dK/dV of step " + std::to_string(step) + from_text(st.send_peer) + " (and this rank's gradient sends)",
              stats);
    if (st.send_peer < 0) return;
    const int64_t n = count_rows(st.send_rows);
    const float* part = grad_in_[step % 2].as<float>();
    backend_.scatter_add_rows(dk, part, B, rows, grad_row, st.send_rows);
    backend_.scatter_add_rows(dv, part + B * n * grad_row, B, rows, grad_row, st.send_rows);
  };

  if (P > 1) kv[1] = post_key_values(1, k, v);
  compute(0, k, v, rows, positions_.data(), dk, dv);
  if (on_step) on_step(1, P);
  for (int step = 1; step < P; ++step) {
    const RingStep& st = plan_.steps()[static_cast<size_t>(step)];
    const int i = step % 2;
    const int source = (rank - step + P) % P;
    const int64_t n = ring ? layout_.rows(source) : st.recv_rows;
    if (!ring && step + 1 < P) kv[1 - i] = post_key_values(step + 1, k, v);
    wait_step(kv[i], "K/V of step " + std::to_string(step) + from_text(st.recv_peer), stats);
    if (ring && step + 1 < P) kv[1 - i] = post_key_values(step + 1, k, v);

    // grad_out_[i] was last sent at step - 2, whose gradient step was waited for at step - 1.
    float* part = grad_out_[i].as<float>();
    const bool sends_back = ring || st.source >= 0;
    if (sends_back) backend_.zero(part, grad_message_bytes(n));
    if (st.source >= 0) {
      const std::vector<int64_t> pos = source_positions(st.source, st.source_rows);
      const char* buf = kv_in_[i].as<char>();
      compute(step, buf, buf + B * n * kv_row_bytes(), n, pos.data(), part, part + B * n * grad_row);
    }
    if (ring && step >= 2) {
      wait_step(grads[1 - i],
                "dK/dV running sum of step " + std::to_string(step - 1) + from_text(previous) +
                    " (and this rank's send of step " + std::to_string(step - 1) + ")",
                stats);
      backend_.add(part, grad_in_[i].as<float>(), static_cast<size_t>(2 * B * n * grad_row));
    }
    backend_.synchronize();  // the partial is complete before the transport reads it
    grads[i] = post_gradients(step, n);
    if (!ring && step >= 2) absorb_direct(step - 1);
    if (on_step) on_step(step + 1, P);
  }
  if (!ring && P >= 2) absorb_direct(P - 1);
  if (ring && P >= 2) {  // the running sum of this rank's own shard comes home after P - 1 hops
    wait_step(grads[(P - 1) % 2], "dK/dV of this rank's shard" + from_text(previous), stats);
    const float* home = grad_in_[P % 2].as<float>();
    backend_.add(dk, home, static_cast<size_t>(B * rows * grad_row));
    backend_.add(dv, home + B * rows * grad_row, static_cast<size_t>(B * rows * grad_row));
  }
  backend_.synchronize();
  stats.bytes_sent = comm_.bytes_sent() - sent_before;
  stats.seconds = now_seconds() - t_start;
  return stats;
}

}  // namespace ringattn
