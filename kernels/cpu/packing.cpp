#include "kernels/cpu/packing.hpp"

#include <algorithm>

namespace ringattn::kernels::cpu {

namespace {

// One row of n elements of a source of either type, as fp32.
void row_to_float(const void* src, DType dtype, int64_t first, int64_t n, float* dst) {
  if (dtype == DType::f32) {
    std::copy_n(static_cast<const float*>(src) + first, n, dst);
  } else {
    const bf16_bits* in = static_cast<const bf16_bits*>(src) + first;
    for (int64_t d = 0; d < n; ++d) dst[d] = bf16_to_float(in[d]);
  }
}

}  // namespace

void pack_rows(const void* src, DType dtype, int64_t first, int64_t row_stride, int nq, int head_dim, float* dst) {
  for (int i = 0; i < nq; ++i) row_to_float(src, dtype, first + i * row_stride, head_dim, dst + int64_t(i) * head_dim);
}

void pack_lanes_from(PackLanesFn pack_lanes, const void* src, DType dtype, int64_t first, int64_t row_stride, int nq,
                     int head_dim, float scale, float* rows, float* dst, int lanes) {
  if (dtype == DType::f32) {
    pack_lanes(static_cast<const float*>(src) + first, row_stride, nq, head_dim, scale, dst, lanes);
  } else {
    pack_rows(src, dtype, first, row_stride, nq, head_dim, rows);
    pack_lanes(rows, head_dim, nq, head_dim, scale, dst, lanes);
  }
}

PackedKeyValues pack_key_values(const AttentionDims& dims, const KeyValueRows& kv, PackRequest want, int threads,
                                Workspace& workspace) {
  const int64_t B = dims.batch, Hkv = dims.kv_heads, D = dims.head_dim, rows = kv.rows;
  PackedKeyValues out;
  out.rows = rows;
  out.head_dim = D;
  // With one K/V head, (B, rows, 1, D) is head-major already: no copy in the input's own type.
  const bool in_place = Hkv == 1;
  const bool f32_in = kv.dtype == DType::f32, bf16_in = kv.dtype == DType::bf16;
  if (in_place && f32_in) {
    if (want.k32) out.k = static_cast<const float*>(kv.k), want.k32 = false;
    if (want.v32) out.v = static_cast<const float*>(kv.v), want.v32 = false;
  }
  if (in_place && bf16_in) {
    if (want.k16) out.k16 = static_cast<const bf16_bits*>(kv.k), want.k16 = false;
    if (want.v16) out.v16 = static_cast<const bf16_bits*>(kv.v), want.v16 = false;
  }
  if (!(want.k32 || want.v32 || want.k16 || want.v16)) return out;
  const size_t n = static_cast<size_t>(B * Hkv * rows * D);
  float* k32 = want.k32 ? workspace.take<float>(n) : nullptr;
  float* v32 = want.v32 ? workspace.take<float>(n) : nullptr;
  bf16_bits* k16 = want.k16 ? workspace.take<bf16_bits>(n) : nullptr;
  bf16_bits* v16 = want.v16 ? workspace.take<bf16_bits>(n) : nullptr;
  if (k32) out.k = k32;
  if (v32) out.v = v32;
  if (k16) out.k16 = k16;
  if (v16) out.v16 = v16;
  const auto* k16_in = static_cast<const bf16_bits*>(kv.k);
  const auto* v16_in = static_cast<const bf16_bits*>(kv.v);
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
        const int64_t src = ((b * rows + j) * Hkv + kvh) * D;
        const int64_t dst = ((b * Hkv + kvh) * rows + j) * D;
        if (k32) row_to_float(kv.k, kv.dtype, src, D, k32 + dst);
        if (v32) row_to_float(kv.v, kv.dtype, src, D, v32 + dst);
        if (k16) std::copy_n(k16_in + src, D, k16 + dst);
        if (v16) std::copy_n(v16_in + src, D, v16 + dst);
      }
  return out;
}

