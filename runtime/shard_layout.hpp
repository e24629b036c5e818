// How the L positions of a sequence are sharded over P ranks (SPEC.md --layout).
//
//   contiguous  rank r holds one run of about L/P consecutive positions;
//   zigzag      the sequence is cut into 2P chunks and rank r holds chunks r and 2P-1-r, so every
//               rank holds as many early as late positions and causal work is balanced;
//   striped     position t lives on rank t mod P (balanced at token granularity).
// Any L >= P works: chunk sizes differ by at most one row. A shard is described by at most two
// arithmetic runs of positions, so no rank ever materialises the whole sequence's positions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ringattn {

enum class LayoutKind { contiguous, zigzag, striped };

const char* layout_name(LayoutKind kind);
// Parses "contiguous", "zigzag" or "striped"; throws UsageError naming --layout otherwise.
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
  ShardLayout(LayoutKind kind, int64_t seq_len, int ranks);

  LayoutKind kind() const { return kind_; }
  int64_t seq_len() const { return seq_len_; }
  int ranks() const { return ranks_; }

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
  LayoutKind kind_;
  int64_t seq_len_;
  int ranks_;
};

}  // namespace ringattn
