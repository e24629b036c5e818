// Which key blocks a query tile visits, and how (and the transpose, for the backward pass):
// the block-skipping plan of the CUDA kernels, written once for the host and the device so
// that it is unit-tested on the CPU (tests/kernels/mask/test_tile_plan.cpp) and runs unchanged inside
// the kernels. Plain C++ (no CUDA headers needed).
//
// Tiles are fixed runs of rows: tile t of a row set holds rows [t * rows_per_tile, ...). Rows
// carry global positions (strictly increasing), which need not be contiguous (zigzag and
// striped shards, gathered K/V rows): everything here bounds a tile by its first and last
// positions, which is exact for the interval masks (key_range is monotone in the query
// position) and conservative for the block mask.
#pragma once

#include <cstdint>

#include "kernels/mask/mask_view.hpp"

namespace ringattn::kernels {

// Rows [row0, row0 + count) of a row set and their first and last positions.
struct RowSpan {
  int64_t row0 = 0;
  int64_t count = 0;
  int64_t pmin = 0;
  int64_t pmax = -1;
};

// A half-open range of tile (or block) indices.
struct TileRange {
  int64_t first = 0;
  int64_t last = 0;  // one past
  RINGATTN_HD bool empty() const { return first >= last; }
};

RINGATTN_HD int64_t tile_count(int64_t rows, int64_t rows_per_tile) {
  return (rows + rows_per_tile - 1) / rows_per_tile;
}

RINGATTN_HD RowSpan row_span(const int64_t* pos, int64_t rows, int64_t rows_per_tile, int64_t tile) {
  RowSpan s;
  s.row0 = tile * rows_per_tile;
  s.count = rows - s.row0 < rows_per_tile ? rows - s.row0 : rows_per_tile;
  s.pmin = pos[s.row0];
  s.pmax = pos[s.row0 + s.count - 1];
  return s;
}

// First index i in [0, n) with pos[i] >= value, or n.
RINGATTN_HD int64_t first_at_or_after(const int64_t* pos, int64_t n, int64_t value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pos[mid] < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Tiles of `rows_per_tile` rows holding a position in [lo, hi].
RINGATTN_HD TileRange tiles_meeting(const int64_t* pos, int64_t rows, int64_t rows_per_tile, int64_t lo, int64_t hi) {
  TileRange r;
  if (lo > hi || rows <= 0) return r;
  const int64_t a = first_at_or_after(pos, rows, lo);
  const int64_t b = hi >= kFarAway ? rows : first_at_or_after(pos, rows, hi + 1);  // rows [a, b)
  if (a >= b) return r;
  r.first = a / rows_per_tile;
  r.last = (b - 1) / rows_per_tile + 1;
  return r;
}

// Key blocks that the queries of `q` may see under causal, window and documents: every block
// holding a key in [key_range(first query).lo, key_range(last query).hi]. Blocks the block mask
// hides are not removed here; classify_tile reports them empty.
RINGATTN_HD TileRange key_blocks_for_queries(const MaskView& m, const RowSpan& q, const int64_t* k_pos, int64_t k_rows,
                                             int64_t keys_per_block) {
  return tiles_meeting(k_pos, k_rows, keys_per_block, key_range(m, q.pmin).lo, key_range(m, q.pmax).hi);
}

// Query tiles that may see the keys of `k` (the transpose, for dK/dV).
RINGATTN_HD TileRange query_tiles_for_keys(const MaskView& m, const RowSpan& k, const int64_t* q_pos, int64_t q_rows,
                                           int64_t queries_per_tile) {
  return tiles_meeting(q_pos, q_rows, queries_per_tile, query_range(m, k.pmin).lo, query_range(m, k.pmax).hi);
}

// Rectangles of more mask blocks than this are not scanned: reported partial, i.e. the element
// mask decides (a tile of gathered rows can span a long stretch of positions).
inline constexpr int64_t kMaxScannedMaskBlocks = 256;

// How query tile `q` relates to key block `k`: empty (skip before any arithmetic), full (no
// element mask) or partial (apply the element mask). 'empty' and 'full' are exact claims.
RINGATTN_HD TileKind classify_tile(const MaskView& m, const RowSpan& q, const RowSpan& k) {
  if (q.count <= 0 || k.count <= 0) return TileKind::empty;
  const TileKind by_interval = classify_intervals(key_range(m, q.pmin), key_range(m, q.pmax), k.pmin, k.pmax);
  if (by_interval == TileKind::empty || !m.has_block_mask()) return by_interval;
  const int64_t n = m.mask_block;
  const int64_t area = (q.pmax / n - q.pmin / n + 1) * (k.pmax / n - k.pmin / n + 1);
  if (area > kMaxScannedMaskBlocks) return TileKind::partial;
  return combine(by_interval, classify_block_mask(m, q.pmin, q.pmax, k.pmin, k.pmax));
}

// The element mask of one query row, precomputed once per tile: visible(m, i, j) is
// row_sees(m, row_mask(m, i), j).
struct RowMask {
  int64_t lo = kFarAway;  // key_range(i); empty for padding rows
  int64_t hi = -1;
  int64_t block_row = 0;  // i / mask_block (block mask only)
};

RINGATTN_HD RowMask row_mask(const MaskView& m, int64_t i) {
  const PosRange r = key_range(m, i);
  RowMask rm;
  rm.lo = r.lo;
  rm.hi = r.hi;
  rm.block_row = m.has_block_mask() ? i / m.mask_block : 0;
  return rm;
}

RINGATTN_HD bool row_sees(const MaskView& m, const RowMask& rm, int64_t j) {
  if (j < rm.lo || j > rm.hi) return false;
  return !m.has_block_mask() || m.block_mask[rm.block_row * m.block_count + j / m.mask_block] != 0;
}

}  // namespace ringattn::kernels
