// How the CPU kernels cut a call's rows into query tiles and key blocks, and which key blocks a
// query tile visits. The classification itself (empty / full / partial, the per-row element
// mask) is the host/device code of kernels/mask/tile_plan.hpp that the CUDA kernels use too;
// this file only adds the CPU's variable-length blocks.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/mask/mask_view.hpp"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::cpu {

// Splits rows (positions strictly increasing) into blocks of at most `block` rows. A block holds
// an arithmetic progression of positions; contiguous blocks start at multiples of `block`, so
// that tiles line up with the mask's blocks and with each other across ranks.
std::vector<RowSpan> make_row_blocks(const int64_t* pos, int64_t rows, int block);

// Key blocks that queries with positions in [qmin, qmax] may see: those meeting `span` (the
// union of the queries' key ranges), and, with a block-mask index, only those under nonzero
// mask blocks of the queries' mask rows. Ascending, without duplicates; `ranges` is scratch.
// Classification (classify_tile) happens afterwards.
void candidate_key_blocks(const MaskView& m, PosRange span, int64_t qmin, int64_t qmax,
                          const std::vector<RowSpan>& kblocks, std::vector<std::pair<size_t, size_t>>& ranges,
                          std::vector<int32_t>& out);

// Per-lane element masks of a query tile (row_mask, stored as three lane arrays for the vector
// code); lanes past the tile's rows see nothing.
void lane_masks(const MaskView& m, const int64_t* qpos, const RowSpan& tile, int lanes, int64_t* lo, int64_t* hi,
                int64_t* brow);

}  // namespace ringattn::kernels::cpu
