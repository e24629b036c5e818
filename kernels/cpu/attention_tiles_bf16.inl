// The bf16 backward of one key block (included by attention_tiles.inl inside its anonymous
// namespace, after the fp32 helpers it reuses): all five products from bf16 operands with fp32
// sums, P and dS rounded to bf16 before the products with them, as FlashAttention-2 does. The
// sums of dV = P^T dO and dK = dS^T Q run over queries, so Q and dO come as pairs of consecutive
// query rows; the sum of dQ = dS K runs over keys, so dS and K^T are paired over key rows.

// The bf16 backward products (I = Isa, as in rows_times_lanes_bf16). Every sum is fp32; each
// instruction adds two exact products of bf16 values.
//
// out[j][d0 .. d0 + GG*W) += sum_i X16[j][i] * Y[i][d0 ..] for RR rows j (dV += P^T dO, dK += dS^T Q):
// X16 rows are bf16 over the Br query lanes, Y comes as pairs of consecutive query rows [Br/2][D].
// Summed from zero, then added, as grad_rows does.
template <int RR, int GG, class I = Isa>
inline void grad_rows_bf16(float* out, int64_t os, const bf16_bits* xt, const uint32_t* yp, int D, int npairs, int d0) {
  if constexpr (I::kHasBf16Dot) {
    V acc[RR][GG];
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int g = 0; g < GG; ++g) acc[r][g] = Isa::zero();
    for (int ip = 0; ip < npairs; ++ip) {
      typename I::Pairs yv[GG];
#pragma GCC unroll 8
      for (int g = 0; g < GG; ++g) yv[g] = I::load_pairs(yp + int64_t(ip) * D + d0 + g * W);
#pragma GCC unroll 8
      for (int r = 0; r < RR; ++r) {
        uint32_t pair;
        __builtin_memcpy(&pair, xt + r * BR + 2 * ip, sizeof pair);  // X[j][2ip] low, X[j][2ip+1] high
        const typename I::Pairs b = I::set1_pair(pair);
#pragma GCC unroll 8
        for (int g = 0; g < GG; ++g) acc[r][g] = I::dot_pairs(acc[r][g], yv[g], b);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int g = 0; g < GG; ++g) {
        float* o = out + r * os + d0 + g * W;
        Isa::store(o, Isa::add(Isa::load(o), acc[r][g]));
      }
  } else {
    (void)out, (void)os, (void)xt, (void)yp, (void)D, (void)npairs, (void)d0;
  }
}

template <int RR>
inline void grad_row_group_bf16(float* out, int64_t os, const bf16_bits* xt, const uint32_t* yp, int npairs, int D) {
  int d0 = 0;
  for (; d0 + GV * W <= D; d0 += GV * W) grad_rows_bf16<RR, GV>(out, os, xt, yp, D, npairs, d0);
  switch ((D - d0) / W) {
    case 3: grad_rows_bf16<RR, 3>(out, os, xt, yp, D, npairs, d0); break;
    case 2: grad_rows_bf16<RR, 2>(out, os, xt, yp, D, npairs, d0); break;
    case 1: grad_rows_bf16<RR, 1>(out, os, xt, yp, D, npairs, d0); break;
    default: break;
  }
}

inline void accumulate_grad_bf16(float* out, int64_t os, const bf16_bits* xt, int n, const uint32_t* yp, int nq, int D) {
  const int npairs = (nq + 1) / 2;  // an odd last query row is paired with the zero padding
  for_row_groups(n, [&](auto rows, int j) {
    grad_row_group_bf16<decltype(rows)::value>(out + j * os, os, xt + j * BR, yp, npairs, D);
  });
}

