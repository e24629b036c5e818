// Exact attention over a sequence sharded across the ranks of a communicator: each rank keeps its
// queries and computes against K/V blocks as they arrive (RingPlan), merging partial states in a
// fixed order, with the transfers of the next step posted before the compute of this one.
//
// Transfers go as steps (Communicator::post_step): the K/V of ring step k is one step, and in
// backward the gradient returns computed at step k are another, posted right after that compute.
// Every rank posts the same sequence of steps (KV 1, then per step k: KV k+1, gradients k), empty
// ones included, so step n of one rank always meets step n of its peers; the plan makes the
// transfers of a step symmetric (a send of rank a to b at step k is b's receive from a).
//
// Buffers. The transfer buffers (two per kind, by step parity) are allocated once per
// RingAttention: those of forward in the constructor, those only backward uses (gradient
// partials and delta) by the first backward() before it posts anything. No pass allocates
// backend memory while transfers are in flight.
//
// The ring's ranks. Position i of the ring holds the layout's shard i. By default position i is
// rank i of the communicator (layout.ranks() == comm.size()); `ranks` may name a subset instead
// (ranks[i] is the communicator rank at position i), so that several rings share one
// communicator without one of their own (--ulysses: one ring per member index over the job's
// communicator). Then every rank of the communicator posts the same sequence of steps, as the
// rings have the same shape.
//
// Exposed communication (PassStats::wait_seconds) is the time blocked in every wait for a step,
// whether for data to arrive or for a send to free its buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/attention.hpp"
#include "runtime/backend.hpp"
#include "kernels/mask/mask.hpp"
#include "runtime/ring_plan.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

struct RingOptions {
  kernels::AttentionDims dims;
  DType dtype = DType::f32;
  Schedule schedule = Schedule::direct;
  KernelChoice kernel = KernelChoice::automatic;  // docs/reference.md --kernel (the backend says what it can run)
  bool deterministic = false;                     // docs/reference.md --deterministic: a bitwise-reproducible backward
};

// Parses "auto", "cudnn" or "own"; throws ArgumentError naming kernel otherwise.
KernelChoice parse_kernel_choice(const std::string& name);

// What one pass cost on this rank.
struct PassStats {
  double seconds = 0.0;          // wall time of the pass
  double wait_seconds = 0.0;     // blocked waiting for data: the exposed communication
  double compute_seconds = 0.0;  // in the kernels
  uint64_t bytes_sent = 0;       // payload sent by this rank
  int compute_steps = 0;
  int cudnn_steps = 0;           // of the compute steps: those cuDNN's fused attention ran
  int own_steps = 0;             // and those our kernels ran
};

class RingAttention {
 public:
  RingAttention(comm::Communicator& comm, AttentionBackend& backend, const ShardLayout& layout, const Mask& mask,
                const RingOptions& options, std::vector<int> ranks = {});
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;

  // This rank's position in the ring, and the communicator rank at a position.
  int position() const { return position_; }
  int rank_at(int position) const { return ranks_.empty() ? position : ranks_[static_cast<size_t>(position)]; }

  const RingPlan& plan() const { return plan_; }
  int64_t rows() const { return static_cast<int64_t>(positions_.size()); }
  const std::vector<int64_t>& positions() const { return positions_; }
  // Bytes of one K (or V) row across the batch: what a row costs to move.
  size_t kv_row_bytes() const;
  // K/V bytes this rank must receive because its queries see them (the floor for any schedule).
  uint64_t bytes_needed() const;

  // This rank's shard, in backend memory: q (B, rows, H, D), k and v (B, rows, Hkv, D) in the
  // options' dtype. Writes o (B, rows, H, D) and lse (B, H, rows), fp32.
  PassStats forward(const void* q, const void* k, const void* v, float* o, float* lse);
  // Given o and lse from forward and dout (dtype, like q): writes dq, dk, dv (fp32) for this shard.
  PassStats backward(const void* q, const void* k, const void* v, const float* o, const float* lse,
                     const void* dout, float* dq, float* dk, float* dv);

  // Called after each step of a pass with (steps done, steps in all); for --progress.
  std::function<void(int, int)> on_step;

 private:
  size_t kv_message_bytes(int64_t rows) const;
  size_t grad_message_bytes(int64_t rows) const;
  std::vector<int64_t> source_positions(int source, const std::vector<RowRange>& rows) const;
  // Hands every step this rank computes to the backend's prepare(); fills step_ids_.
  void prepare_backend();
  // Posts the K/V transfers of ring step `step` (1 <= step < P) as one communicator step.
  comm::StepHandle post_key_values(int step, const void* k, const void* v);
  void wait_step(comm::StepHandle& h, const std::string& what, PassStats& stats);
  void allocate_backward_buffers();
  int step_id(int step) const { return step_ids_.empty() ? -1 : step_ids_[size_t(step)]; }

  // Steps are posted with ring positions as peers; rank_at translates them.
  comm::StepHandle post(comm::StepTransfer* transfers, size_t count);
  std::string from_text(int position) const;

  comm::Communicator& comm_;
  std::vector<int> ranks_;  // empty: position = communicator rank
  int position_;
  AttentionBackend& backend_;
  const ShardLayout& layout_;
  const Mask& mask_;
  MaskView mask_view_;
  RingOptions options_;
  RingPlan plan_;
  std::vector<int64_t> positions_;
  std::vector<int> step_ids_;  // the backend's id of each step (index: step), -1: none
  int64_t max_rows_ = 0;  // the most rows any transfer of either pass moves
  // Step k uses index k % 2 of each pair.
  DeviceBuffer kv_in_[2];     // K/V arriving
  DeviceBuffer kv_out_[2];    // direct: own rows packed for the peer
  DeviceBuffer own_shard_;    // ring: this rank's shard, the relay's first message
  DeviceBuffer grad_in_[2];   // gradient partials arriving (backward)
  DeviceBuffer grad_out_[2];  // gradient partials computed here (backward)
  DeviceBuffer delta_;        // rowsum(dO * O) (backward)
  bool backward_buffers_ = false;
};

}  // namespace ringattn
