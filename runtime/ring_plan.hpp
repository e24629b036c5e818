// Which K/V rows each rank needs from each other rank, and when they move (docs/reference.md
// "Sharding and schedules", --schedule).
//
// From the layout and the mask, before any data moves: rank r's queries see the union over its
// positions i of key_range(i) intersected with the block-mask row of i. Intersected with rank s's
// positions, that union is exactly the K/V rows r needs from s: nothing it does not use.
//
//   direct  at step k = 1..P-1 rank r sends to r+k the rows r+k needs from it, and receives from
//           r-k the rows it needs from r-k: one send and one receive per step, each exactly the
//           rows used (a causal rank sends nothing to ranks whose queries all precede its keys; a
//           window moves only the halo). Steps where a rank neither sends nor receives are skipped.
//   ring    the Ring Attention relay: at step k every rank passes the whole shard it holds to r+1
//           and receives the shard of r-k from r-1, P-1 hops in all (reference, neighbour-only
//           topologies).
// All ranks compute the same plan; every quantity is a function of (layout, mask, rank).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mask/mask_view.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

enum class Schedule { direct, ring };
const char* schedule_name(Schedule s);
Schedule parse_schedule(const std::string& name);  // throws ArgumentError naming schedule

// Local rows [begin, end) of one rank's shard.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
};
int64_t count_rows(const std::vector<RowRange>& ranges);

// Keys that some query of `queries` may see: sorted, disjoint, inclusive position intervals
// within [0, seq_len).
std::vector<PosRange> visible_keys(const MaskView& mask, const std::vector<PositionRun>& queries, int64_t seq_len);

// The local rows of a shard whose positions fall inside the (sorted, disjoint) intervals.
std::vector<RowRange> rows_within(const std::vector<PositionRun>& shard, const std::vector<PosRange>& intervals);

// Number of visible (query, key) pairs for the queries at these positions, keys over [0, seq_len):
// the work attention must do, and what FLOP counts are made of (docs/reference.md "Counting FLOPs").
int64_t count_visible_pairs(const MaskView& mask, const std::vector<PositionRun>& queries, int64_t seq_len);

// Number of the keys at the positions of `keys` (within [0, seq_len)) that query i sees: the
// count above one query at a time, for any run of keys (the cluster model counts the pairs between
// two ranks' shards). With a block mask the view must carry its BlockMaskIndex (Mask::view()).
int64_t count_visible_keys(const MaskView& mask, int64_t i, const PositionRun& keys, int64_t seq_len);

// What one rank does at one step of the ring.
struct RingStep {
  int step = 0;
  // K/V attended to at this step: rows of `source`'s shard (local to it); none when source < 0.
  int source = -1;
  std::vector<RowRange> source_rows;
  // Transfers posted for this step. recv: rows arriving from recv_peer (its local rows); send:
  // rows of this rank's own shard (direct) that send_peer needs. The ring relays whole shards.
  int recv_peer = -1;
  int64_t recv_rows = 0;
  int send_peer = -1;
  std::vector<RowRange> send_rows;
};

class RingPlan {
 public:
  RingPlan(const ShardLayout& layout, const MaskView& mask, Schedule schedule, int rank);

  Schedule schedule() const { return schedule_; }
  int rank() const { return rank_; }
  // steps()[k] for k = 1..P-1 (index 0 is the local step: source = rank, all rows).
  const std::vector<RingStep>& steps() const { return steps_; }
  // Rows this rank must receive because its queries see them (the least any schedule moves).
  int64_t rows_needed() const { return rows_needed_; }
  // Rows this rank sends in the forward pass under this schedule.
  int64_t rows_sent() const { return rows_sent_; }
  // Steps at which this rank computes (local step included).
  int compute_steps() const;

 private:
  Schedule schedule_;
  int rank_;
  std::vector<RingStep> steps_;
  int64_t rows_needed_ = 0;
  int64_t rows_sent_ = 0;
};

}  // namespace ringattn
