// The arithmetic of the decode kernel (kernels/cpu/decode_cpu.hpp) over the vector operations of
// `Isa`, included by each ISA translation unit inside its own namespace, before
// attention_tiles.inl (whose tile_kernels() lists these functions).
//
// Decode is memory-bound: each cached K/V row is read once per step and meets only the few query
// rows of its head's group (H / Hkv heads times the new tokens). One call takes a run of at most
// kDecodeChunkRows of one head's rows in two streaming passes, the rows' scores kept in L2 between:
// - pass 1 streams K in blocks of kDecodeKeyBlock: the scores of 4 rows x 4 keys at a time, each
//   K vector loaded once for the 4 rows and each Q vector once for the 4 keys (the loads had been
//   the bound: 2.0x faster on Zen 4, bf16); per W keys the accumulators are reduced together by
//   sum_lanes into one vector of scores per row (lane j: key j);
// - the softmax of each row over the whole run, on whole vectors: its max is known before any
//   exp2, so nothing is rescaled (no per-block max, no running-max bookkeeping);
// - pass 2 streams V: O += P V with the rows' accumulators in registers, each V vector loaded
//   (and widened; bf16 split into even and odd elements, no shuffle) once per group of rows, each
//   block's products summed from zero and then added to the running sum (docs/kernels.md "Long
//   sums").
// One stream at a time, read in address order, each load prefetching the line kDecodeAhead blocks
// on (see decode_prefetch).

