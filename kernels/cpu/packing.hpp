// Packing a call's rows into the layouts the tile functions read: rows as fp32 (which the ISA's
// pack_lanes then transposes into query tiles), bf16 pairs, K/V head-major and V^T blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/cpu/tile_args.hpp"
#include "kernels/cpu/workspace.hpp"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::cpu {

inline float element(const void* base, DType dtype, int64_t index) {
  return dtype == DType::f32 ? static_cast<const float*>(base)[index]
                             : bf16_to_float(static_cast<const bf16_bits*>(base)[index]);
}

// K and V of one call in head-major order [b][kv head][row][d]: fp32 for the fp32 arithmetic,
// and (bf16 inputs on an ISA with a bf16 dot product) bf16 for the products that take bf16
// pairs. Packing once per call costs O(rows) next to O(rows_q * rows) of arithmetic, and keeps
// each head's rows contiguous: in the (B, rows, Hkv, D) input, consecutive rows of one head are
// Hkv*D elements apart, often a whole page, and streaming a block of them thrashes the TLB
// (measured: 2.5x slower at Hkv = 8).
struct PackedKeyValues {
  // Head-major rows: the caller's arrays themselves when their layout already is head-major
  // (a single K/V head, as in MQA) and their type is the one asked for; else copies in the
  // call's workspace.
  const float* k = nullptr;
  const float* v = nullptr;
  const bf16_bits* k16 = nullptr;
  const bf16_bits* v16 = nullptr;
  int64_t rows = 0, head_dim = 0;
  int64_t offset(int64_t b, int64_t kvh, int64_t kv_heads) const { return ((b * kv_heads + kvh) * rows) * head_dim; }
};

struct PackRequest {
  bool k32 = false, v32 = false, k16 = false, v16 = false;
};

// dst[i][d] = src row (first + i * row_stride) as fp32, rows of head_dim elements.
void pack_rows(const void* src, DType dtype, int64_t first, int64_t row_stride, int nq, int head_dim, float* dst);

// dst[d][i] = scale * source row i (i < nq; lanes past nq 0), [D][lanes], through the ISA's
// register transposes (pack_lanes): fp32 rows straight from the source, bf16 rows converted into
// `rows` ([nq][D], fp32) first. Query tiles (lanes = Br) and V^T blocks (lanes = Bc).
void pack_lanes_from(PackLanesFn pack_lanes, const void* src, DType dtype, int64_t first, int64_t row_stride, int nq,
                     int head_dim, float scale, float* rows, float* dst, int lanes);

PackedKeyValues pack_key_values(const AttentionDims& dims, const KeyValueRows& kv, PackRequest want, int threads,
                                Workspace& workspace);

// V of each key block transposed, [b][kv head][block][d][j], key_block columns per block (zero past
// the block's rows): the operand of O += P V. Its broadcasts then walk one head dim's keys
// contiguously instead of one cache line per key (measured: 8% of a forward call at D = 128).
// Packed once per call, O(rows * D), for all the query tiles that visit the blocks.
// pack_lanes: the ISA's register transposes (TileKernels::pack_lanes).
float* pack_value_blocks(const AttentionDims& dims, const KeyValueRows& kv, const std::vector<RowSpan>& blocks,
                         int key_block, PackLanesFn pack_lanes, int threads, Workspace& workspace);

// The same from bf16 rows, as bf16 [b][kv head][block][d][j] (zero past each block's rows): the A
// operand of the AMX kernel's O^T += V^T P^T.
bf16_bits* pack_value_blocks_bf16(const AttentionDims& dims, const KeyValueRows& kv, const std::vector<RowSpan>& blocks,
                                  int key_block, int threads, Workspace& workspace);

// dst[p][i] = bf16 pair (row i, head dims 2p and 2p + 1) of a bf16 source; lanes past nq are zero.
void pack_pairs(const void* src, int64_t first, int64_t row_stride, int nq, int head_dim, int lanes, uint32_t* dst);

// dst[p][d] = bf16 pair (rows 2p and 2p + 1, head dim d) of a bf16 source, for products whose sums
// run over the rows (dK = dS^T Q, dV = P^T dO); rows past nq are zero. lanes/2 pairs of rows.
void pack_row_pairs(const void* src, int64_t first, int64_t row_stride, int nq, int head_dim, int lanes, uint32_t* dst);

}  // namespace ringattn::kernels::cpu
