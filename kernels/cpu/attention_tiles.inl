// The arithmetic of one query tile (forward) and one key block (backward), written once over
// the vector operations of `Isa` and included by each ISA translation unit inside its own
// namespace (see simd.hpp). No standard-library templates with code are used here, so nothing
// compiled with wide-vector flags can leak into a generic caller.
//
// FlashAttention-2 on the CPU, with one twist: vectors run over queries instead of over the
// head dimension. Scores of a key block come out transposed, ST[j][i], so the online-softmax
// statistics (running max m, running sum l, rescale alpha) of a query tile are elementwise
// vector operations. The same register-tiled micro-kernel ("broadcast a row element, FMA
// against Br query lanes") serves S = Q K^T, dP = dO V^T, O += P V and dQ += dS K; the dK/dV
// updates run over the head dimension instead, as in an ordinary sgemm.

namespace {

using V = Isa::V;
constexpr int W = Isa::W;
constexpr int NV = Isa::kQueryVecs;
constexpr int BR = W * NV;            // query tile rows (lanes)
constexpr int BC = Isa::kKeyBlock;    // key block rows (forward)
constexpr int BCB = Isa::kBackwardKeyBlock;  // key block rows of a backward item
constexpr int R = Isa::kRows;         // broadcast rows per micro-kernel step
constexpr int GV = Isa::kGradVecs;    // head-dim vectors per dK/dV micro-kernel step
constexpr double kLn2d = 0.693147180559945309;
constexpr double kLog2ed = 1.44269504088896340736;
constexpr float kNegInf = -__builtin_inff();
// The running max of a lane that has seen no key: finite, so that 2^(s - m) of a masked (-inf)
// score is 0 and never 2^(-inf - -inf) = NaN, on every path and in every rescale.
constexpr float kNoKeyMax = -3.402823466e38f;

template <int N>
struct Rows { static constexpr int value = N; };

// Calls fn(Rows<RR>, j) for consecutive groups of rows covering [0, n): groups of R, then one tail.
template <class Fn>
inline void for_row_groups(int n, Fn&& fn) {
  int j = 0;
  for (; j + R <= n; j += R) fn(Rows<R>{}, j);
  switch (n - j) {
    case 5: fn(Rows<5>{}, j); break;
    case 4: fn(Rows<4>{}, j); break;
    case 3: fn(Rows<3>{}, j); break;
    case 2: fn(Rows<2>{}, j); break;
    case 1: fn(Rows<1>{}, j); break;
    default: break;
  }
}

// acc[r][:] = sum_d X[r][d] * Yt[d][:] for the RR rows of X starting at x (row stride xs).
template <int RR>
inline void row_products(const float* yt, int D, const float* x, int64_t xs, V (&acc)[RR][NV]) {
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = Isa::zero();
  const float* xr[RR];
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r) xr[r] = x + r * xs;
  for (int d = 0; d < D; ++d) {
    V y[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) y[v] = Isa::load(yt + d * BR + v * W);
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) {
      V b = Isa::set1(xr[r][d]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = Isa::fmadd(b, y[v], acc[r][v]);
    }
  }
}

// ST[j][:] for the n rows of X (scores S^T = K Qt, or dP^T = V dOt), passed through an
// elementwise epilogue fn(j, v, vector v of row j) while they are still in registers: a separate
// pass over the block would load, store and wait on every vector once more.
template <class Fn>
inline void scores(const float* yt, int D, const float* x, int64_t xs, int n, float* st, Fn&& fn) {
  for_row_groups(n, [&](auto rows, int j) {
    constexpr int RR = decltype(rows)::value;
    V acc[RR][NV];
    row_products<RR>(yt, D, x + j * xs, xs, acc);
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) Isa::store(st + (j + r) * BR + v * W, fn(j + r, v, acc[r][v]));
  });
}

inline void scores(const float* yt, int D, const float* x, int64_t xs, int n, float* st) {
  scores(yt, D, x, xs, n, st, [](int, int, V s) { return s; });
}

