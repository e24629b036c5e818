// The arithmetic of the decode kernel (kernels/cpu/decode_cpu.hpp) over the vector operations of
// `Isa`, included by each ISA translation unit inside its own namespace, before
// attention_tiles.inl (whose tile_kernels() lists these functions).
//
// Decode is memory-bound: each cached K/V row is read once per step and meets only the few query
// rows of its head's group (H / Hkv heads times the new tokens). So the kernel streams one head's
// rows in blocks of kDecodeKeyBlock, widening bf16 to fp32 once per block, and every query row of
// the group reuses the block from L1: scores as per-key accumulators over the head dim reduced by
// one register transpose, the online softmax per row, then O += P V with the rows' accumulators
// in registers and each V vector loaded once per group of rows.

namespace {

constexpr int kDecodeW = Isa::W;
constexpr int kDecodeKB = kDecodeKeyBlock;

// Scores of one (scaled) query row against kDecodeW key rows: lane j holds q . k_j.
inline Isa::V decode_scores(const float* q, const float* const* krow, int D) {
  Isa::V acc[kDecodeW];
  for (int j = 0; j < kDecodeW; ++j) acc[j] = Isa::zero();
  for (int d = 0; d < D; d += kDecodeW) {
    const Isa::V qv = Isa::load(q + d);
    for (int j = 0; j < kDecodeW; ++j) acc[j] = Isa::fmadd(qv, Isa::load(krow[j] + d), acc[j]);
  }
  Isa::transpose(acc);  // lane j of acc[k]: the k-th partial sum of key j
  for (int step = 1; step < kDecodeW; step *= 2)
    for (int k = 0; k + step < kDecodeW; k += 2 * step) acc[k] = Isa::add(acc[k], acc[k + step]);
  return acc[0];
}

// The same from bf16 pairs with the bf16 dot product (exact products, fp32 sums), unscaled.
inline Isa::V decode_scores_pairs(const uint32_t* q, const bf16_bits* const* krow, int D) {
  Isa::V acc[kDecodeW];
  for (int j = 0; j < kDecodeW; ++j) acc[j] = Isa::zero();
#if defined(RINGATTN_BF16_DOT)
  for (int c = 0; c < D / 2; c += kDecodeW) {
    const Isa::Pairs qv = Isa::load_pairs(q + c);
    for (int j = 0; j < kDecodeW; ++j)
      acc[j] = Isa::dot_pairs(acc[j], qv, Isa::load_pairs(reinterpret_cast<const uint32_t*>(krow[j]) + c));
  }
#else
  (void)q, (void)krow, (void)D;
#endif
  Isa::transpose(acc);
  for (int step = 1; step < kDecodeW; step *= 2)
    for (int k = 0; k + step < kDecodeW; k += 2 * step) acc[k] = Isa::add(acc[k], acc[k + step]);
  return acc[0];
}

// acc[r][d0 + c W ..] += sum_j p[r][j] V[j][d0 + c W ..] for RR rows and DV vectors of the head
// dim: each probability broadcast once per key, each V vector loaded (and widened) once per key.
template <int RR, int DV, bool BF16>
inline void decode_accumulate(float* acc, int D, int d0, const float* p, const void* const* vrow, int n) {
  Isa::V a[RR][DV];
  for (int i = 0; i < RR; ++i)
    for (int c = 0; c < DV; ++c) a[i][c] = Isa::load(acc + i * D + d0 + c * kDecodeW);
  for (int j = 0; j < n; ++j) {
    Isa::V pb[RR];
    for (int i = 0; i < RR; ++i) pb[i] = Isa::set1(p[i * kDecodeKB + j]);
    for (int c = 0; c < DV; ++c) {
      const Isa::V vv = BF16 ? Isa::load_bf16(static_cast<const bf16_bits*>(vrow[j]) + d0 + c * kDecodeW)
                             : Isa::load(static_cast<const float*>(vrow[j]) + d0 + c * kDecodeW);
      for (int i = 0; i < RR; ++i) a[i][c] = Isa::fmadd(pb[i], vv, a[i][c]);
    }
  }
  for (int i = 0; i < RR; ++i)
    for (int c = 0; c < DV; ++c) Isa::store(acc + i * D + d0 + c * kDecodeW, a[i][c]);
}

// Rows per register group of O += P V, and head-dim vectors per pass (RR x DV accumulators).
constexpr int kDecodeRows = 4;
constexpr int kDecodeVecs = kDecodeW >= 16 ? 4 : 2;

template <int RR, bool BF16>
inline void decode_accumulate_rows(float* acc, int D, const float* p, const void* const* vrow, int n) {
  const int vecs = D / kDecodeW;
  int c = 0;
  for (; c + kDecodeVecs <= vecs; c += kDecodeVecs)
    decode_accumulate<RR, kDecodeVecs, BF16>(acc, D, c * kDecodeW, p, vrow, n);
  for (; c < vecs; ++c) decode_accumulate<RR, 1, BF16>(acc, D, c * kDecodeW, p, vrow, n);
}

template <bool BF16>
void decode_accumulate_all(float* acc, int D, int nq, const float* s, const void* const* vrow, int n) {
  int r = 0;
  for (; r + kDecodeRows <= nq; r += kDecodeRows)
    decode_accumulate_rows<kDecodeRows, BF16>(acc + r * D, D, s + r * kDecodeKB, vrow, n);
  switch (nq - r) {
    case 3: decode_accumulate_rows<3, BF16>(acc + r * D, D, s + r * kDecodeKB, vrow, n); break;
    case 2: decode_accumulate_rows<2, BF16>(acc + r * D, D, s + r * kDecodeKB, vrow, n); break;
    case 1: decode_accumulate_rows<1, BF16>(acc + r * D, D, s + r * kDecodeKB, vrow, n); break;
    default: break;
  }
}

void decode_block(const DecodeBlockArgs& a) {
  const int D = a.head_dim, nq = a.nq;
  float* kf = a.scratch;           // [KB][D] widened K of the block (bf16 inputs on the FMA path)
  float* zero_row = kf + kDecodeKB * D;  // D floats (also D bf16 zeros)
  float* s = zero_row + D;  // [nq][KB]: scores, then probabilities
  for (int d = 0; d < D; ++d) zero_row[d] = 0.0f;
  const bool pairs = a.q_pairs != nullptr;
  int64_t q_min = a.q_pos[0], q_max = a.q_pos[0];
  for (int r = 1; r < nq; ++r) {
    q_min = a.q_pos[r] < q_min ? a.q_pos[r] : q_min;
    q_max = a.q_pos[r] > q_max ? a.q_pos[r] : q_max;
  }
  const size_t eb = a.bf16 ? 2 : 4;
  const float* krow[kDecodeKB];
  const bf16_bits* krow16[kDecodeKB];
  const void* vrow[kDecodeKB];
  for (int64_t j0 = 0; j0 < a.rows; j0 += kDecodeKB) {
    const int n = a.rows - j0 < kDecodeKB ? static_cast<int>(a.rows - j0) : kDecodeKB;
    const char* kb = static_cast<const char*>(a.k) + size_t(j0 * D) * eb;
    const char* vb = static_cast<const char*>(a.v) + size_t(j0 * D) * eb;
    for (int j = 0; j < kDecodeKB; ++j) {
      const bool valid = j < n;
      vrow[j] = valid ? static_cast<const void*>(vb + size_t(j * D) * eb) : zero_row;
      krow16[j] = valid ? reinterpret_cast<const bf16_bits*>(kb + size_t(j * D) * eb)
                        : reinterpret_cast<const bf16_bits*>(zero_row);
      if (!a.bf16) {
        krow[j] = valid ? reinterpret_cast<const float*>(kb + size_t(j * D) * eb) : zero_row;
      } else if (!pairs) {
        if (valid)
          for (int d = 0; d < D; d += kDecodeW) Isa::store(kf + j * D + d, Isa::load_bf16(krow16[j] + d));
        krow[j] = valid ? kf + j * D : zero_row;
      }
    }
    const int64_t* kp = a.k_pos + j0;
    // Every key of the block visible to every row: no element mask.
    const bool full = n == kDecodeKB && kp[n - 1] <= q_min && (a.window_left < 0 || kp[0] >= q_max - a.window_left);
    for (int r = 0; r < nq; ++r) {
      float* sr = s + r * kDecodeKB;
      for (int j = 0; j < kDecodeKB; j += kDecodeW) {
        const Isa::V sv = pairs ? Isa::mul(decode_scores_pairs(a.q_pairs + r * (D / 2), krow16 + j, D),
                                           Isa::set1(a.score_scale))
                                : decode_scores(a.q + r * D, krow + j, D);
        Isa::store(sr + j, sv);
      }
      if (!full) {
        const int64_t qi = a.q_pos[r];
        for (int j = 0; j < kDecodeKB; ++j)
          if (j >= n || kp[j] > qi || (a.window_left >= 0 && kp[j] < qi - a.window_left)) sr[j] = -__builtin_inff();
      }
      float block_max = sr[0];
      for (int j = 1; j < kDecodeKB; ++j) block_max = sr[j] > block_max ? sr[j] : block_max;
      if (block_max > a.m[r]) {
        const float alpha = __builtin_exp2f(a.m[r] - block_max);
        for (int d = 0; d < D; d += kDecodeW)
          Isa::store(a.acc + r * D + d, Isa::mul(Isa::load(a.acc + r * D + d), Isa::set1(alpha)));
        a.l[r] *= alpha;
        a.m[r] = block_max;
      }
      const Isa::V mv = Isa::set1(a.m[r]);
      Isa::V sum = Isa::zero();
      for (int j = 0; j < kDecodeKB; j += kDecodeW) {
        const Isa::V pv = Isa::exp2(Isa::sub(Isa::load(sr + j), mv));  // masked and padded keys: 0
        Isa::store(sr + j, pv);
        sum = Isa::add(sum, pv);
      }
      float lanes[kDecodeW];
      Isa::store(lanes, sum);
      float total = 0.0f;
      for (int k = 0; k < kDecodeW; ++k) total += lanes[k];
      a.l[r] += total;
    }
    if (a.bf16)
      decode_accumulate_all<true>(a.acc, D, nq, s, vrow, n);
    else
      decode_accumulate_all<false>(a.acc, D, nq, s, vrow, n);
  }
}

float read_loop(const float* p, int64_t n) {
  Isa::V a0 = Isa::zero(), a1 = Isa::zero(), a2 = Isa::zero(), a3 = Isa::zero();
  int64_t i = 0;
  for (; i + 4 * kDecodeW <= n; i += 4 * kDecodeW) {
    a0 = Isa::add(a0, Isa::load(p + i));
    a1 = Isa::add(a1, Isa::load(p + i + kDecodeW));
    a2 = Isa::add(a2, Isa::load(p + i + 2 * kDecodeW));
    a3 = Isa::add(a3, Isa::load(p + i + 3 * kDecodeW));
  }
  float lanes[kDecodeW];
  Isa::store(lanes, Isa::add(Isa::add(a0, a1), Isa::add(a2, a3)));
  float total = 0.0f;
  for (int k = 0; k < kDecodeW; ++k) total += lanes[k];
  for (; i < n; ++i) total += p[i];
  return total;
}

}  // namespace
