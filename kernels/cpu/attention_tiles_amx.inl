// The AMX forward and backward of bf16 inputs (included by attention_amx.cpp inside its anonymous
// namespace, after the AVX-512 helpers and the tile products it uses).
//
// The layout is the AVX-512 kernels' (attention_tiles.inl): scores come out transposed, S^T[j][i]
// (key rows, query lanes), so the softmax statistics stay elementwise vector operations. As tile
// products: S^T = K Q^T takes K's rows as A and Q as pairs over the head dim [D/2][Br] as B (the
// layout the bf16 packing already makes); O^T += V^T P^T takes V^T blocks [D][Bc] bf16 as A and P^T
// as pairs of key rows [Bc/2][Br] as B. The backward's dV += P^T dO and dK += dS^T Q take P^T and
// dS^T as bf16 rows [Bc][Br] and Q, dO as pairs of query rows [Br/2][D]; dQ^T += K^T dS^T takes K^T
// [D][Bc] bf16 and dS^T as pairs of key rows.
//
// Error model (SamePrecision::bf16_products): products of bf16 values are exact and summed in fp32;
// P is rounded to bf16 before P V (forward) and P^T dO (backward), dS before dS^T Q and K^T dS^T, as
// FlashAttention-2 does on tensor cores; the softmax sums l take P unrounded. The tiles accumulate
// O, dQ and the dK/dV panels in place (each product added to the running fp32 sum): the bf16
// rounding of P and dS (2^-9 per term) outweighs that chain's fp32 rounding (2^-24 per addition)
// by far at any sequence length these kernels run.
//
// Key blocks are processed in whole chunks of 32 keys: a tail block's K (and V) rows are copied,
// zero-padded, and its padding rows get score -inf (P = 0, dS = 0).

inline int round_up_32(int n) { return (n + 31) & ~31; }

// ST rows [n, n_pad) = -inf: padding keys take no weight.
inline void hide_padding_rows(float* st, int n, int n_pad) {
  for (int j = n; j < n_pad; ++j)
    for (int v = 0; v < NV; ++v) Isa::store(st + j * BR + v * W, Isa::set1(kNegInf));
}

// The online softmax of one key block of unscaled scores ST (n_pad rows): m moves lazily, lane by
// lane, only where the block's scaled maximum exceeds it by more than kMaxSlack (as in
// softmax_scores: p <= 2^kMaxSlack is as exact in fp32 and bf16 as p <= 1), which then rescales l
// and O^T; P^T is written as bf16 pairs of key rows, l takes the unrounded p.
inline void amx_block_softmax(const float* st, int n_pad, V scale, V* m, V* l, float* ot, int D, uint32_t* pt) {
  V bmax[NV];
  for (int v = 0; v < NV; ++v) bmax[v] = Isa::set1(kNegInf);
  for (int j = 0; j < n_pad; ++j)
    for (int v = 0; v < NV; ++v) bmax[v] = Isa::max(bmax[v], Isa::load(st + j * BR + v * W));
  const V slack = Isa::set1(kMaxSlack);
  bool moved = false;
  V alpha[NV];
  for (int v = 0; v < NV; ++v) {
    const V top = Isa::mul(bmax[v], scale);
    const __mmask16 move = _mm512_cmp_ps_mask(top, Isa::add(m[v], slack), _CMP_GT_OQ);
    const V mnew = _mm512_mask_max_ps(m[v], move, m[v], top);
    alpha[v] = Isa::exp2(Isa::sub(m[v], mnew));  // 1 where m stays; 0 from kNoKeyMax
    m[v] = mnew;
    moved |= move != 0;
  }
  if (moved) {
    for (int v = 0; v < NV; ++v) l[v] = Isa::mul(l[v], alpha[v]);
    for (int d = 0; d < D; ++d)
      for (int v = 0; v < NV; ++v) Isa::store(ot + d * BR + v * W, Isa::mul(Isa::load(ot + d * BR + v * W), alpha[v]));
  }
  for (int v = 0; v < NV; ++v) {
    V sum0 = Isa::zero(), sum1 = Isa::zero();
    for (int j = 0; j < n_pad; j += 2) {
      const V p0 = Isa::exp2(_mm512_fmsub_ps(Isa::load(st + j * BR + v * W), scale, m[v]));
      const V p1 = Isa::exp2(_mm512_fmsub_ps(Isa::load(st + (j + 1) * BR + v * W), scale, m[v]));
      sum0 = Isa::add(sum0, p0);
      sum1 = Isa::add(sum1, p1);
      _mm512_storeu_si512(pt + (j / 2) * BR + v * W, bf16_pairs(p0, p1));
    }
    l[v] = Isa::add(l[v], Isa::add(sum0, sum1));
  }
}