// The online softmax of a key block without an element mask, folded into the score product:
// each group of key rows is exponentiated while its scores are still in registers, which saves
// the separate pass over the block's scores (a load, store and dependent sum per vector: 5% of
// a D = 64 forward call). The price is that the block's maximum is not known in advance, so the
// running max m moves lazily, as FlashAttention-4 does: only when a group's scores exceed it by
// more than kMaxSlack (log2 units). Until then p = 2^(s - m) <= 2^kMaxSlack, which fp32 holds
// as exactly as p <= 1, and O and l share the reference point m, so the result is the same
// softmax. A move rescales l, the block's partial sum, the p rows already stored and O's
// pending factor; after the first group of a tile moves are rare.
constexpr float kMaxSlack = 8.0f;

struct OnlineSoftmax {
  V m[NV];       // running max (log2 units; kNoKeyMax before any key)
  V l[NV];       // running sum of p against m
  V lsum[NV];    // this block's sum of p
  V alpha[NV];   // rescale the running O owes for the moves of m within this block
  bool moved;    // m moved within this block (else O needs no rescale)

  void start_block() {
    for (int v = 0; v < NV; ++v) {
      lsum[v] = Isa::zero();
      alpha[v] = Isa::set1(1.0f);
    }
    moved = false;
  }
  // m <- max(m, gmax) for every lane; the `rows` p rows of the block already stored at st
  // follow, as do l, lsum and O's factor.
  __attribute__((noinline)) void move_max(const V* gmax, float* st, int rows) {
    V a[NV];
    for (int v = 0; v < NV; ++v) {
      const V mnew = Isa::max(m[v], gmax[v]);
      a[v] = Isa::exp2(Isa::sub(m[v], mnew));  // 0 from kNoKeyMax
      m[v] = mnew;
      l[v] = Isa::mul(l[v], a[v]);
      lsum[v] = Isa::mul(lsum[v], a[v]);
      alpha[v] = Isa::mul(alpha[v], a[v]);
    }
    for (int j = 0; j < rows; ++j)
      for (int v = 0; v < NV; ++v) Isa::store(st + j * BR + v * W, Isa::mul(Isa::load(st + j * BR + v * W), a[v]));
    moved = true;
  }
};

// PT[j][:] = 2^(S^T[j][:] - m) for the n key rows of X, m moved as needed (see OnlineSoftmax).
inline void softmax_scores(const float* yt, int D, const float* x, int64_t xs, int n, float* st, OnlineSoftmax& sm) {
  const V slack = Isa::set1(kMaxSlack);
  for_row_groups(n, [&](auto rows, int j) {
    constexpr int RR = decltype(rows)::value;
    V acc[RR][NV];
    row_products<RR>(yt, D, x + j * xs, xs, acc);
    V gmax[NV];
    bool move = false;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      gmax[v] = acc[0][v];
#pragma GCC unroll 8
      for (int r = 1; r < RR; ++r) gmax[v] = Isa::max(gmax[v], acc[r][v]);
      move |= Isa::any_greater(gmax[v], Isa::add(sm.m[v], slack));
    }
    if (move) sm.move_max(gmax, st, j);
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const V p = Isa::exp2(Isa::sub(acc[r][v], sm.m[v]));
        Isa::store(st + (j + r) * BR + v * W, p);
        sm.lsum[v] = Isa::add(sm.lsum[v], p);
      }
  });
}

