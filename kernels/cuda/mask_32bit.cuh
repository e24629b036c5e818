// The mask arithmetic of tile_plan.hpp that the tensor-core kernels run per tile and per element,
// with positions divided by the block mask's block size in 32 bits: a 64-bit division is a
// subroutine call on the GPU. Valid when every position of a block mask fits in 31 bits
// (block_count * mask_block < 2^31), which the host checks before choosing the tensor-core
// kernels (attention_cuda.cu); without a block mask nothing here divides. Host/device, so the
// emulated tests compare each function with its 64-bit original.
#pragma once

#include <cstdint>

#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::gpu {

RINGATTN_HD unsigned mask_block_of(const MaskView& m, int64_t position) {
  return unsigned(position) / unsigned(m.mask_block);
}

// classify_tile of tile_plan.hpp with the block-mask rectangle scanned in 32-bit block indices
// (same rule, same result: the emulated tests compare the two); runs once per tile per CTA.
RINGATTN_HD TileKind classify_tile_32(const MaskView& m, const RowSpan& q, const RowSpan& k) {
  if (q.count <= 0 || k.count <= 0) return TileKind::empty;
  const TileKind by_interval = classify_intervals(key_range(m, q.pmin), key_range(m, q.pmax), k.pmin, k.pmax);
  if (by_interval == TileKind::empty || !m.has_block_mask()) return by_interval;
  const unsigned n = unsigned(m.mask_block);
  const unsigned r0 = unsigned(q.pmin) / n, r1 = unsigned(q.pmax) / n, c0 = unsigned(k.pmin) / n,
                 c1 = unsigned(k.pmax) / n;
  if (int64_t(r1 - r0 + 1) * int64_t(c1 - c0 + 1) > kMaxScannedMaskBlocks) return TileKind::partial;
  bool any = false, all = true;
  for (unsigned r = r0; r <= r1; ++r)
    for (unsigned c = c0; c <= c1; ++c) {
      const bool visible = m.block_mask[int64_t(r) * m.block_count + c] != 0;
      any = any || visible;
      all = all && visible;
    }
  return combine(by_interval, !any ? TileKind::empty : (all ? TileKind::full : TileKind::partial));
}

RINGATTN_HD RowMask row_mask_32(const MaskView& m, int64_t i) {
  const PosRange r = key_range(m, i);
  RowMask rm;
  rm.lo = r.lo;
  rm.hi = r.hi;
  rm.block_row = m.has_block_mask() ? mask_block_of(m, i) : 0;
  return rm;
}

RINGATTN_HD bool row_sees_32(const MaskView& m, const RowMask& rm, int64_t j) {
  if (j < rm.lo || j > rm.hi) return false;
  return !m.has_block_mask() || m.block_mask[rm.block_row * m.block_count + mask_block_of(m, j)] != 0;
}

}  // namespace ringattn::kernels::gpu
