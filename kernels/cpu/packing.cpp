#include "kernels/cpu/packing.hpp"

#include <algorithm>

namespace ringattn::kernels::cpu {

// dst[d][i] = scale * src row (row0 + i), head h; lanes past nq are zero.
void pack_transposed(const void* src, DType dtype, int64_t first, int64_t row_stride, int nq, int head_dim,
                     int lanes, float scale, float* dst) {
  for (int i = 0; i < nq; ++i) {
    const int64_t base = first + i * row_stride;
    for (int d = 0; d < head_dim; ++d) dst[d * lanes + i] = scale * element(src, dtype, base + d);
  }
  for (int d = 0; d < head_dim; ++d)
    for (int i = nq; i < lanes; ++i) dst[d * lanes + i] = 0.0f;
}

PackedKeyValues pack_key_values(const AttentionDims& dims, const KeyValueRows& kv, PackRequest want, int threads) {
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
  const size_t n = static_cast<size_t>(B * Hkv * rows * D);
  if (want.k32) out.k_copy.resize(n), out.k = out.k_copy.data();
  if (want.v32) out.v_copy.resize(n), out.v = out.v_copy.data();
  if (want.k16) out.k16_copy.resize(n), out.k16 = out.k16_copy.data();
  if (want.v16) out.v16_copy.resize(n), out.v16 = out.v16_copy.data();
  if (!(want.k32 || want.v32 || want.k16 || want.v16)) return out;
  const auto* k16_in = static_cast<const bf16_bits*>(kv.k);
  const auto* v16_in = static_cast<const bf16_bits*>(kv.v);
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
        const int64_t src = ((b * rows + j) * Hkv + kvh) * D;
        const int64_t dst = ((b * Hkv + kvh) * rows + j) * D;
        if (want.k32)
          for (int64_t d = 0; d < D; ++d) out.k_copy[dst + d] = element(kv.k, kv.dtype, src + d);
        if (want.v32)
          for (int64_t d = 0; d < D; ++d) out.v_copy[dst + d] = element(kv.v, kv.dtype, src + d);
        if (want.k16) std::copy_n(k16_in + src, D, out.k16_copy.data() + dst);
        if (want.v16) std::copy_n(v16_in + src, D, out.v16_copy.data() + dst);
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
