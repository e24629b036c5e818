#include "kernels/cpu/tile_schedule.hpp"

#include <algorithm>

namespace ringattn::kernels::cpu {

std::vector<RowSpan> make_row_blocks(const int64_t* pos, int64_t rows, int block) {
  std::vector<RowSpan> out;
  int64_t j = 0;
  while (j < rows) {
    int64_t k = j + 1;
    int64_t stride = 0;
    while (k < rows && k - j < block) {
      const int64_t step = pos[k] - pos[k - 1];
      if (stride == 0) stride = step;
      else if (step != stride) break;
      if (stride == 1 && pos[k] % block == 0) break;
      ++k;
    }
    out.push_back(RowSpan{j, k - j, pos[j], pos[k - 1]});
    j = k;
  }
  return out;
}

namespace {

// Indices of the blocks whose positions meet [lo, hi].
std::pair<size_t, size_t> blocks_meeting(const std::vector<RowSpan>& blocks, int64_t lo, int64_t hi) {
  auto first = std::partition_point(blocks.begin(), blocks.end(), [&](const RowSpan& b) { return b.pmax < lo; });
  auto last = std::partition_point(first, blocks.end(), [&](const RowSpan& b) { return b.pmin <= hi; });
  return {static_cast<size_t>(first - blocks.begin()), static_cast<size_t>(last - blocks.begin())};
}

}  // namespace

void candidate_key_blocks(const MaskView& m, PosRange span, int64_t qmin, int64_t qmax,
                          const std::vector<RowSpan>& kblocks, std::vector<std::pair<size_t, size_t>>& ranges,
                          std::vector<int32_t>& out) {
  out.clear();
  if (span.empty()) return;
  ranges.clear();
  if (m.has_block_mask() && m.row_run_ptr) {
    const int64_t n = m.mask_block;
    for (int64_t br = qmin / n; br <= qmax / n; ++br) {
      for (int64_t r = m.row_run_ptr[br]; r < m.row_run_ptr[br + 1]; ++r) {
        const int64_t a = std::max(span.lo, int64_t{m.row_runs[2 * r]} * n);
        const int64_t b = std::min(span.hi, int64_t{m.row_runs[2 * r + 1]} * n - 1);
        if (a > b) continue;
        auto range = blocks_meeting(kblocks, a, b);
        if (range.first < range.second) ranges.push_back(range);
      }
    }
    std::sort(ranges.begin(), ranges.end());
  } else {
    auto range = blocks_meeting(kblocks, span.lo, span.hi);
    if (range.first < range.second) ranges.push_back(range);
  }
  size_t next = 0;
  for (const auto& [first, last] : ranges) {
    for (size_t kb = std::max(first, next); kb < last; ++kb) out.push_back(static_cast<int32_t>(kb));
    next = std::max(next, last);
  }
}

void lane_masks(const MaskView& m, const int64_t* qpos, const RowSpan& tile, int lanes, int64_t* lo, int64_t* hi,
                int64_t* brow) {
  for (int i = 0; i < lanes; ++i) {
    const RowMask rm = i < tile.count ? row_mask(m, qpos[tile.row0 + i]) : RowMask{};
    lo[i] = rm.lo;
    hi[i] = rm.hi;
    brow[i] = rm.block_row;
  }
}

}  // namespace ringattn::kernels::cpu