// Ot[d][:] += sum_j X[j][d] * PT[j][:] for RR head-dim rows from d0 (dQ += dS K), with PT as pairs
// of key rows [Bc/2][Br] and X^T as pairs of key rows [D][Bc/2]; summed from zero, then added.
template <int RR, class I = Isa>
inline void lanes_times_rows_bf16(float* ot, int d0, const uint32_t* pt, int npairs, const uint32_t* xt, int xs) {
  if constexpr (I::kHasBf16Dot) {
    V acc[RR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = Isa::zero();
    for (int jp = 0; jp < npairs; ++jp) {
      typename I::Pairs p[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) p[v] = I::load_pairs(pt + jp * BR + v * W);
#pragma GCC unroll 8
      for (int r = 0; r < RR; ++r) {
        const typename I::Pairs b = I::set1_pair(xt[(d0 + r) * xs + jp]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = I::dot_pairs(acc[r][v], p[v], b);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        float* o = ot + (d0 + r) * BR + v * W;
        Isa::store(o, Isa::add(Isa::load(o), acc[r][v]));
      }
  } else {
    (void)ot, (void)d0, (void)pt, (void)npairs, (void)xt, (void)xs;
  }
}

inline void accumulate_lanes_bf16(float* ot, int D, const uint32_t* pt, int npairs, const uint32_t* xt, int xs) {
  for_row_groups(D, [&](auto rows, int d0) {
    lanes_times_rows_bf16<decltype(rows)::value>(ot, d0, pt, npairs, xt, xs);
  });
}

// The backward tile of one key block from bf16 operands: S and dP as in the fp32 path (bf16 pairs
// over the head dim), then P rounded to bf16 for dV, dS rounded to bf16 for dK and dQ.
template <class I = Isa>
void backward_tile_bf16(const BackwardBlockArgs& a, const BackwardTileRef& tile, float* st, float* dpt,
                        bf16_bits* x16, uint32_t* ds_pairs, const uint32_t* kt_pairs, float* dk_panel,
                        float* dv_panel) {
  if constexpr (I::kHasBf16Dot) {
    const int D = a.head_dim, nk = a.nk;
    scores_bf16(tile.qt_pairs, D, a.k16, a.kv_stride, nk, a.score_scale, st);
    if (tile.kind == TileKind::partial) {
      apply_element_mask(st, nk, 0, tile.nq, tile.lane_lo, tile.lane_hi, tile.lane_brow, a.k_pos, a.block_mask,
                         a.block_count, a.mask_block);
    }
    V lse2[NV], delta[NV];
    for (int v = 0; v < NV; ++v) {
      lse2[v] = Isa::load(tile.lse2 + v * W);
      delta[v] = Isa::load(tile.delta + v * W);
    }
    for (int j = 0; j < nk; ++j)
      for (int v = 0; v < NV; ++v) {
        const V p = Isa::exp2(Isa::sub(Isa::load(st + j * BR + v * W), lse2[v]));
        Isa::store(st + j * BR + v * W, p);
        I::store_bf16(x16 + j * BR + v * W, p);
      }
    scores_bf16(tile.dot_pairs, D, a.v16, a.kv_stride, nk, 1.0f, dpt);
    accumulate_grad_bf16(dv_panel, D, x16, nk, tile.dout_row_pairs, tile.nq, D);
    const V scale = Isa::set1(a.scale);
    for (int j = 0; j < nk; j += 2) {
      for (int v = 0; v < NV; ++v) {
        const V p0 = Isa::load(st + j * BR + v * W), dp0 = Isa::load(dpt + j * BR + v * W);
        const V ds0 = Isa::mul(Isa::mul(p0, Isa::sub(dp0, delta[v])), scale);
        V ds1 = Isa::zero();  // an odd last key row is paired with zero
        I::store_bf16(x16 + j * BR + v * W, ds0);
        if (j + 1 < nk) {
          const V p1 = Isa::load(st + (j + 1) * BR + v * W), dp1 = Isa::load(dpt + (j + 1) * BR + v * W);
          ds1 = Isa::mul(Isa::mul(p1, Isa::sub(dp1, delta[v])), scale);
          I::store_bf16(x16 + (j + 1) * BR + v * W, ds1);
        }
        I::store_pairs(ds_pairs + (j / 2) * BR + v * W, I::pair_bf16(ds0, ds1));
      }
    }
    accumulate_grad_bf16(dk_panel, D, x16, nk, tile.q_row_pairs, tile.nq, D);
    accumulate_lanes_bf16(tile.dqt, D, ds_pairs, (nk + 1) / 2, kt_pairs, BCB / 2);
  } else {
    (void)a, (void)tile, (void)st, (void)dpt, (void)x16, (void)ds_pairs, (void)kt_pairs, (void)dk_panel, (void)dv_panel;
  }
}

