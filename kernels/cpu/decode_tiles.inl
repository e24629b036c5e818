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

// acc[r][d..d+W) += sum_j p[r][j] V[j][d..d+W) for RR consecutive rows.
template <int RR>
inline void decode_accumulate(float* acc, int D, int d, const float* p, const float* const* vrow, int n) {
  Isa::V a[RR];
  for (int i = 0; i < RR; ++i) a[i] = Isa::load(acc + i * D + d);
  for (int j = 0; j < n; ++j) {
    const Isa::V vv = Isa::load(vrow[j] + d);
    for (int i = 0; i < RR; ++i) a[i] = Isa::fmadd(Isa::set1(p[i * kDecodeKB + j]), vv, a[i]);
  }
  for (int i = 0; i < RR; ++i) Isa::store(acc + i * D + d, a[i]);
}

void decode_block(const DecodeBlockArgs& a) {
  const int D = a.head_dim, nq = a.nq;
  float* kf = a.scratch;           // [KB][D] widened K of the block (bf16 inputs)
  float* vf = kf + kDecodeKB * D;  // [KB][D]
  float* zero_row = vf + kDecodeKB * D;
  float* s = zero_row + D;  // [nq][KB]: scores, then probabilities
  for (int d = 0; d < D; ++d) zero_row[d] = 0.0f;
  int64_t q_min = a.q_pos[0], q_max = a.q_pos[0];
  for (int r = 1; r < nq; ++r) {
    q_min = a.q_pos[r] < q_min ? a.q_pos[r] : q_min;
    q_max = a.q_pos[r] > q_max ? a.q_pos[r] : q_max;
  }
  const float* krow[kDecodeKB];
  const float* vrow[kDecodeKB];
  for (int64_t j0 = 0; j0 < a.rows; j0 += kDecodeKB) {
    const int n = a.rows - j0 < kDecodeKB ? static_cast<int>(a.rows - j0) : kDecodeKB;
    if (a.bf16) {
      const auto* k16 = static_cast<const bf16_bits*>(a.k) + j0 * D;
      const auto* v16 = static_cast<const bf16_bits*>(a.v) + j0 * D;
      for (int j = 0; j < n; ++j) {
        for (int d = 0; d < D; d += kDecodeW) {
          Isa::store(kf + j * D + d, Isa::load_bf16(k16 + j * D + d));
          Isa::store(vf + j * D + d, Isa::load_bf16(v16 + j * D + d));
        }
        krow[j] = kf + j * D, vrow[j] = vf + j * D;
      }
    } else {
      for (int j = 0; j < n; ++j) {
        krow[j] = static_cast<const float*>(a.k) + (j0 + j) * D;
        vrow[j] = static_cast<const float*>(a.v) + (j0 + j) * D;
      }
    }
    for (int j = n; j < kDecodeKB; ++j) krow[j] = vrow[j] = zero_row;
    const int64_t* kp = a.k_pos + j0;
    // Every key of the block visible to every row: no element mask.
    const bool full = n == kDecodeKB && kp[n - 1] <= q_min && (a.window_left < 0 || kp[0] >= q_max - a.window_left);
    for (int r = 0; r < nq; ++r) {
      float* sr = s + r * kDecodeKB;
      for (int j = 0; j < kDecodeKB; j += kDecodeW) Isa::store(sr + j, decode_scores(a.q + r * D, krow + j, D));
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
      for (int j = 0; j < kDecodeKB; j += kDecodeW) Isa::store(sr + j, Isa::exp2(Isa::sub(Isa::load(sr + j), mv)));
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) sum += sr[j];
      a.l[r] += sum;
    }
    for (int d = 0; d < D; d += kDecodeW) {
      int r = 0;
      for (; r + 4 <= nq; r += 4) decode_accumulate<4>(a.acc + r * D, D, d, s + r * kDecodeKB, vrow, n);
      switch (nq - r) {
        case 3: decode_accumulate<3>(a.acc + r * D, D, d, s + r * kDecodeKB, vrow, n); break;
        case 2: decode_accumulate<2>(a.acc + r * D, D, d, s + r * kDecodeKB, vrow, n); break;
        case 1: decode_accumulate<1>(a.acc + r * D, D, d, s + r * kDecodeKB, vrow, n); break;
        default: break;
      }
    }
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
