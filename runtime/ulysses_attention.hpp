// Hybrid sequence parallelism (SPEC.md "Hybrid parallelism", --ulysses U): DeepSpeed-Ulysses'
// all-to-all inside groups of U ranks, the ring across the P/U groups.
//
// Groups. The P ranks form G = P/U groups of U ranks (place_ulysses_groups). By default a group is
// U ranks of one node (the nodes from MPI_Comm_split_type, Communicator::node_of_ranks), so the
// all-to-all stays on the fast intra-node link whatever order the launcher gave the ranks
// (round-robin placement included); this needs every node to hold a multiple of U ranks, and
// otherwise the groups are U consecutive ranks (some then span nodes: a note says so, once, on
// rank 0). Groups are numbered node by node (nodes in the order of their least rank), so the
// ring across them crosses nodes as few times as the placement allows; with one node, or
// consecutive ranks per node (Open MPI's default --map-by slot, Slurm's block distribution),
// group g is ranks gU .. gU + U - 1. ShardLayout holds the placement, so the layout, the
// --check and the output files know every rank's rows.
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
#include "runtime/ring_attention.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

// Throws UsageError naming --ulysses and the value it conflicts with: U < 1, U not dividing the
// ranks P, the heads H not divisible by U, or Hkv neither a multiple nor a divisor of U.
void check_ulysses(int ulysses, int ranks, int64_t heads, int64_t kv_heads);

// Which ranks form the groups.
struct UlyssesPlacement {
  std::vector<int> members;  // members[g U + u]: the rank of member u of group g
  bool node_local = true;    // every group lies in one node
  std::string note;          // why not, when not ("" otherwise)
};
// From the node of every rank (ids: equal for ranks that share a node): when every node holds a
// multiple of U ranks, each group is U ranks of one node in rank order, groups numbered node by
// node (nodes in the order of their least rank); otherwise groups of U consecutive ranks.
UlyssesPlacement place_ulysses_groups(const std::vector<int>& node_of_rank, int ulysses);
// The node ids the environment variable RINGATTN_TEST_NODES lists (comma-separated, one per rank
// of `ranks`), so that tests on one machine can place ranks on pretend nodes; nothing when it is
// unset. No communication; throws UsageError naming the variable when it is malformed.
std::optional<std::vector<int>> pretend_nodes(int ranks);
// The node of every rank of `comm` (collective): pretend_nodes where set, else
// Communicator::node_of_ranks.
std::vector<int> find_nodes(comm::Communicator& comm);
// The sharding of seq_len positions over the ranks of `comm` with the groups placed as above
// (ulysses = 1: the plain layout). Collective over comm when ulysses > 1. The jobs build their
// inputs, outputs and checks on it, so that they hold the rows the library's context gives them.
ShardLayout hybrid_layout(comm::Communicator& comm, LayoutKind kind, int64_t seq_len, int ulysses);

// The groups of `comm` (collective over it): this rank's group and member index, the placement,
// the communicator of its group (U ranks, ordered by member) and the ranks of its ring (one per
// group, ordered by group).
struct UlyssesGroups {
  int ulysses = 1, groups = 1, group = 0, member = 0;
  UlyssesPlacement placement;
  std::unique_ptr<comm::Communicator> group_comm;
  std::vector<int> ring_ranks;
};
UlyssesGroups make_ulysses_groups(comm::Communicator& comm, int ulysses);

// With U = 1 it is the plain RingAttention over `comm` (no copies, no all-to-all), so that jobs
// hold one kind of object whatever --ulysses says.
class UlyssesAttention {
 public:
  // `options.dims` are the whole problem's (H, Hkv heads); check_ulysses must hold. Collective
  // over `comm` (finds the nodes, splits the groups' communicators, which keep the settings of
  // `comm`, timeout and link emulation, unless set afterwards). The rows this rank must hold are
  // positions(), of layout(): with U > 1 they depend on the placement of the ranks on nodes, so
  // take them from here rather than from a ShardLayout of one's own. A communicator on host
  // memory with a device backend is refused (std::invalid_argument): wrap it in the host-staged
  // one.
  UlyssesAttention(comm::Communicator& comm, AttentionBackend& backend, LayoutKind layout, int64_t seq_len,
                   const Mask& mask, const RingOptions& options, int ulysses);
  // The same over groups made before (make_ulysses_groups over `comm`) and shared with other
  // UlyssesAttention objects used one at a time, so that their number does not multiply the
  // communicators (the library's plans share one group communicator).
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

  // Head-sharded tensors of the last forward, in backend memory, and the arguments they came from.
  DeviceBuffer q_heads_, k_heads_, v_heads_, o_heads_, lse_heads_;
  DeviceBuffer dout_heads_, dq_heads_, dk_heads_, dv_heads_;  // backward's
  DeviceBuffer send_, recv_;                                   // the all-to-all's packed blocks
  const void* forward_args_[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  uint64_t a2a_bytes_ = 0;
  double a2a_seconds_ = 0.0;
};

}  // namespace ringattn
