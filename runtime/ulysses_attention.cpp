#include "runtime/ulysses_attention.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "comm/stopwatch.hpp"
#include "runtime/errors.hpp"

namespace ringattn {
namespace {

constexpr size_t kHostNameBytes = 256;

}  // namespace

void check_ulysses(int ulysses, int ranks, int64_t heads, int64_t kv_heads) {
  const std::string u = "--ulysses " + std::to_string(ulysses);
  if (ulysses < 1) throw UsageError(u + ": must be at least 1");
  if (ranks % ulysses != 0)
    throw UsageError(u + " does not divide the " + std::to_string(ranks) + " ranks (P = " + std::to_string(ranks) +
                     "): the ranks form P/U groups of U");
  if (heads % ulysses != 0)
    throw UsageError(u + " does not divide the " + std::to_string(heads) + " heads (--heads " + std::to_string(heads) +
                     "): each rank of a group takes H/U of them");
  if (kv_heads % ulysses != 0 && ulysses % kv_heads != 0)
    throw UsageError(u + " and the " + std::to_string(kv_heads) + " K/V heads (--kv-heads " +
                     std::to_string(kv_heads) + "): one must be a multiple of the other, so that K/V heads are "
                     "split or replicated evenly over the group");
}

UlyssesGroups make_ulysses_groups(comm::Communicator& comm, int ulysses) {
  const int P = comm.size(), me = comm.rank();
  UlyssesGroups g;
  g.ulysses = ulysses;
  g.groups = P / ulysses;
  g.group = me / ulysses;
  g.member = me % ulysses;
  if (ulysses == 1) return g;  // the plain ring: no group communicators
  // Does some group span nodes while every node holds whole groups' worth of ranks? Then the
  // launcher placed ranks round-robin, and the all-to-all crosses the slow link: say so.
  std::vector<char> names(kHostNameBytes * static_cast<size_t>(P), 0);
  char mine[kHostNameBytes] = {};
  gethostname(mine, kHostNameBytes - 1);
  comm.allgather(mine, names.data(), kHostNameBytes);
  auto host = [&](int r) { return std::string(names.data() + kHostNameBytes * static_cast<size_t>(r)); };
  for (int r = 0; r < P; ++r)
    if (host(r) != host(r - r % ulysses)) g.groups_span_nodes = true;
  g.group_comm = comm.split(g.group, g.member);
  g.ring_comm = comm.split(g.member, g.group);
  return g;
}

UlyssesAttention::UlyssesAttention(comm::Communicator& comm, AttentionBackend& backend, LayoutKind layout,
                                   int64_t seq_len, const Mask& mask, const RingOptions& options, int ulysses)
    : comm_(comm),
      backend_(backend),
      options_(options),
      groups_((check_ulysses(ulysses, comm.size(), options.dims.heads, options.dims.kv_heads),
               make_ulysses_groups(comm, ulysses))),
      layout_(layout, seq_len, comm.size(), ulysses),
      group_layout_(layout_.group_layout()),
      group_rows_(group_layout_.rows(groups_.group)),
      positions_(layout_.positions(comm.rank())) {
  local_dims_ = options.dims;
  local_dims_.heads = options.dims.heads / ulysses;
  local_dims_.kv_heads = kv_heads(0).count;
  RingOptions ring_options = options;
  ring_options.dims = local_dims_;
  ring_ = std::make_unique<RingAttention>(ring_comm(), backend, group_layout_, mask, ring_options);
}

UlyssesAttention::HeadSlice UlyssesAttention::query_heads(int j) const {
  const int64_t n = options_.dims.heads / groups_.ulysses;
  return {j * n, n};
}

UlyssesAttention::HeadSlice UlyssesAttention::kv_heads(int j) const {
  const int64_t Hkv = options_.dims.kv_heads, U = groups_.ulysses;
  if (Hkv >= U) return {j * (Hkv / U), Hkv / U};
  return {j / (U / Hkv), 1};  // replicated: members j with the same j / (U / Hkv) share a head
}

int64_t UlyssesAttention::member_begin(int j) const { return group_rows_ * j / groups_.ulysses; }  // as ShardLayout
int64_t UlyssesAttention::member_rows(int j) const { return member_begin(j + 1) - member_begin(j); }

void UlyssesAttention::exchange(const std::vector<uint8_t>& send, const std::vector<size_t>& send_bytes,
                                std::vector<uint8_t>& recv, const std::vector<size_t>& recv_bytes) {
  const double t0 = comm::now_seconds();
  comm::Communicator& group = *groups_.group_comm;
  for (int j = 0; j < groups_.ulysses; ++j)
    if (j != groups_.member) a2a_bytes_ += send_bytes[size_t(j)];
  if (group.memory() == comm::MemorySpace::host) {
    group.alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  } else {  // a device-memory communicator (NCCL): stage through backend memory
    DeviceBuffer s = to_backend(send.data(), send.size());
    DeviceBuffer r(backend_, recv.size());
    group.alltoallv(s.data(), send_bytes, r.data(), recv_bytes);
    if (!recv.empty()) backend_.download(recv.data(), r.data(), recv.size());
  }
  a2a_seconds_ += comm::now_seconds() - t0;
}

const void* UlyssesAttention::host_view(const void* p, size_t bytes, std::vector<uint8_t>& staging) {
  if (backend_.memory() == comm::MemorySpace::host) return p;
  staging.resize(bytes);
  if (bytes) backend_.download(staging.data(), p, bytes);
  return staging.data();
}

DeviceBuffer UlyssesAttention::to_backend(const void* host, size_t bytes) {
  DeviceBuffer b(backend_, bytes);
  if (bytes) backend_.upload(b.data(), host, bytes);
  return b;
}

std::vector<uint8_t> UlyssesAttention::rows_to_heads(const void* x, int64_t heads, size_t elem, bool kv) {
  const int U = groups_.ulysses, me = groups_.member;
  const int64_t B = options_.dims.batch, D = options_.dims.head_dim, rows = this->rows();
  const size_t head_bytes = size_t(D) * elem;
  std::vector<uint8_t> staging;
  const uint8_t* src = static_cast<const uint8_t*>(host_view(x, size_t(B * rows * heads) * head_bytes, staging));
  // Block j: (B, rows, slice of member j, D).
  std::vector<size_t> send_bytes(static_cast<size_t>(U)), recv_bytes(static_cast<size_t>(U));
  const int64_t mine = (kv ? kv_heads(me) : query_heads(me)).count;
  for (int j = 0; j < U; ++j) {
    const HeadSlice s = kv ? kv_heads(j) : query_heads(j);
    send_bytes[size_t(j)] = size_t(B * rows * s.count) * head_bytes;
    recv_bytes[size_t(j)] = size_t(B * member_rows(j) * mine) * head_bytes;
  }
  std::vector<uint8_t> send(size_t(B * rows) * size_t(U) * size_t(mine) * head_bytes), recv;
  size_t offset = 0;
  for (int j = 0; j < U; ++j) {
    const HeadSlice s = kv ? kv_heads(j) : query_heads(j);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < rows; ++r) {
        const size_t bytes = size_t(s.count) * head_bytes;
        std::memcpy(send.data() + offset, src + (size_t((b * rows + r) * heads + s.first)) * head_bytes, bytes);
        offset += bytes;
      }
  }
  size_t recv_total = 0;
  for (size_t n : recv_bytes) recv_total += n;
  recv.resize(recv_total);
  exchange(send, send_bytes, recv, recv_bytes);
  // Block i: (B, rows of member i, mine, D) -> rows [begin(i), ...) of (B, group rows, mine, D).
  std::vector<uint8_t> out(size_t(B * group_rows_ * mine) * head_bytes);
  const size_t row_bytes = size_t(mine) * head_bytes;
  offset = 0;
  for (int i = 0; i < U; ++i)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < member_rows(i); ++r) {
        std::memcpy(out.data() + size_t(b * group_rows_ + member_begin(i) + r) * row_bytes, recv.data() + offset,
                    row_bytes);
        offset += row_bytes;
      }
  return out;
}

