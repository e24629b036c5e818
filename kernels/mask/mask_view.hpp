// Mask arithmetic of docs/reference.md, written once for the host and the device.
//
// Positions are global and 0-based (query i, key j). Every enabled condition must hold:
//   causal: j <= i;  window (LEFT, RIGHT): i - LEFT <= j <= i + RIGHT (-1 = unbounded);
//   documents: i and j in the same document;  block mask: mask[i / N][j / N] != 0.
// The first three conditions give each query one contiguous interval of visible keys
// (key_range); the block mask is applied on top. Everything here is side-effect free and is
// unit-tested on the CPU; the CUDA kernels include the same functions.
#pragma once

#include <cstdint>

#include "util/dtype.hpp"

namespace ringattn {

inline constexpr int64_t kUnboundedWindow = -1;
// Larger than any position, small enough that i + kFarAway never overflows.
inline constexpr int64_t kFarAway = int64_t{1} << 60;

// Inclusive interval of positions; empty when lo > hi.
struct PosRange {
  int64_t lo;
  int64_t hi;
  RINGATTN_HD bool empty() const { return lo > hi; }
  RINGATTN_HD bool contains(int64_t p) const { return lo <= p && p <= hi; }
};

// A non-owning view of the mask, cheap to copy into a kernel's parameters.
struct MaskView {
  bool causal = false;
  int64_t window_left = kUnboundedWindow;
  int64_t window_right = kUnboundedWindow;
  // Packed documents: document d covers [doc_offsets[d], doc_offsets[d + 1]); null = one document.
  const int64_t* doc_offsets = nullptr;
  int64_t num_docs = 0;
  // Block mask: (block_count x block_count) row-major bytes, nonzero = visible; null = none.
  const uint8_t* block_mask = nullptr;
  int64_t block_count = 0;
  int64_t mask_block = 128;
  // Optional index of the block mask for skipping whole rows/columns of empty blocks (see
  // BlockMaskIndex): runs [c0, c1) of nonzero columns of block row r are
  // row_runs[2k], row_runs[2k+1] for k in [row_run_ptr[r], row_run_ptr[r + 1]); likewise per
  // block column for the transpose.
  const int64_t* row_run_ptr = nullptr;
  const int32_t* row_runs = nullptr;
  const int64_t* col_run_ptr = nullptr;
  const int32_t* col_runs = nullptr;

  RINGATTN_HD bool has_block_mask() const { return block_mask != nullptr; }
  RINGATTN_HD bool has_docs() const { return doc_offsets != nullptr; }
};

// Index of the document holding position p (doc_offsets is non-decreasing, starts at 0).
RINGATTN_HD int64_t document_of(const MaskView& m, int64_t p) {
  int64_t lo = 0, hi = m.num_docs;  // answer in [lo, hi)
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (m.doc_offsets[mid] <= p) lo = mid; else hi = mid;
  }
  return lo;
}

// Keys a query at position i may see under causal, window and documents (not the block mask).
RINGATTN_HD PosRange key_range(const MaskView& m, int64_t i) {
  PosRange r{0, kFarAway};
  if (m.causal) r.hi = i;
  if (m.window_left >= 0 && i - m.window_left > r.lo) r.lo = i - m.window_left;
  if (m.window_right >= 0 && i + m.window_right < r.hi) r.hi = i + m.window_right;
  if (m.has_docs()) {
    int64_t d = document_of(m, i);
    if (m.doc_offsets[d] > r.lo) r.lo = m.doc_offsets[d];
    if (m.doc_offsets[d + 1] - 1 < r.hi) r.hi = m.doc_offsets[d + 1] - 1;
  }
  return r;
}

// Queries that may see a key at position j (the transpose of key_range).
RINGATTN_HD PosRange query_range(const MaskView& m, int64_t j) {
  PosRange r{0, kFarAway};
  if (m.causal) r.lo = j;
  if (m.window_right >= 0 && j - m.window_right > r.lo) r.lo = j - m.window_right;
  if (m.window_left >= 0 && j + m.window_left < r.hi) r.hi = j + m.window_left;
  if (m.has_docs()) {
    int64_t d = document_of(m, j);
    if (m.doc_offsets[d] > r.lo) r.lo = m.doc_offsets[d];
    if (m.doc_offsets[d + 1] - 1 < r.hi) r.hi = m.doc_offsets[d + 1] - 1;
  }
  return r;
}

RINGATTN_HD bool block_visible(const MaskView& m, int64_t i, int64_t j) {
  if (!m.has_block_mask()) return true;
  return m.block_mask[(i / m.mask_block) * m.block_count + (j / m.mask_block)] != 0;
}

// The whole mask for one (query, key) pair.
RINGATTN_HD bool visible(const MaskView& m, int64_t i, int64_t j) {
  return key_range(m, i).contains(j) && block_visible(m, i, j);
}

// How a tile of queries relates to a block of keys, decided before any arithmetic:
// skip it, compute it without a mask, or apply the element mask on it.
enum class TileKind : uint8_t { empty, full, partial };

// Classifies queries with positions in [qmin, qmax] against keys in [kmin, kmax], given the
// key ranges of the first and last query (key_range is monotone in the query position, so
// these bound every query in between). Conservative: 'full' and 'empty' are exact claims,
// 'partial' only means the element mask must be evaluated.
RINGATTN_HD TileKind classify_intervals(PosRange first_q_keys, PosRange last_q_keys, int64_t kmin, int64_t kmax) {
  // Empty: every key lies outside the union of the queries' intervals.
  if (kmin > last_q_keys.hi || kmax < first_q_keys.lo) return TileKind::empty;
  // Full: every key lies inside the intersection of the queries' intervals.
  if (kmin >= last_q_keys.lo && kmax <= first_q_keys.hi) return TileKind::full;
  return TileKind::partial;
}

// Block-mask part of the classification over the rectangle of mask blocks the tile touches.
RINGATTN_HD TileKind classify_block_mask(const MaskView& m, int64_t qmin, int64_t qmax, int64_t kmin, int64_t kmax) {
  if (!m.has_block_mask()) return TileKind::full;
  bool any = false, all = true;
  for (int64_t br = qmin / m.mask_block; br <= qmax / m.mask_block; ++br) {
    const uint8_t* row = m.block_mask + br * m.block_count;
    for (int64_t bc = kmin / m.mask_block; bc <= kmax / m.mask_block; ++bc) {
      if (row[bc]) any = true; else all = false;
    }
  }
  return !any ? TileKind::empty : (all ? TileKind::full : TileKind::partial);
}

RINGATTN_HD TileKind combine(TileKind a, TileKind b) {
  if (a == TileKind::empty || b == TileKind::empty) return TileKind::empty;
  if (a == TileKind::full && b == TileKind::full) return TileKind::full;
  return TileKind::partial;
}

}  // namespace ringattn