void amx_forward_tile(const ForwardTileArgs& a) {
  const int D = a.head_dim, kc = inner_chunk(D);
  float* ot = a.scratch;        // [D][BR] running output, transposed
  float* st = ot + D * BR;      // [BCA][BR] scores
  float* stats = st + BCA * BR;  // m, l, 1/l per lane
  uint32_t* pt = reinterpret_cast<uint32_t*>(stats + 8 * BR);   // [BCA/2][BR] P^T pairs
  bf16_bits* kpad = reinterpret_cast<bf16_bits*>(pt + (BCA / 2) * BR);  // [BCA][D]
  float* m_lane = stats;
  float* l_lane = stats + BR;
  begin_forward_tile(a, ot, m_lane, l_lane);
  V m[NV], l[NV];
  for (int v = 0; v < NV; ++v) {
    m[v] = Isa::load(m_lane + v * W);
    l[v] = Isa::load(l_lane + v * W);
  }
  const V scale = Isa::set1(a.score_scale);
  const Operand q = pairs_operand(a.qt_pairs, BR * 4, kc);
  const Operand p = pairs_operand(pt, BR * 4, kc);
  configure_tiles(kc);
  for (int b = 0; b < a.num_blocks; ++b) {
    const KeyBlockRef& blk = a.blocks[b];
    const int nk = blk.count, nk_pad = round_up_32(nk);
    const bf16_bits* k = a.k16 + blk.row0 * a.kv_stride;
    int64_t k_stride = a.kv_stride;
    if (nk < nk_pad) {
      padded_rows(k, a.kv_stride, nk, nk_pad, D, kpad);
      k = kpad, k_stride = D;
    }
    tile_product(st, BR * 4, nk_pad / 16, BR / 16, rows_operand(k, k_stride * 2, kc), q, D / kc, false);
    if (blk.kind == TileKind::partial)
      apply_element_mask(st, nk, blk.row0, a.nq, a.mask.lo, a.mask.hi, a.mask.brow, a.mask.k_pos, a.mask.block_mask,
                         a.mask.block_count, a.mask.mask_block);
    hide_padding_rows(st, nk, nk_pad);
    amx_block_softmax(st, nk_pad, scale, m, l, ot, D, pt);
    const bf16_bits* vt = a.vt16 + int64_t(blk.index) * D * BCA;
    tile_product(ot, BR * 4, D / 16, BR / 16, rows_operand(vt, BCA * 2, kc), p, nk_pad / kc, true);
  }
  _tile_release();
  for (int v = 0; v < NV; ++v) {
    Isa::store(m_lane + v * W, m[v]);
    Isa::store(l_lane + v * W, l[v]);
  }
  end_forward_tile(a, ot, m_lane, l_lane, stats + 2 * BR);
}

// P^T and dS^T of one (query tile, key block) from S^T and dP^T (n_pad rows): P = 2^(S scale - LSE),
// dS = P (dP - delta) scale, written as bf16 rows [BCB][BR] (A of dV and dK) and dS also as pairs
// of key rows [BCB/2][BR] (B of dQ), both rounded once.
inline void amx_softmax_gradient(const float* st, const float* dpt, int n_pad, const BackwardTileRef& tile,
                                 float score_scale, float scale, bf16_bits* p16, bf16_bits* ds16, uint32_t* ds_pairs) {
  const V sc = Isa::set1(score_scale), s = Isa::set1(scale);
  for (int v = 0; v < NV; ++v) {
    const V lse2 = Isa::load(tile.lse2 + v * W), delta = Isa::load(tile.delta + v * W);
    for (int j = 0; j < n_pad; j += 2) {
      const int e0 = j * BR + v * W, e1 = e0 + BR;
      const V p0 = Isa::exp2(_mm512_fmsub_ps(Isa::load(st + e0), sc, lse2));
      const V p1 = Isa::exp2(_mm512_fmsub_ps(Isa::load(st + e1), sc, lse2));
      const V ds0 = Isa::mul(Isa::mul(p0, Isa::sub(Isa::load(dpt + e0), delta)), s);
      const V ds1 = Isa::mul(Isa::mul(p1, Isa::sub(Isa::load(dpt + e1), delta)), s);
      store_bf16_rows(p16 + e0, BR, p0, p1);
      store_bf16_rows(ds16 + e0, BR, ds0, ds1);
      _mm512_storeu_si512(ds_pairs + (j / 2) * BR + v * W, bf16_pairs(ds0, ds1));
    }
  }
}