void UlyssesAttention::heads_to_rows(const float* x, int64_t heads, bool kv, float* out) {
  const int U = groups_.ulysses, me = groups_.member;
  const int64_t B = options_.dims.batch, D = options_.dims.head_dim, rows = this->rows();
  const int64_t mine = (kv ? kv_heads(me) : query_heads(me)).count;
  std::vector<uint8_t> staging;
  const float* src =
      static_cast<const float*>(host_view(x, sizeof(float) * size_t(B * group_rows_ * mine * D), staging));
  std::vector<size_t> send_bytes(static_cast<size_t>(U)), recv_bytes(static_cast<size_t>(U));
  for (int j = 0; j < U; ++j) {
    const HeadSlice s = kv ? kv_heads(j) : query_heads(j);
    send_bytes[size_t(j)] = sizeof(float) * size_t(B * member_rows(j) * mine * D);
    recv_bytes[size_t(j)] = sizeof(float) * size_t(B * rows * s.count * D);
  }
  // Block i: (B, rows of member i, mine, D), taken from the head-sharded rows.
  std::vector<uint8_t> send(sizeof(float) * size_t(B * group_rows_ * mine * D)), recv;
  const size_t row_bytes = sizeof(float) * size_t(mine * D);
  size_t offset = 0;
  for (int i = 0; i < U; ++i)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < member_rows(i); ++r) {
        std::memcpy(send.data() + offset, src + size_t(b * group_rows_ + member_begin(i) + r) * size_t(mine * D),
                    row_bytes);
        offset += row_bytes;
      }
  size_t recv_total = 0;
  for (size_t n : recv_bytes) recv_total += n;
  recv.resize(recv_total);
  exchange(send, send_bytes, recv, recv_bytes);
  // Block j: (B, rows, slice of member j, D) -> heads of this rank's (B, rows, heads, D). Copies of
  // a replicated K/V head are summed in member order (deterministic).
  std::vector<float> result(size_t(B * rows * heads * D), 0.0f);
  const float* in = reinterpret_cast<const float*>(recv.data());
  for (int j = 0; j < U; ++j) {
    const HeadSlice s = kv ? kv_heads(j) : query_heads(j);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < rows; ++r) {
        float* dst = result.data() + size_t((b * rows + r) * heads + s.first) * size_t(D);
        for (int64_t e = 0; e < s.count * D; ++e) dst[e] += in[e];
        in += s.count * D;
      }
  }
  if (!result.empty()) backend_.upload(out, result.data(), sizeof(float) * result.size());
}

