#include "runtime/ulysses_attention.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>

#include "util/stopwatch.hpp"
#include "runtime/errors.hpp"

namespace ringattn {

UlyssesAttention::UlyssesAttention(comm::Communicator& comm, AttentionBackend& backend, LayoutKind layout,
                                   int64_t seq_len, const Mask& mask, const RingOptions& options,
                                   std::shared_ptr<UlyssesGroups> groups)
    : comm_(comm),
      backend_(backend),
      options_(options),
      groups_(std::move(groups)),
      layout_(layout, seq_len, comm.size(), groups_->ulysses, groups_->placement.members),
      group_layout_(layout_.group_layout()),
      group_rows_(group_layout_.rows(groups_->group)),
      positions_(layout_.positions(comm.rank())) {
  const int ulysses = groups_->ulysses;
  if (auto bad = check_ulysses(ulysses, comm.size(), options.dims.heads, options.dims.kv_heads)) throw *bad;
  if (groups_->group_comm && backend.memory() == comm::MemorySpace::device &&
      groups_->group_comm->memory() == comm::MemorySpace::host)
    throw std::invalid_argument("UlyssesAttention: the " + std::string(backend.name()) +
                                " backend's buffers are device memory, which the " + comm.name() +
                                " communicator cannot move (wrap it in the host-staged communicator)");
  local_dims_ = options.dims;
  local_dims_.heads = options.dims.heads / ulysses;
  local_dims_.kv_heads = kv_heads(0).count;
  RingOptions ring_options = options;
  ring_options.dims = local_dims_;
  ring_ = std::make_unique<RingAttention>(comm_, backend, group_layout_, mask, ring_options, groups_->ring_ranks);
}

UlyssesAttention::HeadSlice UlyssesAttention::query_heads(int j) const {
  const int64_t n = options_.dims.heads / groups_->ulysses;
  return {j * n, n};
}

UlyssesAttention::HeadSlice UlyssesAttention::kv_heads(int j) const {
  const int64_t Hkv = options_.dims.kv_heads, U = groups_->ulysses;
  if (Hkv >= U) return {j * (Hkv / U), Hkv / U};
  return {j / (U / Hkv), 1};  // replicated: members j with the same j / (U / Hkv) share a head
}

int64_t UlyssesAttention::member_begin(int j) const { return group_rows_ * j / groups_->ulysses; }  // as ShardLayout
int64_t UlyssesAttention::member_rows(int j) const { return member_begin(j + 1) - member_begin(j); }

UlyssesAttention::Resharding UlyssesAttention::tensor_resharding(int64_t heads, size_t elem, bool kv) const {
  const int64_t B = options_.dims.batch, mine = (kv ? kv_heads(groups_->member) : query_heads(groups_->member)).count;
  const size_t head_bytes = size_t(options_.dims.head_dim) * elem;
  Resharding r;
  r.rows_form = {B, rows(), heads, head_bytes};
  r.heads_form = {B, group_rows_, mine, head_bytes};
  for (int j = 0; j < groups_->ulysses; ++j) {
    const HeadSlice s = kv ? kv_heads(j) : query_heads(j);
    r.of_rows.push_back({0, rows(), s.first, s.count});
    r.of_heads.push_back({member_begin(j), member_rows(j), 0, mine});
  }
  r.replicated = kv && options_.dims.kv_heads < groups_->ulysses;
  return r;
}

UlyssesAttention::Resharding UlyssesAttention::lse_resharding() const {
  const int64_t B = options_.dims.batch, Hl = local_dims_.heads;
  Resharding r;
  r.rows_form = {B, options_.dims.heads, rows(), sizeof(float)};
  r.heads_form = {B, Hl, group_rows_, sizeof(float)};
  for (int j = 0; j < groups_->ulysses; ++j) {
    r.of_rows.push_back({j * Hl, Hl, 0, rows()});
    r.of_heads.push_back({0, Hl, member_begin(j), member_rows(j)});
  }
  return r;
}

void UlyssesAttention::copy_box(const Shape& shape, const Box& box, const void* src, void* dst, bool pack) {
  const size_t row = size_t(shape.b) * shape.inner, width = size_t(box.nb) * shape.inner;
  const size_t block_bytes = size_t(box.na) * width;  // per outer index
  const size_t box_start = size_t(box.a0) * row + size_t(box.b0) * shape.inner;
  // Rows of `w` bytes, `height` of them, from the tensor's box to the block (pack) or back.
  auto copy = [&](size_t tensor_pitch, size_t block_pitch, size_t w, size_t height, size_t t_off, size_t b_off) {
    if (height == 1) tensor_pitch = block_pitch = w;  // no pitch to respect (CUDA caps pitches at 2^31)
    const char* from = static_cast<const char*>(src) + (pack ? box_start + t_off : b_off);
    char* to = static_cast<char*>(dst) + (pack ? b_off : box_start + t_off);
    backend_.copy_2d(to, pack ? block_pitch : tensor_pitch, from, pack ? tensor_pitch : block_pitch, w, height);
  };
  const size_t outer_bytes = size_t(shape.a) * row;
  if (box.nb == shape.b)  // whole rows: one contiguous run per outer index
    copy(outer_bytes, block_bytes, block_bytes, size_t(shape.outer), 0, 0);
  else if (box.na == shape.a)  // every row of every outer index: equally spaced
    copy(row, width, width, size_t(shape.outer * shape.a), 0, 0);
  else
    for (int64_t o = 0; o < shape.outer; ++o)
      copy(row, width, width, size_t(box.na), size_t(o) * outer_bytes, size_t(o) * block_bytes);
}

void UlyssesAttention::reserve(DeviceBuffer& buffer, size_t bytes) {
  if (buffer.bytes() < bytes) buffer = DeviceBuffer(backend_, bytes);
}

void UlyssesAttention::reshard(const Resharding& r, Direction direction, const void* src, void* dst) {
  const int U = groups_->ulysses;
  const bool to_heads = direction == Direction::to_heads;
  const Shape& from = to_heads ? r.rows_form : r.heads_form;
  const Shape& to = to_heads ? r.heads_form : r.rows_form;
  const std::vector<Box>& sent = to_heads ? r.of_rows : r.of_heads;
  const std::vector<Box>& received = to_heads ? r.of_heads : r.of_rows;
  auto bytes_of = [](const Shape& s, const Box& b) { return size_t(s.outer * b.na * b.nb) * s.inner; };
  std::vector<size_t> send_bytes(size_t(U), 0), recv_bytes(size_t(U), 0), recv_offset(size_t(U), 0);
  size_t send_total = 0, recv_total = 0;
  for (int j = 0; j < U; ++j) {
    send_bytes[size_t(j)] = bytes_of(from, sent[size_t(j)]);
    recv_bytes[size_t(j)] = bytes_of(to, received[size_t(j)]);
    send_total += send_bytes[size_t(j)];
    recv_offset[size_t(j)] = recv_total;
    recv_total += recv_bytes[size_t(j)];
    if (j != groups_->member) a2a_bytes_ += send_bytes[size_t(j)];
  }
  reserve(send_, send_total);
  reserve(recv_, recv_total);
  char* packed = send_.as<char>();
  for (int j = 0; j < U; ++j) {
    copy_box(from, sent[size_t(j)], src, packed, true);  // pack
    packed += send_bytes[size_t(j)];
  }
  backend_.synchronize();  // the communicator reads the blocks as soon as it is called
  // The exchange alone counts as communication (waiting included: it starts when the group's
  // last member arrives); packing and unpacking are copies on the backend, like the ring's.
  const double t0 = now_seconds();
  groups_->group_comm->alltoallv(send_.data(), send_bytes, recv_.data(), recv_bytes);
  a2a_seconds_ += now_seconds() - t0;
  // Copies of a replicated K/V head come back from consecutive members: their fp32 gradients are
  // summed in member order into the first block, which then goes in place once.
  char* blocks = recv_.as<char>();
  for (int i = 0; i < U;) {
    int last = i;
    while (!to_heads && r.replicated && last + 1 < U && received[size_t(last + 1)] == received[size_t(i)]) {
      ++last;
      backend_.add(reinterpret_cast<float*>(blocks + recv_offset[size_t(i)]),
                   reinterpret_cast<const float*>(blocks + recv_offset[size_t(last)]),
                   recv_bytes[size_t(i)] / sizeof(float));
    }
    copy_box(to, received[size_t(i)], blocks + recv_offset[size_t(i)], dst, false);  // unpack
    i = last + 1;
  }
  backend_.synchronize();
}

void UlyssesAttention::inputs_to_heads(const void* q, const void* k, const void* v, const float* o,
                                       const float* lse) {
  const size_t elem = size_t(dtype_bytes(options_.dtype));
  const int64_t H = options_.dims.heads, Hkv = options_.dims.kv_heads;
  const int64_t B = local_dims_.batch, Hl = local_dims_.heads, Hkvl = local_dims_.kv_heads, D = local_dims_.head_dim;
  reserve(q_heads_, elem * size_t(B * group_rows_ * Hl * D));
  reserve(k_heads_, elem * size_t(B * group_rows_ * Hkvl * D));
  reserve(v_heads_, elem * size_t(B * group_rows_ * Hkvl * D));
  reserve(o_heads_, sizeof(float) * size_t(B * group_rows_ * Hl * D));
  reserve(lse_heads_, sizeof(float) * size_t(B * Hl * group_rows_));
  const Resharding rkv = tensor_resharding(Hkv, elem, true);
  reshard(tensor_resharding(H, elem, false), Direction::to_heads, q, q_heads_.data());
  reshard(rkv, Direction::to_heads, k, k_heads_.data());
  reshard(rkv, Direction::to_heads, v, v_heads_.data());
  if (o) reshard(tensor_resharding(H, sizeof(float), false), Direction::to_heads, o, o_heads_.data());
  if (lse) reshard(lse_resharding(), Direction::to_heads, lse, lse_heads_.data());
}

PassStats UlyssesAttention::forward(const void* q, const void* k, const void* v, float* o, float* lse) {
  ring_->on_step = on_step;
  ++forward_count_;
  if (groups_->ulysses == 1) return ring_->forward(q, k, v, o, lse);
  const double t0 = now_seconds();
  a2a_bytes_ = 0;
  a2a_seconds_ = 0.0;
  const int64_t H = options_.dims.heads;
  inputs_to_heads(q, k, v);
  PassStats stats = ring_->forward(q_heads_.data(), k_heads_.data(), v_heads_.data(), o_heads_.as<float>(),
                                   lse_heads_.as<float>());
  reshard(tensor_resharding(H, sizeof(float), false), Direction::to_rows, o_heads_.data(), o);
  reshard(lse_resharding(), Direction::to_rows, lse_heads_.data(), lse);
  kept_forward_ = forward_count_;
  stats.wait_seconds += a2a_seconds_;
  stats.seconds = now_seconds() - t0;
  return stats;
}

PassStats UlyssesAttention::backward(const void* q, const void* k, const void* v, const float* o, const float* lse,
                                     const void* dout, float* dq, float* dk, float* dv, uint64_t saved) {
  ring_->on_step = on_step;
  if (groups_->ulysses == 1) return ring_->backward(q, k, v, o, lse, dout, dq, dk, dv);
  const double t0 = now_seconds();
  a2a_bytes_ = 0;
  a2a_seconds_ = 0.0;
  const size_t elem = size_t(dtype_bytes(options_.dtype));
  const int64_t H = options_.dims.heads, Hkv = options_.dims.kv_heads;
  const int64_t B = local_dims_.batch, Hl = local_dims_.heads, Hkvl = local_dims_.kv_heads, D = local_dims_.head_dim;
  const Resharding rq = tensor_resharding(H, elem, false);
  const Resharding rq32 = tensor_resharding(H, sizeof(float), false);
  const Resharding rkv32 = tensor_resharding(Hkv, sizeof(float), true);
  if (saved == 0 || saved != kept_forward_) {  // not the kept forward's tensors: exchange them
    kept_forward_ = 0;
    inputs_to_heads(q, k, v, o, lse);
  }
  reserve(dout_heads_, elem * size_t(B * group_rows_ * Hl * D));
  reserve(dq_heads_, sizeof(float) * size_t(B * group_rows_ * Hl * D));
  reserve(dk_heads_, sizeof(float) * size_t(B * group_rows_ * Hkvl * D));
  reserve(dv_heads_, sizeof(float) * size_t(B * group_rows_ * Hkvl * D));
  reshard(rq, Direction::to_heads, dout, dout_heads_.data());
  PassStats stats = ring_->backward(q_heads_.data(), k_heads_.data(), v_heads_.data(), o_heads_.as<float>(),
                                    lse_heads_.as<float>(), dout_heads_.data(), dq_heads_.as<float>(),
                                    dk_heads_.as<float>(), dv_heads_.as<float>());
  reshard(rq32, Direction::to_rows, dq_heads_.data(), dq);
  reshard(rkv32, Direction::to_rows, dk_heads_.data(), dk);
  reshard(rkv32, Direction::to_rows, dv_heads_.data(), dv);
  stats.wait_seconds += a2a_seconds_;
  stats.seconds = now_seconds() - t0;
  return stats;
}

}  // namespace ringattn