void amx_backward_block(const BackwardBlockArgs& a) {
  const int D = a.head_dim, nk = a.nk, nk_pad = round_up_32(nk), kc = inner_chunk(D);
  float* dk_panel = a.scratch;  // [BCB][D] each, zero between panels
  float* dv_panel = dk_panel + BCB * D;
  float* st = dv_panel + BCB * D;  // [BCB][BR] S^T
  float* dpt = st + BCB * BR;      // [BCB][BR] dP^T
  bf16_bits* p16 = reinterpret_cast<bf16_bits*>(dpt + BCB * BR);  // [BCB][BR]
  bf16_bits* ds16 = p16 + BCB * BR;                                // [BCB][BR]
  uint32_t* ds_pairs = reinterpret_cast<uint32_t*>(ds16 + BCB * BR);  // [BCB/2][BR]
  bf16_bits* kt = reinterpret_cast<bf16_bits*>(ds_pairs + (BCB / 2) * BR);  // [D][BCB]
  bf16_bits* kpad = kt + D * BCB;  // [BCB][D] each
  bf16_bits* vpad = kpad + BCB * D;
  for (int e = 0; e < nk_pad * D; ++e) dk_panel[e] = dv_panel[e] = 0.0f;
  const auto end_of_tile = [&](int t) {
    if ((t + 1) % kPanelTiles != 0 && t + 1 != a.num_tiles) return;
    add_panel(a.dk, a.dkv_stride, dk_panel, nk, D);
    add_panel(a.dv, a.dkv_stride, dv_panel, nk, D);
  };
  // K^T once for all the block's tiles, zero past nk (the A of dQ^T += K^T dS^T).
  for (int j = 0; j < nk_pad; ++j)
    for (int d = 0; d < D; ++d) kt[d * BCB + j] = j < nk ? a.k16[j * a.kv_stride + d] : bf16_bits{0};
  const bf16_bits *k = a.k16, *v = a.v16;
  int64_t kv_stride = a.kv_stride;
  if (nk < nk_pad) {
    padded_rows(a.k16, a.kv_stride, nk, nk_pad, D, kpad);
    padded_rows(a.v16, a.kv_stride, nk, nk_pad, D, vpad);
    k = kpad, v = vpad, kv_stride = D;
  }
  const int mk = nk_pad / 16, nq = BR / 16, md = D / 16;
  const Operand k_rows = rows_operand(k, kv_stride * 2, kc), v_rows = rows_operand(v, kv_stride * 2, kc);
  const Operand p_rows = rows_operand(p16, BR * 2, kc), ds_rows = rows_operand(ds16, BR * 2, kc);
  const Operand kt_rows = rows_operand(kt, BCB * 2, kc), ds_b = pairs_operand(ds_pairs, BR * 4, kc);
  configure_tiles(kc);
  for (int t = 0; t < a.num_tiles; ++t) {
    const BackwardTileRef& tile = a.tiles[t];
    tile_product(st, BR * 4, mk, nq, k_rows, pairs_operand(tile.qt_pairs, BR * 4, kc), D / kc, false);
    tile_product(dpt, BR * 4, mk, nq, v_rows, pairs_operand(tile.dot_pairs, BR * 4, kc), D / kc, false);
    if (tile.kind == TileKind::partial)
      apply_element_mask(st, nk, 0, tile.nq, tile.lane_lo, tile.lane_hi, tile.lane_brow, a.k_pos, a.block_mask,
                         a.block_count, a.mask_block);
    hide_padding_rows(st, nk, nk_pad);
    amx_softmax_gradient(st, dpt, nk_pad, tile, a.score_scale, a.scale, p16, ds16, ds_pairs);
    tile_product(dv_panel, D * 4, mk, md, p_rows, pairs_operand(tile.dout_row_pairs, D * 4, kc), BR / kc, true);
    tile_product(dk_panel, D * 4, mk, md, ds_rows, pairs_operand(tile.q_row_pairs, D * 4, kc), BR / kc, true);
    tile_product(tile.dqt, BR * 4, md, nq, kt_rows, ds_b, nk_pad / kc, true);
    end_of_tile(t);
  }
  _tile_release();
}