// The same from bf16 inputs with the bf16 dot product: Yt as bf16 pairs [D/2][BR], X rows as
// bf16; each instruction takes two head-dim indices. Scores come out multiplied by `scale`.
// (I = Isa, as a parameter so that ISAs without the instruction never instantiate the body.)
template <int RR, class I = Isa>
inline void rows_times_lanes_bf16(const uint32_t* yt, int D, const bf16_bits* x, int64_t xs, float scale,
                                  float* st) {
  if constexpr (I::kHasBf16Dot) {
    V acc[RR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = Isa::zero();
    const bf16_bits* xr[RR];
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) xr[r] = x + r * xs;
    for (int p = 0; p < D / 2; ++p) {
      typename I::Pairs y[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) y[v] = I::load_pairs(yt + p * BR + v * W);
#pragma GCC unroll 8
      for (int r = 0; r < RR; ++r) {
        uint32_t pair;
        __builtin_memcpy(&pair, xr[r] + 2 * p, sizeof pair);  // x[2p] low half, x[2p+1] high half
        const typename I::Pairs b = I::set1_pair(pair);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = I::dot_pairs(acc[r][v], y[v], b);
      }
    }
    const V s = Isa::set1(scale);
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) Isa::store(st + r * BR + v * W, Isa::mul(acc[r][v], s));
  } else {
    (void)yt, (void)D, (void)x, (void)xs, (void)scale, (void)st;
  }
}

inline void scores_bf16(const uint32_t* yt, int D, const bf16_bits* x, int64_t xs, int n, float scale, float* st) {
  for_row_groups(n, [&](auto rows, int j) {
    rows_times_lanes_bf16<decltype(rows)::value>(yt, D, x + j * xs, xs, scale, st + j * BR);
  });
}

