// The order in which the backward kernel's CTAs add to dQ, which makes the sum deterministic.
//
// The backward kernel (attention_mma_backward.cu) runs one CTA per key block; each adds its part
// of dQ (dS K) to every query tile it visits, in fp32. Floating-point addition is not associative,
// so the sum over key blocks is bitwise reproducible only if the additions to one tile always come
// in the same order. Here that order is ascending key block: the CTA of key block kb adds to a
// tile only after the previous visitor of that tile (the largest kb' < kb that visits it) has
// added and published kb' + 1 in the tile's flag (FlashAttention-3's deterministic backward
// orders its dQ additions per query block with a semaphore in the same way, there a counter).
//
// The waits cannot deadlock: a CTA waits only for CTAs of smaller key blocks, which come earlier
// in the launch order (key block is the slowest-varying part of the CTA index), so every CTA it
// waits for has been started before it (a GPU starts CTAs in index order) and waits, in turn, only
// for earlier ones. On the CPU emulation, blocks run one after another in index order and a wait
// must find its flag already set (emulation/cuda: a wait that would block fails the launch).
//
// Both sides must agree on "visits" exactly: the visiting CTA iterates over
// query_tiles_for_keys(its keys) and skips the tiles classify_tile_32 reports empty; the waiting
// CTA searches back with tile_visits, the same two tests made for one (tile, block) pair.
// Plain C++ (host and device), unit-tested against tile_plan.hpp on the CPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/mask_32bit.cuh"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::gpu {

// Whether the CTA of the key block `k` visits the query tile `q` (rows of q_pos): the tile lies in
// query_tiles_for_keys(k), i.e. one of its rows has a position in [query_range(k.pmin).lo,
// query_range(k.pmax).hi] (the test tiles_meeting makes, for one tile), and the mask does not hide
// the pair (classify_tile_32).
RINGATTN_HD bool tile_visits(const MaskView& m, const int64_t* q_pos, const RowSpan& q, const RowSpan& k) {
  if (q.count <= 0 || classify_tile_32(m, q, k) == TileKind::empty) return false;
  const int64_t lo = query_range(m, k.pmin).lo, hi = query_range(m, k.pmax).hi;
  if (lo > hi) return false;
  const int64_t r = q.row0 + first_at_or_after(q_pos + q.row0, q.count, lo);  // first row at or after lo
  return r < q.row0 + q.count && q_pos[r] <= hi;
}

// The key block that adds to query tile q's dQ just before key block kb does: the largest kb' < kb
// whose CTA visits q, or -1. Blocks that end before the first key any row of q may see
// (key_range is monotone) are hidden from q, and so are all blocks before them: the search stops
// there.
RINGATTN_HD int previous_visitor(const MaskView& m, const int64_t* q_pos, const RowSpan& q, const int64_t* k_pos,
                                 int64_t k_rows, int keys_per_block, int kb) {
  const int64_t first_key = key_range(m, q.pmin).lo;
  for (int j = kb - 1; j >= 0; --j) {
    const RowSpan k = row_span(k_pos, k_rows, keys_per_block, j);
    if (k.pmax < first_key) break;
    if (tile_visits(m, q_pos, q, k)) return j;
  }
  return -1;
}

}  // namespace ringattn::kernels::gpu
