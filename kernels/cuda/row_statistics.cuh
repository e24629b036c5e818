// What the backward kernels need of each query row of a tile, staged in shared memory once per
// tile: its element mask, its LSE as a log2 offset (+inf for rows that saw no key, so P = 0) and
// delta = rowsum(dO * O). Padding rows past the tile's end see nothing.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mask_32bit.cuh"
#include "kernels/cuda/params.cuh"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::gpu {

__device__ __forceinline__ void load_row_statistics(const AttentionParams& p, const RowSpan& qspan, int64_t b,
                                                    int64_t h, int rows, RowMask* rmask, float* lse2, float* delta,
                                                    int tid, int threads) {
  for (int r = tid; r < rows; r += threads) {
    const bool valid = r < qspan.count;
    const int64_t at = (b * p.heads + h) * p.q_rows + qspan.row0 + r;
    rmask[r] = valid ? row_mask_32(p.mask, p.q_pos[qspan.row0 + r]) : RowMask{};
    lse2[r] = valid ? lse_to_log2_offset(p.lse_in[at]) : pos_inf();
    delta[r] = valid ? p.delta[at] : 0.0f;
  }
}

}  // namespace ringattn::kernels::gpu