std::vector<float> UlyssesAttention::lse_to_heads(const float* lse) {
  const int U = groups_.ulysses;
  const int64_t B = options_.dims.batch, H = options_.dims.heads, Hl = local_dims_.heads, rows = this->rows();
  std::vector<uint8_t> staging;
  const float* src = static_cast<const float*>(host_view(lse, sizeof(float) * size_t(B * H * rows), staging));
  std::vector<size_t> send_bytes(static_cast<size_t>(U)), recv_bytes(static_cast<size_t>(U));
  std::vector<uint8_t> send(sizeof(float) * size_t(B * H * rows)), recv(sizeof(float) * size_t(B * Hl * group_rows_));
  float* s = reinterpret_cast<float*>(send.data());
  for (int j = 0; j < U; ++j) {  // block j: (B, H/U heads of member j, rows)
    send_bytes[size_t(j)] = sizeof(float) * size_t(B * Hl * rows);
    recv_bytes[size_t(j)] = sizeof(float) * size_t(B * Hl * member_rows(j));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hl; ++h, s += rows)
        std::copy_n(src + size_t((b * H + j * Hl + h) * rows), rows, s);
  }
  exchange(send, send_bytes, recv, recv_bytes);
  std::vector<float> out(size_t(B * Hl * group_rows_));
  const float* in = reinterpret_cast<const float*>(recv.data());
  for (int i = 0; i < U; ++i)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hl; ++h, in += member_rows(i))
        std::copy_n(in, member_rows(i), out.data() + size_t((b * Hl + h) * group_rows_ + member_begin(i)));
  return out;
}

void UlyssesAttention::lse_to_rows(const float* x, float* out) {
  const int U = groups_.ulysses;
  const int64_t B = options_.dims.batch, H = options_.dims.heads, Hl = local_dims_.heads, rows = this->rows();
  std::vector<uint8_t> staging;
  const float* src = static_cast<const float*>(host_view(x, sizeof(float) * size_t(B * Hl * group_rows_), staging));
  std::vector<size_t> send_bytes(static_cast<size_t>(U)), recv_bytes(static_cast<size_t>(U));
  std::vector<uint8_t> send(sizeof(float) * size_t(B * Hl * group_rows_)), recv(sizeof(float) * size_t(B * H * rows));
  float* s = reinterpret_cast<float*>(send.data());
  for (int i = 0; i < U; ++i) {  // block i: (B, H/U, rows of member i)
    send_bytes[size_t(i)] = sizeof(float) * size_t(B * Hl * member_rows(i));
    recv_bytes[size_t(i)] = sizeof(float) * size_t(B * Hl * rows);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hl; ++h, s += member_rows(i))
        std::copy_n(src + size_t((b * Hl + h) * group_rows_ + member_begin(i)), member_rows(i), s);
  }
  exchange(send, send_bytes, recv, recv_bytes);
  std::vector<float> result(size_t(B * H * rows));
  const float* in = reinterpret_cast<const float*>(recv.data());
  for (int j = 0; j < U; ++j)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hl; ++h, in += rows) std::copy_n(in, rows, result.data() + size_t((b * H + j * Hl + h) * rows));
  if (!result.empty()) backend_.upload(out, result.data(), sizeof(float) * result.size());
}

