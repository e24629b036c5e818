// How the L positions of a sequence are sharded over P ranks (docs/reference.md "Sharding and schedules", --layout).
//
//   contiguous  rank r holds one run of about L/P consecutive positions;
//   zigzag      the sequence is cut into 2P chunks and rank r holds chunks r and 2P-1-r, so every
//               rank holds as many early as late positions and causal work is balanced;
//   striped     position t lives on rank t mod P (balanced at token granularity).
// Any L >= P works: chunk sizes differ by at most one row. A shard is described by at most two
// arithmetic runs of positions, so no rank ever materialises the whole sequence's positions.
//
// Hybrid parallelism (ulysses U, runtime/ulysses_attention.hpp): the layout applies to the P/U
// groups, and member u of a group holds the u-th of U nearly equal consecutive parts of the
// group's rows (still at most two runs). Which ranks form the groups is the placement `members`:
// members[g U + u] is the rank of member u of group g (place_ulysses_groups puts a group on one
// node, runtime/placement.hpp); without it, group g is ranks gU .. gU + U - 1 and member u is rank gU + u. U = 1 is the
// plain layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ringattn {

enum class LayoutKind { contiguous, zigzag, striped };

const char* layout_name(LayoutKind kind);
// Parses "contiguous", "zigzag" or "striped"; throws ArgumentError naming layout otherwise.
LayoutKind parse_layout(const std::string& name);

// Positions start, start + stride, ..., start + (count - 1) * stride.
struct PositionRun {
  int64_t start = 0;
  int64_t count = 0;
  int64_t stride = 1;
  int64_t last() const { return start + (count - 1) * stride; }
};

class ShardLayout {
 public:
  // `members`: a permutation of the ranks (empty: consecutive ranks form the groups).
  ShardLayout(LayoutKind kind, int64_t seq_len, int ranks, int ulysses = 1, std::vector<int> members = {});

  LayoutKind kind() const { return kind_; }
  int64_t seq_len() const { return seq_len_; }
  int ranks() const { return ranks_; }
  int ulysses() const { return ulysses_; }
  int groups() const { return ranks_ / ulysses_; }
  // The layout of the groups alone (what the ring across groups shards by).
  ShardLayout group_layout() const { return ShardLayout(kind_, seq_len_, groups()); }
  // The rank of member u of group g, and the group and member of a rank.
  int member_rank(int group, int member) const;
  int group_of(int rank) const { return slot(rank) / ulysses_; }
  int member_of(int rank) const { return slot(rank) % ulysses_; }

  // The rank's positions in ascending order, as runs; local row t is the t-th position.
  std::vector<PositionRun> runs(int rank) const;
  int64_t rows(int rank) const;
  int64_t max_rows() const;
  std::vector<int64_t> positions(int rank) const;
  // Global position of the rank's local row.
  int64_t position(int rank, int64_t local_row) const;
  // The rank holding a position, and its local row there.
  struct Location {
    int rank;
    int64_t row;
  };
  Location locate(int64_t pos) const;

 private:
  // [start, start + size) of chunk c when the sequence is cut into n nearly equal chunks.
  int64_t chunk_start(int64_t c, int64_t n) const;
  // The layout over groups, and the first of a group's rows held by member u.
  std::vector<PositionRun> group_runs(int group) const;
  Location locate_in_group(int64_t pos) const;  // the group and the row in the group's rows
  int64_t member_begin(int64_t group_rows, int member) const { return group_rows * member / ulysses_; }
  // g U + u for member u of group g.
  int slot(int rank) const { return slot_of_rank_.empty() ? rank : slot_of_rank_[static_cast<size_t>(rank)]; }
  LayoutKind kind_;
  int64_t seq_len_;
  int ranks_;
  int ulysses_ = 1;
  std::vector<int> members_, slot_of_rank_;  // empty: consecutive ranks
};

}  // namespace ringattn
