// Hybrid sequence parallelism (SPEC.md "Hybrid parallelism", --ulysses U): DeepSpeed-Ulysses'
// all-to-all inside groups of U ranks, the ring across the P/U groups.
//
// Groups. The P ranks form G = P/U groups of U consecutive ranks: group g is ranks gU .. gU + U - 1
// and member u of it is rank gU + u. Launchers place consecutive ranks on one node (Open MPI's
// default --map-by slot/core, Slurm's block distribution), so with nodes of a multiple of U ranks
// a group is the ranks of one node and the all-to-all stays on the fast intra-node link.
// (Consecutive ranks rather than MPI_Comm_split_type: the layout, the --check and the output
// files then know every rank's rows from its rank alone.) groups_span_nodes says when a group
// crosses nodes (e.g. round-robin placement), for a warning.
//
// Sharding (ShardLayout with ulysses U). The sequence is laid out over the G groups by the
// layout (zigzag etc., so the load balance of the ring holds); inside group g, member u holds the
// u-th of U nearly equal consecutive parts of the group's rows. positions() gives this rank's
// global positions; its q, k, v, dout are (B, rows, H or Hkv, D) in that order.
//
// Forward. An all-to-all inside the group turns each member's (B, rows, H, D) into
// (B, group rows, H/U, D): member u receives heads [u H/U, (u+1) H/U) of every row of the group;
// K and V likewise with Hkv/U heads. When Hkv < U (U a multiple of Hkv), each K/V head is
// replicated to the U/Hkv members whose query heads use it, as DeepSpeed does, and the
// all-to-all carries the copies. The ring then runs over the communicator of the G ranks with
// this member index (one per group) on H/U heads, with the plain RingAttention; an all-to-all
// turns O (and LSE) back. Backward: dO goes in the same way, dQ, dK and dV come back, and the
// gradients of a replicated K/V head are summed over its copies in member order.
//
// No rank holds a whole-sequence tensor: the head-sharded tensors have the group's rows
// (U times this rank's) and 1/U of the heads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/backend.hpp"
#include "runtime/ring_attention.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

// Throws UsageError naming --ulysses and the value it conflicts with: U < 1, U not dividing the
// ranks P, the heads H not divisible by U, or Hkv neither a multiple nor a divisor of U.
void check_ulysses(int ulysses, int ranks, int64_t heads, int64_t kv_heads);

// The groups of `comm` (collective over it): this rank's group and member index, the
// communicator of its group (U ranks, ordered by member) and that of its ring (G ranks, one per
// group, ordered by group).
struct UlyssesGroups {
  int ulysses = 1, groups = 1, group = 0, member = 0;
  bool groups_span_nodes = false;
  std::unique_ptr<comm::Communicator> group_comm, ring_comm;
};
UlyssesGroups make_ulysses_groups(comm::Communicator& comm, int ulysses);

// With U = 1 it is the plain RingAttention over `comm` (no copies, no all-to-all), so that jobs
// hold one kind of object whatever --ulysses says.
class UlyssesAttention {
 public:
  // `options.dims` are the whole problem's (H, Hkv heads); check_ulysses must hold. The groups'
  // communicators keep the settings (timeout, link emulation) of `comm` unless set afterwards.
  UlyssesAttention(comm::Communicator& comm, AttentionBackend& backend, LayoutKind layout, int64_t seq_len,
                   const Mask& mask, const RingOptions& options, int ulysses);

  int ulysses() const { return groups_.ulysses; }
  int group() const { return groups_.group; }
  int member() const { return groups_.member; }
  // With U = 1 there is no group communicator (nullptr) and the ring runs over `comm` itself.
  comm::Communicator* group_comm() { return groups_.group_comm.get(); }
  comm::Communicator& ring_comm() { return groups_.group_comm ? *groups_.ring_comm : comm_; }
  // The ring across groups (H/U heads, the group's rows).
  RingAttention& ring() { return *ring_; }
  const ShardLayout& layout() const { return layout_; }              // over the P ranks
  const ShardLayout& group_layout() const { return group_layout_; }  // over the G groups
  bool groups_span_nodes() const { return groups_.groups_span_nodes; }

  int64_t rows() const { return static_cast<int64_t>(positions_.size()); }
  const std::vector<int64_t>& positions() const { return positions_; }
  // K/V bytes the ring part must receive (RingAttention::bytes_needed on H/U heads).
  uint64_t bytes_needed() const { return ring_->bytes_needed(); }
  // Payload this rank sent to other members in the all-to-alls of the last pass, and the time
  // spent in them (not overlapped with compute: exposed communication).
  uint64_t a2a_bytes_sent() const { return a2a_bytes_; }
  double a2a_seconds() const { return a2a_seconds_; }

  // As RingAttention::forward on this rank's rows (positions()); the returned stats are those of
  // the whole pass, with the all-to-all time added to wait_seconds, and bytes_sent the ring's.
  PassStats forward(const void* q, const void* k, const void* v, float* o, float* lse);
  // As RingAttention::backward. When q, k, v, o and lse are those of the last forward, the
  // head-sharded copies kept from it are used (as DeepSpeed's autograd keeps them); otherwise they
  // are exchanged again.
  PassStats backward(const void* q, const void* k, const void* v, const float* o, const float* lse,
                     const void* dout, float* dq, float* dk, float* dv);

  // Called after each ring step of a pass with (steps done, steps in all); for --progress.
  std::function<void(int, int)> on_step;

 private:
  // Which heads member j gets of a tensor with `heads` heads: [first, first + count).
  struct HeadSlice {
    int64_t first, count;
  };
  HeadSlice query_heads(int j) const;
  HeadSlice kv_heads(int j) const;
  int64_t member_rows(int j) const;
  int64_t member_begin(int j) const;

  // (B, rows, heads, D) of this rank -> (B, group rows, slice, D), element of `elem` bytes.
  std::vector<uint8_t> rows_to_heads(const void* x, int64_t heads, size_t elem, bool kv);
  // (B, group rows, slice, D) fp32 -> this rank's (B, rows, heads, D), summed over replicas.
  void heads_to_rows(const float* x, int64_t heads, bool kv, float* out);
  // LSE (B, H, rows) <-> (B, H/U, group rows).
  std::vector<float> lse_to_heads(const float* lse);
  void lse_to_rows(const float* x, float* out);
  void exchange(const std::vector<uint8_t>& send, const std::vector<size_t>& send_bytes, std::vector<uint8_t>& recv,
                const std::vector<size_t>& recv_bytes);

  // Backend memory <-> host (a plain view on the CPU backend).
  const void* host_view(const void* p, size_t bytes, std::vector<uint8_t>& staging);
  DeviceBuffer to_backend(const void* host, size_t bytes);

  comm::Communicator& comm_;
  AttentionBackend& backend_;
  RingOptions options_;
  UlyssesGroups groups_;
  ShardLayout layout_;
  ShardLayout group_layout_;
  int64_t group_rows_;
  std::vector<int64_t> positions_;
  kernels::AttentionDims local_dims_;
  std::unique_ptr<RingAttention> ring_;

  // Head-sharded tensors of the last forward, in backend memory, and the arguments they came from.
  DeviceBuffer q_heads_, k_heads_, v_heads_, o_heads_, lse_heads_;
  const void* forward_args_[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  uint64_t a2a_bytes_ = 0;
  double a2a_seconds_ = 0.0;
};

}  // namespace ringattn
