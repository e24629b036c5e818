// The arithmetic of the decode kernel (kernels/cpu/decode_cpu.hpp) over the vector operations of
// `Isa`, included by each ISA translation unit inside its own namespace, before
// attention_tiles.inl (whose tile_kernels() lists these functions).
//
// Decode is memory-bound: each cached K/V row is read once per step and meets only the few query
// rows of its head's group (H / Hkv heads times the new tokens). One call takes a run of at most
// kDecodeChunkRows of one head's rows in two streaming passes, the rows' scores kept in L2 between:
// - pass 1 streams K in blocks of kDecodeKeyBlock that every query row reuses from L1: W keys at
//   a time as W per-key accumulators over the head dim, reduced together by sum_lanes into one
//   vector of scores (lane j: key j);
// - the softmax of each row over the whole run, on whole vectors: its max is known before any
//   exp2, so nothing is rescaled (no per-block max, no running-max bookkeeping);
// - pass 2 streams V: O += P V with the rows' accumulators in registers, each V vector loaded
//   (and widened) once per group of rows, each block's products summed from zero and then added
//   to the running sum (docs/kernels.md "Long sums").
// One stream at a time, read in address order: what the hardware prefetcher follows best.

namespace {

constexpr int kDecodeW = Isa::W;
constexpr int kDecodeKB = kDecodeKeyBlock;
constexpr int kDecodeSV = kDecodeKB / kDecodeW;  // score vectors per row and block
static_assert(kDecodeKB % kDecodeW == 0, "a key block is whole vectors of scores");
// The max of a row that sees no key: finite, so that s - max is never -inf - -inf (and p = 0).
constexpr float kDecodeNoKey = -3.402823466e38f;

// Lane j: the (scaled) query row q against key row k + j D, for the W key rows from k.
inline Isa::V decode_scores(const float* q, const float* k, int D) {
  Isa::V acc[kDecodeW];
  for (int j = 0; j < kDecodeW; ++j) acc[j] = Isa::zero();
  for (int d = 0; d < D; d += kDecodeW) {
    const Isa::V qv = Isa::load(q + d);
    for (int j = 0; j < kDecodeW; ++j) acc[j] = Isa::fmadd(qv, Isa::load(k + j * D + d), acc[j]);
  }
  return Isa::sum_lanes(acc);
}

// The same from bf16 pairs on the bf16 dot product (exact products, fp32 sums), unscaled.
inline Isa::V decode_scores_pairs(const uint32_t* q, const bf16_bits* k, int D) {
  Isa::V acc[kDecodeW];
  for (int j = 0; j < kDecodeW; ++j) acc[j] = Isa::zero();
#if defined(RINGATTN_BF16_DOT)
  const auto* kp = reinterpret_cast<const uint32_t*>(k);
  for (int c = 0; c < D / 2; c += kDecodeW) {
    const Isa::Pairs qv = Isa::load_pairs(q + c);
    for (int j = 0; j < kDecodeW; ++j) acc[j] = Isa::dot_pairs(acc[j], qv, Isa::load_pairs(kp + j * (D / 2) + c));
  }
#else
  (void)q, (void)k, (void)D;
#endif
  return Isa::sum_lanes(acc);
}

template <bool BF16>
inline Isa::V decode_load_v(const void* v, int64_t at) {
  if constexpr (BF16) return Isa::load_bf16(static_cast<const bf16_bits*>(v) + at);
  else return Isa::load(static_cast<const float*>(v) + at);
}

// For RR rows (p[i * ps + j]: row i's probability of key j) and DV vectors of the head dim from
// d0: the block's sum_j p[i][j] V[j] from zero, added to acc[i]. Each V vector is loaded (and
// widened) once for the RR rows.
template <int RR, int DV, bool BF16>
inline void decode_accumulate(float* acc, int D, int d0, const float* p, int64_t ps, const void* vb) {
  Isa::V a[RR][DV];
  for (int i = 0; i < RR; ++i)
    for (int c = 0; c < DV; ++c) a[i][c] = Isa::zero();
  for (int j = 0; j < kDecodeKB; ++j) {
    Isa::V pb[RR];
    for (int i = 0; i < RR; ++i) pb[i] = Isa::set1(p[i * ps + j]);
    for (int c = 0; c < DV; ++c) {
      const Isa::V vv = decode_load_v<BF16>(vb, int64_t(j) * D + d0 + c * kDecodeW);
      for (int i = 0; i < RR; ++i) a[i][c] = Isa::fmadd(pb[i], vv, a[i][c]);
    }
  }
  for (int i = 0; i < RR; ++i)
    for (int c = 0; c < DV; ++c) {
      float* out = acc + i * D + d0 + c * kDecodeW;
      Isa::store(out, Isa::add(Isa::load(out), a[i][c]));
    }
}

// Rows per register group of O += P V, and head-dim vectors per pass (RR x DV accumulators).
constexpr int kDecodeRows = 4;
constexpr int kDecodeVecs = kDecodeW == 8 ? 2 : 4;

template <int RR, bool BF16>
inline void decode_accumulate_rows(float* acc, int D, const float* p, int64_t ps, const void* vb) {
  const int vecs = D / kDecodeW;
  int c = 0;
  for (; c + kDecodeVecs <= vecs; c += kDecodeVecs)
    decode_accumulate<RR, kDecodeVecs, BF16>(acc, D, c * kDecodeW, p, ps, vb);
  for (; c < vecs; ++c) decode_accumulate<RR, 1, BF16>(acc, D, c * kDecodeW, p, ps, vb);
}

template <bool BF16>
void decode_accumulate_all(float* acc, int D, int nq, const float* p, int64_t ps, const void* vb) {
  int r = 0;
  for (; r + kDecodeRows <= nq; r += kDecodeRows)
    decode_accumulate_rows<kDecodeRows, BF16>(acc + r * D, D, p + r * ps, ps, vb);
  switch (nq - r) {
    case 3: decode_accumulate_rows<3, BF16>(acc + r * D, D, p + r * ps, ps, vb); break;
    case 2: decode_accumulate_rows<2, BF16>(acc + r * D, D, p + r * ps, ps, vb); break;
    case 1: decode_accumulate_rows<1, BF16>(acc + r * D, D, p + r * ps, ps, vb); break;
    default: break;
  }
}

void decode_block(const DecodeBlockArgs& a) {
  const int D = a.head_dim, nq = a.nq;
  const int64_t rows = a.rows;
  const size_t eb = a.bf16 ? 2 : 4, block_bytes = size_t(kDecodeKB) * size_t(D) * eb;
  const int64_t padded = (rows + kDecodeKB - 1) / kDecodeKB * kDecodeKB;
  float* kf = a.scratch;                 // [KB][D] K of the block widened (bf16 on the FMA path)
  float* kpad = kf + kDecodeKB * D;      // K and V of a last, partial block, zero-padded
  float* vpad = kpad + kDecodeKB * D;
  float* s = vpad + kDecodeKB * D;       // [nq][padded] scores, then probabilities
  const bool pairs = a.q_pairs != nullptr;
  int64_t q_min = a.q_pos[0], q_max = a.q_pos[0];
  for (int r = 1; r < nq; ++r) {
    q_min = a.q_pos[r] < q_min ? a.q_pos[r] : q_min;
    q_max = a.q_pos[r] > q_max ? a.q_pos[r] : q_max;
  }
  auto block_of = [&](const void* base, float* pad, int64_t j0) {
    const char* b = static_cast<const char*>(base) + size_t(j0) * size_t(D) * eb;
    const int n = rows - j0 < kDecodeKB ? static_cast<int>(rows - j0) : kDecodeKB;
    if (n == kDecodeKB) return b;
    std::memset(pad, 0, block_bytes);  // the tail: padded keys score -inf and their V rows are 0
    std::memcpy(pad, b, size_t(n) * size_t(D) * eb);
    return reinterpret_cast<const char*>(pad);
  };

  // Pass 1 streams K: every row's scores against the run, each block of K reused from L1 by the rows.
  const Isa::V scale = Isa::set1(a.score_scale);
  for (int64_t j0 = 0; j0 < rows; j0 += kDecodeKB) {
    const char* kb = block_of(a.k, kpad, j0);
    const float* kr = reinterpret_cast<const float*>(kb);
    if (a.bf16 && !pairs) {
      const auto* k16 = reinterpret_cast<const bf16_bits*>(kb);
      for (int e = 0; e < kDecodeKB * D; e += kDecodeW) Isa::store(kf + e, Isa::load_bf16(k16 + e));
      kr = kf;
    }
    const int n = rows - j0 < kDecodeKB ? static_cast<int>(rows - j0) : kDecodeKB;
    const int64_t* kp = a.k_pos + j0;
    // Every key of the block visible to every row: no element mask.
    const bool full = n == kDecodeKB && kp[n - 1] <= q_min && (a.window_left < 0 || kp[0] >= q_max - a.window_left);
    for (int r = 0; r < nq; ++r) {
      float* sr = s + r * padded + j0;
      for (int g = 0; g < kDecodeSV; ++g)
        Isa::store(sr + g * kDecodeW,
                   pairs ? Isa::mul(decode_scores_pairs(a.q_pairs + r * (D / 2),
                                                        reinterpret_cast<const bf16_bits*>(kb) + g * kDecodeW * D, D),
                                    scale)
                         : decode_scores(a.q + r * D, kr + g * kDecodeW * D, D));
      if (!full) {
        const int64_t qi = a.q_pos[r];
        for (int j = 0; j < kDecodeKB; ++j)
          if (j >= n || kp[j] > qi || (a.window_left >= 0 && kp[j] < qi - a.window_left)) sr[j] = -__builtin_inff();
      }
    }
  }

  // The softmax of each row over the whole run: its max known, no rescaling later.
  for (int r = 0; r < nq; ++r) {
    float* sr = s + r * padded;
    Isa::V top = Isa::set1(kDecodeNoKey);
    for (int64_t j = 0; j < padded; j += kDecodeW) top = Isa::max(top, Isa::load(sr + j));
    const float m = Isa::reduce_max(top);  // a row that sees no key: kDecodeNoKey, and p = 0
    const Isa::V mv = Isa::set1(m);
    Isa::V sum = Isa::zero();
    for (int64_t j0 = 0; j0 < padded; j0 += kDecodeKB) {
      Isa::V block = Isa::zero();  // each block's sum from zero, then added (docs/kernels.md "Long sums")
      for (int g = 0; g < kDecodeSV; ++g) {
        const Isa::V pv = Isa::exp2(Isa::sub(Isa::load(sr + j0 + g * kDecodeW), mv));
        Isa::store(sr + j0 + g * kDecodeW, pv);
        block = Isa::add(block, pv);
      }
      sum = Isa::add(sum, block);
    }
    a.m[r] = m;
    a.l[r] = Isa::reduce_add(sum);
    for (int d = 0; d < D; d += kDecodeW) Isa::store(a.acc + r * D + d, Isa::zero());
  }

  // Pass 2 streams V: O += P V block by block, each V vector loaded once for a group of rows.
  for (int64_t j0 = 0; j0 < rows; j0 += kDecodeKB) {
    const char* vb = block_of(a.v, vpad, j0);
    if (a.bf16)
      decode_accumulate_all<true>(a.acc, D, nq, s + j0, padded, vb);
    else
      decode_accumulate_all<false>(a.acc, D, nq, s + j0, padded, vb);
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
  float total = Isa::reduce_add(Isa::add(Isa::add(a0, a1), Isa::add(a2, a3)));
  for (; i < n; ++i) total += p[i];
  return total;
}

}  // namespace
