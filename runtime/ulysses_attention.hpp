// Hybrid sequence parallelism (docs/hybrid.md, --ulysses U): DeepSpeed-Ulysses'
// all-to-all inside groups of U ranks, the ring across the P/U groups.
//
// Groups: runtime/placement.hpp places them on the nodes.
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
// all-to-all carries the copies. The ring then runs across the groups on H/U heads, with the
// plain RingAttention over the ranks with this member index (one per group, in group order),
// on the job's communicator itself: a rank holds two communicators, the job's and its group's
// (split from it; on NCCL, ncclCommSplit). An all-to-all turns O (and LSE) back. Backward: dO
// goes in the same way, dQ, dK and dV come back, and the gradients of a replicated K/V head are
// summed over its copies in member order.
//
// The all-to-alls work on backend memory: the per-member blocks are packed and unpacked with
// strided copies on the backend (AttentionBackend::copy_2d: cudaMemcpy2DAsync on a GPU) and move
// over the group's communicator (NCCL: grouped ncclSend/ncclRecv on the device; MPI on host
// memory; the host-staged communicator for the CUDA backend over MPI).
//
// No rank holds a whole-sequence tensor: the head-sharded tensors have the group's rows
// (U times this rank's) and 1/U of the heads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/backend.hpp"
#include "runtime/placement.hpp"
#include "runtime/ring_attention.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

// With U = 1 it is the plain RingAttention over `comm` (no copies, no all-to-all), so that jobs
// hold one kind of object whatever --ulysses says.
class UlyssesAttention {
 public:
  // `options.dims` are the whole problem's (H, Hkv heads); check_ulysses must hold for them. The
  // groups are made before (make_ulysses_groups over `comm`'s ranks) and may be shared with other
  // UlyssesAttention objects used one at a time, so that their number does not multiply the
  // communicators (a session's plans share one group communicator per degree). The rows this rank
  // must hold are positions(), of layout(). A group communicator on host memory with a device
  // backend is refused (std::invalid_argument): wrap it in the host-staged one.
  UlyssesAttention(comm::Communicator& comm, AttentionBackend& backend, LayoutKind layout, int64_t seq_len,
                   const Mask& mask, const RingOptions& options, std::shared_ptr<UlyssesGroups> groups);

  int ulysses() const { return groups_->ulysses; }
  int group() const { return groups_->group; }
  int member() const { return groups_->member; }
  // With U = 1 there is no group communicator (nullptr). The ring always runs over `comm`.
  comm::Communicator* group_comm() { return groups_->group_comm.get(); }
  // The ring across groups (H/U heads, the group's rows; RingAttention::rank_at names its ranks).
  RingAttention& ring() { return *ring_; }
  const ShardLayout& layout() const { return layout_; }              // over the P ranks
  const ShardLayout& group_layout() const { return group_layout_; }  // over the G groups
  const UlyssesPlacement& placement() const { return groups_->placement; }

  int64_t rows() const { return static_cast<int64_t>(positions_.size()); }
  const std::vector<int64_t>& positions() const { return positions_; }
  // K/V bytes the ring part must receive (RingAttention::bytes_needed on H/U heads).
  uint64_t bytes_needed() const { return ring_->bytes_needed(); }
  // Payload this rank sent to other members in the all-to-alls of the last pass, and the time
  // spent in their exchanges (not overlapped with compute: exposed communication; the packing
  // and unpacking copies around them are not counted).
  uint64_t a2a_bytes_sent() const { return a2a_bytes_; }
  double a2a_seconds() const { return a2a_seconds_; }

  // As RingAttention::forward on this rank's rows (positions()); the returned stats are those of
  // the whole pass, with the all-to-all time added to wait_seconds, and bytes_sent the ring's.
  // Each forward is numbered (last_forward()): the number names the head-sharded copies of its
  // inputs kept for its backward.
  PassStats forward(const void* q, const void* k, const void* v, float* o, float* lse);
  uint64_t last_forward() const { return forward_count_; }
  // As RingAttention::backward. `saved` names the forward of these same q, k, v, o and lse
  // (last_forward() after it): while no other forward has run since, the head-sharded copies it
  // kept are used (as DeepSpeed's autograd keeps them); otherwise (or with 0) they are exchanged
  // again.
  PassStats backward(const void* q, const void* k, const void* v, const float* o, const float* lse,
                     const void* dout, float* dq, float* dk, float* dv, uint64_t saved = 0);

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

  // A tensor seen as (outer, a, b, inner bytes), row-major, and a box of it: [a0, a0 + na) x
  // [b0, b0 + nb) for every outer index. (B, rows, heads, D) is (B, rows, heads, D x element);
  // LSE (B, heads, rows) is (B, heads, rows, 4).
  struct Shape {
    int64_t outer, a, b;
    size_t inner;
  };
  struct Box {
    int64_t a0, na, b0, nb;
    bool operator==(const Box&) const = default;
  };
  // One tensor in both of its forms: sequence-sharded (this rank's rows, every head) and
  // head-sharded (the group's rows, this member's heads), with member j's box in each: its heads
  // of this rank's rows, and its rows of this rank's heads. The all-to-all to heads sends the
  // first boxes and receives into the second; the one back does the opposite.
  struct Resharding {
    Shape rows_form, heads_form;
    std::vector<Box> of_rows, of_heads;  // by member
    bool replicated = false;             // K/V heads copied to several members: their copies are summed back
  };
  Resharding tensor_resharding(int64_t heads, size_t elem, bool kv) const;  // (B, rows, heads, D)
  Resharding lse_resharding() const;                                         // (B, H, rows)
  enum class Direction { to_heads, to_rows };
  // Moves `src` (backend memory, the form the direction starts from) into `dst` (the other
  // form) by one all-to-all in the group; the exchange's time and bytes go to the counters.
  void reshard(const Resharding& r, Direction direction, const void* src, void* dst);
  // pack: the box of the tensor `src` into the dense (outer, na, nb, inner) block `dst`; else the
  // block `src` into the box of the tensor `dst`. Strided copies on the backend.
  void copy_box(const Shape& shape, const Box& box, const void* src, void* dst, bool pack);
  // `buffer` holds at least `bytes` (grown, never shrunk, between passes).
  void reserve(DeviceBuffer& buffer, size_t bytes);
  // Exchanges q, k and v into the group's head-sharded buffers (reserved on first use), and o and
  // lse when given (the backward pass's inputs).
  void inputs_to_heads(const void* q, const void* k, const void* v, const float* o = nullptr,
                       const float* lse = nullptr);

  comm::Communicator& comm_;
  AttentionBackend& backend_;
  RingOptions options_;
  std::shared_ptr<UlyssesGroups> groups_;
  ShardLayout layout_;
  ShardLayout group_layout_;
  int64_t group_rows_;
  std::vector<int64_t> positions_;
  kernels::AttentionDims local_dims_;
  std::unique_ptr<RingAttention> ring_;

  // Head-sharded tensors of the last exchange, in backend memory; kept_forward_: the forward whose
  // inputs they are (0: none, e.g. after a backward exchanged other tensors).
  DeviceBuffer q_heads_, k_heads_, v_heads_, o_heads_, lse_heads_;
  DeviceBuffer dout_heads_, dq_heads_, dk_heads_, dv_heads_;  // backward's
  DeviceBuffer send_, recv_;                                   // the all-to-all's packed blocks
  uint64_t forward_count_ = 0, kept_forward_ = 0;
  uint64_t a2a_bytes_ = 0;
  double a2a_seconds_ = 0.0;
};

}  // namespace ringattn