PassStats UlyssesAttention::forward(const void* q, const void* k, const void* v, float* o, float* lse) {
  ring_->on_step = on_step;
  if (groups_.ulysses == 1) return ring_->forward(q, k, v, o, lse);
  const double t0 = comm::now_seconds();
  a2a_bytes_ = 0;
  a2a_seconds_ = 0.0;
  const size_t elem = size_t(dtype_bytes(options_.dtype));
  const int64_t H = options_.dims.heads, Hkv = options_.dims.kv_heads;
  std::vector<uint8_t> x = rows_to_heads(q, H, elem, false);
  q_heads_ = to_backend(x.data(), x.size());
  x = rows_to_heads(k, Hkv, elem, true);
  k_heads_ = to_backend(x.data(), x.size());
  x = rows_to_heads(v, Hkv, elem, true);
  v_heads_ = to_backend(x.data(), x.size());
  const int64_t B = local_dims_.batch, Hl = local_dims_.heads, D = local_dims_.head_dim;
  o_heads_ = DeviceBuffer(backend_, sizeof(float) * size_t(B * group_rows_ * Hl * D));
  lse_heads_ = DeviceBuffer(backend_, sizeof(float) * size_t(B * Hl * group_rows_));
  PassStats stats = ring_->forward(q_heads_.data(), k_heads_.data(), v_heads_.data(), o_heads_.as<float>(),
                                   lse_heads_.as<float>());
  heads_to_rows(o_heads_.as<float>(), H, false, o);
  lse_to_rows(lse_heads_.as<float>(), lse);
  forward_args_[0] = q, forward_args_[1] = k, forward_args_[2] = v, forward_args_[3] = o, forward_args_[4] = lse;
  stats.wait_seconds += a2a_seconds_;
  stats.seconds = comm::now_seconds() - t0;
  return stats;
}

PassStats UlyssesAttention::backward(const void* q, const void* k, const void* v, const float* o, const float* lse,
                                     const void* dout, float* dq, float* dk, float* dv) {
  ring_->on_step = on_step;
  if (groups_.ulysses == 1) return ring_->backward(q, k, v, o, lse, dout, dq, dk, dv);
  const double t0 = comm::now_seconds();
  a2a_bytes_ = 0;
  a2a_seconds_ = 0.0;
  const size_t elem = size_t(dtype_bytes(options_.dtype));
  const int64_t H = options_.dims.heads, Hkv = options_.dims.kv_heads;
  const void* args[5] = {q, k, v, o, lse};
  if (!std::equal(args, args + 5, forward_args_)) {  // not the last forward's tensors: exchange them
    std::vector<uint8_t> x = rows_to_heads(q, H, elem, false);
    q_heads_ = to_backend(x.data(), x.size());
    x = rows_to_heads(k, Hkv, elem, true);
    k_heads_ = to_backend(x.data(), x.size());
    x = rows_to_heads(v, Hkv, elem, true);
    v_heads_ = to_backend(x.data(), x.size());
    x = rows_to_heads(o, H, sizeof(float), false);
    o_heads_ = to_backend(x.data(), x.size());
    const std::vector<float> l = lse_to_heads(lse);
    lse_heads_ = to_backend(l.data(), sizeof(float) * l.size());
    std::copy(args, args + 5, forward_args_);
  }
  std::vector<uint8_t> x = rows_to_heads(dout, H, elem, false);
  DeviceBuffer dout_heads = to_backend(x.data(), x.size());
  const int64_t B = local_dims_.batch, Hl = local_dims_.heads, Hkvl = local_dims_.kv_heads, D = local_dims_.head_dim;
  DeviceBuffer dq_heads(backend_, sizeof(float) * size_t(B * group_rows_ * Hl * D));
  DeviceBuffer dk_heads(backend_, sizeof(float) * size_t(B * group_rows_ * Hkvl * D));
  DeviceBuffer dv_heads(backend_, sizeof(float) * size_t(B * group_rows_ * Hkvl * D));
  PassStats stats = ring_->backward(q_heads_.data(), k_heads_.data(), v_heads_.data(), o_heads_.as<float>(),
                                    lse_heads_.as<float>(), dout_heads.data(), dq_heads.as<float>(),
                                    dk_heads.as<float>(), dv_heads.as<float>());
  heads_to_rows(dq_heads.as<float>(), H, false, dq);
  heads_to_rows(dk_heads.as<float>(), Hkv, true, dk);
  heads_to_rows(dv_heads.as<float>(), Hkv, true, dv);
  stats.wait_seconds += a2a_seconds_;
  stats.seconds = comm::now_seconds() - t0;
  return stats;
}

}  // namespace ringattn