float* pack_value_blocks(const AttentionDims& dims, const KeyValueRows& kv, const std::vector<RowSpan>& blocks,
                         int key_block, PackLanesFn pack_lanes, int threads, Workspace& workspace) {
  const int64_t B = dims.batch, Hkv = dims.kv_heads, D = dims.head_dim, nblocks = static_cast<int64_t>(blocks.size());
  const int64_t block_floats = D * key_block, stride = Hkv * D;
  const bool f32_in = kv.dtype == DType::f32;
  float* out = workspace.take<float>(static_cast<size_t>(B * Hkv * nblocks * block_floats));
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> rows(f32_in ? 0 : static_cast<size_t>(block_floats));  // a block's bf16 rows as fp32
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t kvh = 0; kvh < Hkv; ++kvh)
        for (int64_t kb = 0; kb < nblocks; ++kb) {
          float* vt = out + ((b * Hkv + kvh) * nblocks + kb) * block_floats;
          const RowSpan& blk = blocks[static_cast<size_t>(kb)];
          const int64_t first = ((b * kv.rows + blk.row0) * Hkv + kvh) * D;
          pack_lanes_from(pack_lanes, kv.v, kv.dtype, first, stride, static_cast<int>(blk.count), int(D), 1.0f,
                          rows.data(), vt, key_block);
        }
  }
  return out;
}

bf16_bits* pack_value_blocks_bf16(const AttentionDims& dims, const KeyValueRows& kv, const std::vector<RowSpan>& blocks,
                                  int key_block, int threads, Workspace& workspace) {
  const int64_t B = dims.batch, Hkv = dims.kv_heads, D = dims.head_dim, nblocks = static_cast<int64_t>(blocks.size());
  const int64_t block_elems = D * key_block, stride = Hkv * D;
  bf16_bits* out = workspace.take<bf16_bits>(static_cast<size_t>(B * Hkv * nblocks * block_elems));
  const auto* in = static_cast<const bf16_bits*>(kv.v);
#pragma omp parallel for collapse(3) num_threads(threads) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kvh = 0; kvh < Hkv; ++kvh)
      for (int64_t kb = 0; kb < nblocks; ++kb) {
        bf16_bits* vt = out + ((b * Hkv + kvh) * nblocks + kb) * block_elems;
        const RowSpan& blk = blocks[static_cast<size_t>(kb)];
        const bf16_bits* rows = in + ((b * kv.rows + blk.row0) * Hkv + kvh) * D;
        // One head dim's keys at a time: the block's rows (a few cache lines each) stay in L1.
        for (int64_t d = 0; d < D; ++d)
          for (int64_t j = 0; j < key_block; ++j) vt[d * key_block + j] = j < blk.count ? rows[j * stride + d] : bf16_bits{0};
      }
  return out;
}

// dst[p][i] = bf16 pair (row i, head dims 2p and 2p + 1) of a bf16 source; lanes past nq are zero.
void pack_pairs(const void* src, int64_t first, int64_t row_stride, int nq, int head_dim, int lanes, uint32_t* dst) {
  const auto* in = static_cast<const bf16_bits*>(src);
  for (int i = 0; i < nq; ++i) {
    const bf16_bits* row = in + first + i * row_stride;
    for (int p = 0; p < head_dim / 2; ++p)
      dst[p * lanes + i] = uint32_t{row[2 * p]} | (uint32_t{row[2 * p + 1]} << 16);
  }
  for (int p = 0; p < head_dim / 2; ++p)
    for (int i = nq; i < lanes; ++i) dst[p * lanes + i] = 0;
}

void pack_row_pairs(const void* src, int64_t first, int64_t row_stride, int nq, int head_dim, int lanes, uint32_t* dst) {
  const auto* in = static_cast<const bf16_bits*>(src);
  for (int p = 0; p < lanes / 2; ++p) {
    const int i = 2 * p;
    const bf16_bits* r0 = in + first + i * row_stride;
    const bf16_bits* r1 = r0 + row_stride;
    uint32_t* out = dst + int64_t(p) * head_dim;
    for (int d = 0; d < head_dim; ++d) {
      const uint32_t lo = i < nq ? r0[d] : 0, hi = i + 1 < nq ? r1[d] : 0;
      out[d] = lo | (hi << 16);
    }
  }
}

}  // namespace ringattn::kernels::cpu