namespace {

constexpr int kDecodeW = Isa::W;
constexpr int kDecodeKB = kDecodeKeyBlock;
constexpr int kDecodeSV = kDecodeKB / kDecodeW;  // score vectors per row and block
// Blocks between a load and the line it prefetches: 1, 2 and 4 read alike into L2 (Zen 4, 256K
// cached tokens, same-run ratios to the read probe; docs/inference.md); 6 was slower into L1.
constexpr int kDecodeAhead = 2;
static_assert(kDecodeKB % kDecodeW == 0, "a key block is whole vectors of scores");
// The max of a row that sees no key: finite, so that s - max is never -inf - -inf (and p = 0).
constexpr float kDecodeNoKey = -3.402823466e38f;

// The hardware prefetcher alone runs too little ahead of a stream read with this much arithmetic
// per line (measured: 12-13 GB/s from DRAM, where a bare read loop gets 34): each vector load of
// both passes also prefetches the line kDecodeAhead blocks on (prefetches never fault, so none is
// needed past the run's end). ahead = 0: the loads read a copy, not the stream (nothing to fetch).
// Into L2 (T1), not L1 (T0): on one Zen 4 VM, T0 prefetches made the stream slower than none at
// all (1 thread, 256K tokens: kernel/probe bf16 31-36% with T0, 34-63% with none, 67-78% with T1 or
// T2; fp32 31-32%, 35-37%, 56-71%), while on another T0 had been the faster; T1 there is untried.
inline void decode_prefetch(const void* p, std::ptrdiff_t ahead) {
#if defined(RINGATTN_ISA_AVX512) || defined(RINGATTN_ISA_AVX2)
  if (ahead != 0) _mm_prefetch(static_cast<const char*>(p) + ahead, _MM_HINT_T1);
#else
  (void)p, (void)ahead;
#endif
}

// Keys per step of the score micro-kernel: RR query rows x kDecodeKK keys of accumulators.
constexpr int kDecodeKK = kDecodeW >= 4 ? 4 : kDecodeW;

// acc[r][j] = query row r . key row j over the head dim, for RR rows (q_stride elements apart)
// and kDecodeKK keys (D apart): each K vector is loaded once for the RR rows and each Q vector
// once for the keys, so the loads per product fall from one K and one Q each to (RR + KK) / (RR KK).
// PAIRS: bf16 Q and K as pairs on the bf16 dot product (exact products, fp32 sums), unscaled.
template <int RR, bool PAIRS>
inline void decode_score_tile(const void* q, int64_t q_stride, const void* k, int D, std::ptrdiff_t ahead,
                              Isa::V (&acc)[RR][kDecodeKK]) {
  for (int r = 0; r < RR; ++r)
    for (int j = 0; j < kDecodeKK; ++j) acc[r][j] = Isa::zero();
  if constexpr (PAIRS) {
#if defined(RINGATTN_BF16_DOT)
    const auto* qp = static_cast<const uint32_t*>(q);
    const auto* kp = static_cast<const uint32_t*>(k);
    const int n = D / 2;
    for (int c = 0; c < n; c += kDecodeW) {
      Isa::Pairs kv[kDecodeKK];
      for (int j = 0; j < kDecodeKK; ++j) decode_prefetch(kp + j * n + c, ahead), kv[j] = Isa::load_pairs(kp + j * n + c);
      for (int r = 0; r < RR; ++r) {
        const Isa::Pairs qv = Isa::load_pairs(qp + r * q_stride + c);
        for (int j = 0; j < kDecodeKK; ++j) acc[r][j] = Isa::dot_pairs(acc[r][j], qv, kv[j]);
      }
    }
#else
    (void)q, (void)q_stride, (void)k, (void)D, (void)ahead;
#endif
  } else {
    const auto* qf = static_cast<const float*>(q);
    const auto* kf = static_cast<const float*>(k);
    for (int d = 0; d < D; d += kDecodeW) {
      Isa::V kv[kDecodeKK];
      for (int j = 0; j < kDecodeKK; ++j) decode_prefetch(kf + j * D + d, ahead), kv[j] = Isa::load(kf + j * D + d);
      for (int r = 0; r < RR; ++r) {
        const Isa::V qv = Isa::load(qf + r * q_stride + d);
        for (int j = 0; j < kDecodeKK; ++j) acc[r][j] = Isa::fmadd(qv, kv[j], acc[r][j]);
      }
    }
  }
}

// The scores of RR rows against one key block, s[r * ps + j] (j < kDecodeKB): per W keys, the
// tiles' accumulators are reduced together by sum_lanes into one vector per row (lane j: key j).
template <int RR, bool PAIRS>
inline void decode_scores_rows(const void* q, int64_t q_stride, const void* k, int D, Isa::V scale, float* s,
                               int64_t ps, std::ptrdiff_t ahead) {
  const size_t key_bytes = size_t(D) * (PAIRS ? sizeof(bf16_bits) : sizeof(float));
  for (int g = 0; g < kDecodeSV; ++g) {
    Isa::V lanes[RR][kDecodeW];
    for (int k0 = 0; k0 < kDecodeW; k0 += kDecodeKK) {
      Isa::V acc[RR][kDecodeKK];
      decode_score_tile<RR, PAIRS>(q, q_stride, static_cast<const char*>(k) + size_t(g * kDecodeW + k0) * key_bytes, D,
                                   ahead, acc);
      for (int r = 0; r < RR; ++r)
        for (int j = 0; j < kDecodeKK; ++j) lanes[r][k0 + j] = acc[r][j];
    }
    for (int r = 0; r < RR; ++r) {
      const Isa::V sc = Isa::sum_lanes(lanes[r]);
      Isa::store(s + r * ps + g * kDecodeW, PAIRS ? Isa::mul(sc, scale) : sc);
    }
  }
}

// Every row's scores against one key block, in groups of 4 rows.
template <bool PAIRS>
void decode_scores_all(const void* q, int64_t q_stride, const void* k, int D, int nq, Isa::V scale, float* s,
                       int64_t ps, std::ptrdiff_t ahead) {
  const size_t row_bytes = size_t(q_stride) * (PAIRS ? sizeof(uint32_t) : sizeof(float));
  auto at = [&](int r) { return static_cast<const char*>(q) + size_t(r) * row_bytes; };
  int r = 0;
  for (; r + 4 <= nq; r += 4) decode_scores_rows<4, PAIRS>(at(r), q_stride, k, D, scale, s + r * ps, ps, ahead);
  switch (nq - r) {
    case 3: decode_scores_rows<3, PAIRS>(at(r), q_stride, k, D, scale, s + r * ps, ps, ahead); break;
    case 2: decode_scores_rows<2, PAIRS>(at(r), q_stride, k, D, scale, s + r * ps, ps, ahead); break;
    case 1: decode_scores_rows<1, PAIRS>(at(r), q_stride, k, D, scale, s + r * ps, ps, ahead); break;
    default: break;
  }
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
inline void decode_accumulate(float* acc, int D, int d0, const float* p, int64_t ps, const void* vb, std::ptrdiff_t ahead) {
  Isa::V a[RR][DV];
  for (int i = 0; i < RR; ++i)
    for (int c = 0; c < DV; ++c) a[i][c] = Isa::zero();
  for (int j = 0; j < kDecodeKB; ++j) {
    Isa::V pb[RR];
    for (int i = 0; i < RR; ++i) pb[i] = Isa::set1(p[i * ps + j]);
    for (int c = 0; c < DV; ++c) {
      if (!BF16 || c % 2 == 0) decode_prefetch(static_cast<const char*>(vb) + (int64_t(j) * D + d0 + c * kDecodeW) * (BF16 ? 2 : 4), ahead);
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

// The same for bf16 V in NP loads of 2W values per key: each load split into its even and odd
// elements by a shift and a mask (Isa::load_bf16_split), where widening W values takes a
// cross-lane shuffle; the block's sums are put back in element order once, at the store. The
// products and their order are the same as decode_accumulate's, so are the results.
template <int RR, int NP>
inline void decode_accumulate_split(float* acc, int D, int d0, const float* p, int64_t ps, const bf16_bits* vb,
                                    std::ptrdiff_t ahead) {
  Isa::V a[RR][2 * NP];
  for (int i = 0; i < RR; ++i)
    for (int c = 0; c < 2 * NP; ++c) a[i][c] = Isa::zero();
  for (int j = 0; j < kDecodeKB; ++j) {
    Isa::V pb[RR];
    for (int i = 0; i < RR; ++i) pb[i] = Isa::set1(p[i * ps + j]);
    for (int c = 0; c < NP; ++c) {
      decode_prefetch(vb + int64_t(j) * D + d0 + c * 2 * kDecodeW, ahead);
      Isa::V even, odd;
      Isa::load_bf16_split(vb + int64_t(j) * D + d0 + c * 2 * kDecodeW, even, odd);
      for (int i = 0; i < RR; ++i) {
        a[i][2 * c] = Isa::fmadd(pb[i], even, a[i][2 * c]);
        a[i][2 * c + 1] = Isa::fmadd(pb[i], odd, a[i][2 * c + 1]);
      }
    }
  }
  for (int i = 0; i < RR; ++i)
    for (int c = 0; c < NP; ++c) {
      Isa::V lo, hi;
      Isa::interleave(a[i][2 * c], a[i][2 * c + 1], lo, hi);
      float* out = acc + i * D + d0 + c * 2 * kDecodeW;
      Isa::store(out, Isa::add(Isa::load(out), lo));
      Isa::store(out + kDecodeW, Isa::add(Isa::load(out + kDecodeW), hi));
    }
}

// Rows per register group of O += P V, and head-dim vectors per pass (RR x DV accumulators).
constexpr int kDecodeRows = 4;
constexpr int kDecodeVecs = kDecodeW == 8 ? 2 : 4;

template <int RR, bool BF16>
inline void decode_accumulate_rows(float* acc, int D, const float* p, int64_t ps, const void* vb, std::ptrdiff_t ahead) {
  const int vecs = D / kDecodeW;
  int c = 0;
  if constexpr (BF16 && kDecodeW >= 8) {
    if (D % (2 * kDecodeW) == 0) {
      const auto* v16 = static_cast<const bf16_bits*>(vb);
      for (; c + kDecodeVecs <= vecs; c += kDecodeVecs)
        decode_accumulate_split<RR, kDecodeVecs / 2>(acc, D, c * kDecodeW, p, ps, v16, ahead);
      for (; c < vecs; c += 2) decode_accumulate_split<RR, 1>(acc, D, c * kDecodeW, p, ps, v16, ahead);
      return;
    }
  }
  for (; c + kDecodeVecs <= vecs; c += kDecodeVecs)
    decode_accumulate<RR, kDecodeVecs, BF16>(acc, D, c * kDecodeW, p, ps, vb, ahead);
  for (; c < vecs; ++c) decode_accumulate<RR, 1, BF16>(acc, D, c * kDecodeW, p, ps, vb, ahead);
}

template <bool BF16>
void decode_accumulate_all(float* acc, int D, int nq, const float* p, int64_t ps, const void* vb, std::ptrdiff_t ahead) {
  int r = 0;
  for (; r + kDecodeRows <= nq; r += kDecodeRows)
    decode_accumulate_rows<kDecodeRows, BF16>(acc + r * D, D, p + r * ps, ps, vb, ahead);
  switch (nq - r) {
    case 3: decode_accumulate_rows<3, BF16>(acc + r * D, D, p + r * ps, ps, vb, ahead); break;
    case 2: decode_accumulate_rows<2, BF16>(acc + r * D, D, p + r * ps, ps, vb, ahead); break;
    case 1: decode_accumulate_rows<1, BF16>(acc + r * D, D, p + r * ps, ps, vb, ahead); break;
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

  // Prefetch distance: kDecodeAhead blocks (a tail block in pad memory prefetches nothing useful).
  const std::ptrdiff_t ahead = std::ptrdiff_t(kDecodeAhead) * std::ptrdiff_t(block_bytes);

  // Pass 1 streams K: every row's scores against the run, each block of K reused from L1 by the rows.
  const Isa::V scale = Isa::set1(a.score_scale);
  for (int64_t j0 = 0; j0 < rows; j0 += kDecodeKB) {
    const char* kb = block_of(a.k, kpad, j0);
    const float* kr = reinterpret_cast<const float*>(kb);
    if (a.bf16 && !pairs) {
      const auto* k16 = reinterpret_cast<const bf16_bits*>(kb);
      for (int e = 0; e < kDecodeKB * D; e += kDecodeW)
        decode_prefetch(k16 + e, ahead), Isa::store(kf + e, Isa::load_bf16(k16 + e));
      kr = kf;
    }
    const int n = rows - j0 < kDecodeKB ? static_cast<int>(rows - j0) : kDecodeKB;
    const int64_t* kp = a.k_pos + j0;
    // Every key of the block visible to every row: no element mask.
    const bool full = n == kDecodeKB && kp[n - 1] <= q_min && (a.window_left < 0 || kp[0] >= q_max - a.window_left);
    if (pairs)
      decode_scores_all<true>(a.q_pairs, D / 2, kb, D, nq, scale, s + j0, padded, ahead);
    else
      decode_scores_all<false>(a.q, D, kr, D, nq, scale, s + j0, padded, kr == kf ? 0 : ahead);
    if (!full)
      for (int r = 0; r < nq; ++r) {
        float* sr = s + r * padded + j0;
        const int64_t qi = a.q_pos[r];
        for (int j = 0; j < kDecodeKB; ++j)
          if (j >= n || kp[j] > qi || (a.window_left >= 0 && kp[j] < qi - a.window_left)) sr[j] = -__builtin_inff();
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
      decode_accumulate_all<true>(a.acc, D, nq, s + j0, padded, vb, ahead);
    else
      decode_accumulate_all<false>(a.acc, D, nq, s + j0, padded, vb, ahead);
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