// Ot[d][:] = alpha * Ot[d][:] + sum_j X[j][d] * PT[j][:] for the RR head-dim rows starting at d0,
// X[j][d] at x[j * xs + d * xd]. X is V (forward: O += P V) or K (backward: dQ += dS K), read as
// V^T or K^T blocks [D][BC] (xs = 1, xd = BC) so that each head dim's keys are contiguous.
// The block's sum is formed from zero and then added, as a GEMM adds one panel of its inner
// dimension at a time: continued from Ot, each key's term would be rounded against the sum of
// every earlier block (a chain as long as the sequence; see grad_rows).
template <int RR, bool kRescale>
inline void lanes_times_rows(float* ot, int d0, const float* pt, int n, const float* x, int64_t xs, int64_t xd,
                             const V* alpha) {
  V acc[RR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = Isa::zero();
  for (int j = 0; j < n; ++j) {
    V p[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) p[v] = Isa::load(pt + j * BR + v * W);
    const float* xj = x + j * xs + d0 * xd;
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) {
      V b = Isa::set1(xj[r * xd]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = Isa::fmadd(b, p[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* o = ot + (d0 + r) * BR + v * W;
      Isa::store(o, kRescale ? Isa::fmadd(Isa::load(o), alpha[v], acc[r][v]) : Isa::add(Isa::load(o), acc[r][v]));
    }
}

template <bool kRescale>
inline void accumulate_lanes(float* ot, int D, const float* pt, int n, const float* x, int64_t xs, int64_t xd,
                             const V* alpha) {
  for_row_groups(D, [&](auto rows, int d0) {
    lanes_times_rows<decltype(rows)::value, kRescale>(ot, d0, pt, n, x, xs, xd, alpha);
  });
}

// out[j][d0 .. d0 + GG*W) += sum_{i < nq} XT[j][i] * Y[i][d0 ..]  for RR rows j (dV += P^T dO, dK += dS^T Q).
// The tile's sum is formed from zero, then added to out (a panel of backward_block's). Continued
// from out, the sum over every query of the sequence (and of a GQA group's heads) was one fp32
// chain, each term rounded against the whole running sum: at L = 4096 causal, dV had 6x the
// error of an fp32 GEMM's panels (docs/kernels.md, "Precision contract").
template <int RR, int GG>
inline void grad_rows(float* out, int64_t os, const float* xt, const float* y, int64_t ys, int nq, int d0) {
  V acc[RR][GG];
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
    for (int g = 0; g < GG; ++g) acc[r][g] = Isa::zero();
  for (int i = 0; i < nq; ++i) {
    V yv[GG];
#pragma GCC unroll 8
    for (int g = 0; g < GG; ++g) yv[g] = Isa::load(y + i * ys + d0 + g * W);
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) {
      V b = Isa::set1(xt[r * BR + i]);
#pragma GCC unroll 8
      for (int g = 0; g < GG; ++g) acc[r][g] = Isa::fmadd(b, yv[g], acc[r][g]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
    for (int g = 0; g < GG; ++g) {
      float* o = out + r * os + d0 + g * W;
      Isa::store(o, Isa::add(Isa::load(o), acc[r][g]));
    }
}

template <int RR>
inline void grad_row_group(float* out, int64_t os, const float* xt, const float* y, int64_t ys, int nq, int D) {
  int d0 = 0;
  for (; d0 + GV * W <= D; d0 += GV * W) grad_rows<RR, GV>(out, os, xt, y, ys, nq, d0);
  // Head dims are multiples of W; the tail is 1..GV-1 vectors.
  switch ((D - d0) / W) {
    case 3: grad_rows<RR, 3>(out, os, xt, y, ys, nq, d0); break;
    case 2: grad_rows<RR, 2>(out, os, xt, y, ys, nq, d0); break;
    case 1: grad_rows<RR, 1>(out, os, xt, y, ys, nq, d0); break;
    default: break;
  }
}

inline void accumulate_grad(float* out, int64_t os, const float* xt, int n, const float* y, int64_t ys, int nq, int D) {
  for_row_groups(n, [&](auto rows, int j) {
    grad_row_group<decltype(rows)::value>(out + j * os, os, xt + j * BR, y, ys, nq, D);
  });
}

// Between a tile's natural rows and its transposed lanes [D][BR], in W x W blocks transposed in
// registers: the element-by-element transposes these replace cost 5-9% of a causal forward call
// (strided stores, one per element), more in ring steps, whose partial states go in and out.

// dst[d][i] = scale * src[i * stride + d] for the lanes `take(i)` selects, 0 in the others;
// `lanes` (a multiple of W) columns per dst row: BR for a query tile, BC for a key block.
template <class Take>
inline void rows_to_lanes(const float* src, int64_t stride, int D, float scale, Take&& take, float* dst,
                          int lanes = BR) {
  const V s = Isa::set1(scale);
  for (int i0 = 0; i0 < lanes; i0 += W) {
    bool row[W];
    for (int k = 0; k < W; ++k) row[k] = take(i0 + k);
    for (int d0 = 0; d0 < D; d0 += W) {
      V r[W];
#pragma GCC unroll 16
      for (int k = 0; k < W; ++k) r[k] = row[k] ? Isa::mul(Isa::load(src + (i0 + k) * stride + d0), s) : Isa::zero();
      Isa::transpose(r);
#pragma GCC unroll 16
      for (int k = 0; k < W; ++k) Isa::store(dst + (d0 + k) * lanes + i0, r[k]);
    }
  }
}

// dst[i * stride + d] = lane_scale[i] * src[d][i] (kAdd: +=) for lanes i < nq; lane_scale null: 1.
template <bool kAdd>
inline void lanes_to_rows(const float* src, int nq, int D, const float* lane_scale, float* dst, int64_t stride) {
  for (int i0 = 0; i0 < nq; i0 += W) {
    const int n = nq - i0 < W ? nq - i0 : W;
    for (int d0 = 0; d0 < D; d0 += W) {
      V r[W];
#pragma GCC unroll 16
      for (int k = 0; k < W; ++k) r[k] = Isa::load(src + (d0 + k) * BR + i0);
      Isa::transpose(r);
      for (int k = 0; k < n; ++k) {
        const V x = lane_scale ? Isa::mul(r[k], Isa::set1(lane_scale[i0 + k])) : r[k];
        float* out = dst + (i0 + k) * stride + d0;
        Isa::store(out, kAdd ? Isa::add(Isa::load(out), x) : x);
      }
    }
  }
}

// Sets ST[j][i] = -inf where key row (row0 + j) is not visible to lane i. Boundary blocks only.
inline void apply_element_mask(float* st, int nk, int64_t row0, int nq, const int64_t* lo, const int64_t* hi,
                               const int64_t* brow, const int64_t* k_pos, const uint8_t* block_mask,
                               int64_t block_count, int64_t mask_block) {
  for (int j = 0; j < nk; ++j) {
    const int64_t pj = k_pos[row0 + j];
    float* s = st + j * BR;
    for (int i = 0; i < nq; ++i) {
      if (pj < lo[i] || pj > hi[i]) s[i] = kNegInf;
    }
    if (block_mask) {
      const int64_t bc = pj / mask_block;
      for (int i = 0; i < nq; ++i) {
        if (!block_mask[brow[i] * block_count + bc]) s[i] = kNegInf;
      }
    }
  }
}

// O, l and m of a query tile over one key block without an element mask: the softmax in the
// score product's registers (softmax_scores), then O += P V. A function of its own, flattened,
// so that its helpers are inlined into it whatever else the translation unit instantiates from
// them: inlined into forward_tile instead, GCC's growth limits left the score product's loops
// out of line once the backward used the same helpers, and the forward ran 5% slower (measured).
__attribute__((noinline, flatten)) void forward_block(const float* qt, int D, const float* k, int64_t kv_stride, int nk,
                                                      const float* vt, float* st, float* ot, OnlineSoftmax& sm) {
  sm.start_block();
  softmax_scores(qt, D, k, kv_stride, nk, st, sm);
  for (int v = 0; v < NV; ++v) sm.l[v] = Isa::add(sm.l[v], sm.lsum[v]);
  if (sm.moved)
    accumulate_lanes<true>(ot, D, st, nk, vt, 1, BC, sm.alpha);
  else
    accumulate_lanes<false>(ot, D, st, nk, vt, 1, BC, nullptr);
}

// A query tile's running state from its incoming partial state (O normalised, with LSE): the
// running max is LSE in log2 units rounded to fp32, m, and the running sum l = 2^(LSE log2(e) - m),
// within 2^-23 of 1, with the running O = O l, transposed into ot [D][BR]; an empty state (LSE =
// -inf) has sum 0. (l = 1 weighed the state by 2^(rounding of m): over a ring of 4 ranks, LSE came
// out 1.9x as inexact as the plain fp32 computation's.) m_lane and l_lane: BR floats each.
inline void begin_forward_tile(const ForwardTileArgs& a, float* ot, float* m_lane, float* l_lane) {
  const int D = a.head_dim;
  const auto has_state = [&](int i) { return i < a.nq && a.lse[i] != kNegInf; };
  for (int i = 0; i < BR; ++i) {
    const double m2 = has_state(i) ? double(a.lse[i]) * kLog2ed : double(kNoKeyMax);
    m_lane[i] = float(m2);
    l_lane[i] = has_state(i) ? float(__builtin_exp2(m2 - double(m_lane[i]))) : 0.0f;
  }
  rows_to_lanes(a.o, a.o_stride, D, 1.0f, has_state, ot);
  for (int v = 0; v < NV; ++v) {
    const V l = Isa::load(l_lane + v * W);
    for (int d = 0; d < D; ++d) Isa::store(ot + d * BR + v * W, Isa::mul(Isa::load(ot + d * BR + v * W), l));
  }
}

// The tile's state back to a.o and a.lse: O = ot / l, LSE = (m + log2 l) ln 2; inv_l: BR floats.
inline void end_forward_tile(const ForwardTileArgs& a, const float* ot, const float* m_lane, const float* l_lane,
                             float* inv_l) {
  for (int i = 0; i < a.nq; ++i) {
    const bool saw_none = l_lane[i] <= 0.0f;  // false for NaN (a NaN score), which carries on
    inv_l[i] = saw_none ? 0.0f : 1.0f / l_lane[i];  // lanes that saw no key: O is 0
    // In double, rounded once: m + log2(l) and the change of base each rounded in fp32 made LSE
    // 1.5x, and through P the dQ 1.8x, as inexact as the plain fp32 m + log(l) (L = 4096).
    a.lse[i] = saw_none ? kNegInf : float((double(m_lane[i]) + __builtin_log2(double(l_lane[i]))) * kLn2d);
  }
  lanes_to_rows<false>(ot, a.nq, a.head_dim, inv_l, a.o, a.o_stride);
}

void forward_tile(const ForwardTileArgs& a) {
  const int D = a.head_dim;
  float* ot = a.scratch;        // [D][BR] running output, transposed
  float* st = ot + D * BR;      // [BC][BR] scores, then probabilities
  float* stats = st + BC * BR;  // m, l per lane
  float* m_lane = stats;
  float* l_lane = stats + BR;

  begin_forward_tile(a, ot, m_lane, l_lane);
  OnlineSoftmax sm;
  V* m = sm.m;
  V* l = sm.l;
  for (int v = 0; v < NV; ++v) {
    m[v] = Isa::load(m_lane + v * W);
    l[v] = Isa::load(l_lane + v * W);
  }

  for (int b = 0; b < a.num_blocks; ++b) {
    const KeyBlockRef& blk = a.blocks[b];
    const int nk = blk.count;
    const float* vt = a.vt + int64_t(blk.index) * D * BC;
    if (blk.kind != TileKind::partial && !a.qt_pairs) {
      forward_block(a.qt, D, a.k + blk.row0 * a.kv_stride, a.kv_stride, nk, vt, st, ot, sm);  // no element mask
      continue;
    }
    // Boundary blocks (and bf16 pairs): scores, mask, then the block's maximum first.
    V mnew[NV], alpha[NV], lsum[NV];
    for (int v = 0; v < NV; ++v) mnew[v] = m[v];
    if (a.qt_pairs)
      scores_bf16(a.qt_pairs, D, a.k16 + blk.row0 * a.kv_stride, a.kv_stride, nk, a.score_scale, st);
    else
      scores(a.qt, D, a.k + blk.row0 * a.kv_stride, a.kv_stride, nk, st);
    if (blk.kind == TileKind::partial) {
      apply_element_mask(st, nk, blk.row0, a.nq, a.mask.lo, a.mask.hi, a.mask.brow, a.mask.k_pos,
                         a.mask.block_mask, a.mask.block_count, a.mask.mask_block);
    }
    for (int j = 0; j < nk; ++j)
      for (int v = 0; v < NV; ++v) mnew[v] = Isa::max(mnew[v], Isa::load(st + j * BR + v * W));
    for (int v = 0; v < NV; ++v) {
      alpha[v] = Isa::exp2(Isa::sub(m[v], mnew[v]));
      lsum[v] = Isa::zero();
    }
    for (int j = 0; j < nk; ++j) {
      for (int v = 0; v < NV; ++v) {
        V p = Isa::exp2(Isa::sub(Isa::load(st + j * BR + v * W), mnew[v]));
        Isa::store(st + j * BR + v * W, p);
        lsum[v] = Isa::add(lsum[v], p);
      }
    }
    for (int v = 0; v < NV; ++v) {
      l[v] = Isa::fmadd(l[v], alpha[v], lsum[v]);
      m[v] = mnew[v];
    }
    accumulate_lanes<true>(ot, D, st, nk, vt, 1, BC, alpha);
  }

  for (int v = 0; v < NV; ++v) {
    Isa::store(m_lane + v * W, m[v]);
    Isa::store(l_lane + v * W, l[v]);
  }
  end_forward_tile(a, ot, m_lane, l_lane, stats + 2 * BR);
}

#include "kernels/cpu/attention_tiles_bf16.inl"

// dK and dV of a block are summed in panels of about kGradPanelRows query rows (tiles x heads of
// the group), as the plain fp32 computation sums them (kernels/reference.cpp): each tile's sum
// (grad_rows) goes to the panel, and a full panel to a.dk/a.dv. Tile sums added straight to
// a.dk/a.dv would still make a chain of L x group / Br additions, too long for AVX2's 16-row
// tiles (2.5x the plain fp32 error at L = 16384 with GQA; with panels, the chain is L x group /
// 256 long whatever the tile).
constexpr int kGradPanelRows = 256;
constexpr int kPanelTiles = BR >= kGradPanelRows ? 1 : kGradPanelRows / BR;

// out[j][:] += panel[j][:] for the n rows of a block (row strides os and D), and the panel zeroed.
inline void add_panel(float* out, int64_t os, float* panel, int n, int D) {
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < D; d += W) {
      float* o = out + j * os + d;
      float* p = panel + j * D + d;
      Isa::store(o, Isa::add(Isa::load(o), Isa::load(p)));
      Isa::store(p, Isa::zero());
    }
}

void backward_block(const BackwardBlockArgs& a) {
  const int D = a.head_dim;
  const int nk = a.nk;
  float* dk_panel = a.scratch;  // [BCB][D] each, zero between panels
  float* dv_panel = dk_panel + BCB * D;
  for (int e = 0; e < nk * D; ++e) dk_panel[e] = dv_panel[e] = 0.0f;
  const auto end_of_tile = [&](int t) {
    if ((t + 1) % kPanelTiles != 0 && t + 1 != a.num_tiles) return;
    add_panel(a.dk, a.dkv_stride, dk_panel, nk, D);
    add_panel(a.dv, a.dkv_stride, dv_panel, nk, D);
  };
  float* st = dv_panel + BCB * D;  // [BCB][BR] scores -> P^T -> dS^T
  float* dpt = st + BCB * BR;
  if (a.k16) {
    // K^T of the block as pairs of key rows, [D][BCB/2], once for all the block's tiles.
    bf16_bits* x16 = reinterpret_cast<bf16_bits*>(dpt + BCB * BR);                       // [BCB][BR]
    uint32_t* ds_pairs = reinterpret_cast<uint32_t*>(dpt + BCB * BR + BCB * BR / 2);      // [BCB/2][BR]
    uint32_t* kt_pairs = ds_pairs + (BCB / 2) * BR;                                       // [D][BCB/2]
    for (int jp = 0; jp < BCB / 2; ++jp) {
      const int j = 2 * jp;
      const bf16_bits* k0 = a.k16 + j * a.kv_stride;
      const bf16_bits* k1 = k0 + a.kv_stride;
      for (int d = 0; d < D; ++d) {
        const uint32_t lo = j < nk ? k0[d] : 0, hi = j + 1 < nk ? k1[d] : 0;
        kt_pairs[d * (BCB / 2) + jp] = lo | (hi << 16);
      }
    }
    for (int t = 0; t < a.num_tiles; ++t) {
      backward_tile_bf16(a, a.tiles[t], st, dpt, x16, ds_pairs, kt_pairs, dk_panel, dv_panel);
      end_of_tile(t);
    }
    return;
  }
  // K^T of the block [D][BCB], once for all its tiles: dQ += dS K broadcasts then walk one head
  // dim's keys contiguously (as O += P V does in the forward). It takes dP^T's place: the fp32
  // path forms dS^T in dP^T's epilogue and never stores dP^T.
  float* kt = dpt;
  rows_to_lanes(a.k, a.kv_stride, D, 1.0f, [nk](int j) { return j < nk; }, kt, BCB);
  const V scale = Isa::set1(a.scale);
  for (int t = 0; t < a.num_tiles; ++t) {
    const BackwardTileRef& tile = a.tiles[t];
    V lse2[NV], delta[NV];
    for (int v = 0; v < NV; ++v) {
      lse2[v] = Isa::load(tile.lse2 + v * W);
      delta[v] = Isa::load(tile.delta + v * W);
    }
    // P^T = 2^(S^T - LSE): in the score product's epilogue; boundary tiles mask S^T first and
    // take a pass of their own.
    if (tile.kind == TileKind::partial) {
      scores(tile.qt, D, a.k, a.kv_stride, nk, st);
      apply_element_mask(st, nk, 0, tile.nq, tile.lane_lo, tile.lane_hi, tile.lane_brow, a.k_pos, a.block_mask,
                         a.block_count, a.mask_block);
      for (int j = 0; j < nk; ++j)
        for (int v = 0; v < NV; ++v)
          Isa::store(st + j * BR + v * W, Isa::exp2(Isa::sub(Isa::load(st + j * BR + v * W), lse2[v])));
    } else {
      scores(tile.qt, D, a.k, a.kv_stride, nk, st, [&](int, int v, V s) { return Isa::exp2(Isa::sub(s, lse2[v])); });
    }
    accumulate_grad(dv_panel, D, st, nk, tile.dout, tile.dout_stride, tile.nq, D);
    // dS^T = P^T * (dP^T - delta) * scale, in the epilogue of dP^T = V dOt, over P^T in place.
    scores(tile.dot, D, a.v, a.kv_stride, nk, st, [&](int j, int v, V dp) {
      return Isa::mul(Isa::mul(Isa::load(st + j * BR + v * W), Isa::sub(dp, delta[v])), scale);
    });
    accumulate_grad(dk_panel, D, st, nk, tile.q, tile.q_stride, tile.nq, D);
    accumulate_lanes<false>(tile.dqt, D, st, nk, kt, 1, BCB, nullptr);
    end_of_tile(t);
  }
}

// The FMA peak of one core: kFmaChains independent multiply-add chains (enough to cover the FMA
// latency on every current core), iters times. Returns a value so the loop is not optimised away.
constexpr int kFmaChains = 12;
float fma_loop(int64_t iters, float seed) {
  V acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = Isa::set1(seed + float(c));
  const V a = Isa::set1(0.999999f), b = Isa::set1(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int c = 0; c < kFmaChains; ++c) acc[c] = Isa::fmadd(acc[c], a, b);
  }
  V sum = acc[0];
  for (int c = 1; c < kFmaChains; ++c) sum = Isa::add(sum, acc[c]);
  float lanes[W];
  Isa::store(lanes, sum);
  float total = 0.0f;
  for (int i = 0; i < W; ++i) total += lanes[i];
  return total;
}

// The bf16 dot-product peak of one core, the yardstick of the bf16 rows: kFmaChains independent
// chains of the pair instruction (4 FLOPs per lane: two products and two sums). 0 where the ISA
// has none.
template <class I = Isa>
float bf16_dot_loop(int64_t iters, float seed) {
  if constexpr (I::kHasBf16Dot) {
    V acc[kFmaChains];
    for (int c = 0; c < kFmaChains; ++c) acc[c] = Isa::set1(seed + float(c));
    const typename I::Pairs a = I::set1_pair(0x3f803f80u), b = I::set1_pair(0x33d633d6u);  // 1.0, 1e-7 pairs
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
      for (int c = 0; c < kFmaChains; ++c) acc[c] = I::dot_pairs(acc[c], a, b);
    }
    V sum = acc[0];
    for (int c = 1; c < kFmaChains; ++c) sum = Isa::add(sum, acc[c]);
    float lanes[W];
    Isa::store(lanes, sum);
    float total = 0.0f;
    for (int i = 0; i < W; ++i) total += lanes[i];
    return total;
  } else {
    (void)iters;
    return seed;
  }
}

void pack_lanes(const float* src, int64_t stride, int nq, int D, float scale, float* dst, int lanes) {
  rows_to_lanes(src, stride, D, scale, [nq](int i) { return i < nq; }, dst, lanes);
}

void add_lanes_to_rows(const float* src, int nq, int D, float* dst, int64_t stride) {
  lanes_to_rows<true>(src, nq, D, nullptr, dst, stride);
}

}  // namespace

// (The AMX translation unit takes this table and puts its bf16 tile functions into it.)
#if defined(RINGATTN_AMX)
TileKernels fma_tile_kernels() {
#else
TileKernels tile_kernels() {
#endif
  return TileKernels{Isa::kName,         W,  BR, BC, BCB, &forward_tile, &backward_block, &fma_loop, kFmaChains * W * 2,
                     Isa::kHasBf16Dot, &bf16_dot_loop<>, Isa::kHasBf16Dot ? kFmaChains * W * 4 : 0,
                     &pack_lanes,       &add_lanes_to_rows, &decode_block, &read_loop};
}
