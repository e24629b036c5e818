// The contract between the generic CPU driver (tile planning, threading, packing) and the
// per-ISA compute functions (the arithmetic of one query tile or one key block).
//
// Layout conventions inside a tile: vectors run over queries. A query tile of Br rows is
// packed transposed, Qt[d][i] (Br floats per head-dim index), so that scores for one key row
// j form Br/W full vectors ST[j][0..Br), and the online-softmax row statistics of the Br
// queries are plain elementwise vector operations, with no horizontal reductions.
#pragma once

#include <cstdint>

#include "kernels/mask/mask_view.hpp"
#include "util/dtype.hpp"

namespace ringattn::kernels::cpu {

// One block of key rows, in the order the tile must visit them.
struct KeyBlockRef {
  int64_t row0;    // first row in the key/value chunk
  int32_t count;   // rows, <= key block size
  TileKind kind;   // full (no element mask) or partial
  int32_t index;   // the block's index in the call's key blocks (its V^T in ForwardTileArgs::vt)
};

// Per-query-lane data needed to apply the element mask on partial blocks.
struct LaneMask {
  const int64_t* lo;    // key_range(i).lo per lane
  const int64_t* hi;    // key_range(i).hi per lane
  const int64_t* brow;  // i / mask_block per lane (block mask only)
  const int64_t* k_pos; // positions of the key/value chunk's rows
  const uint8_t* block_mask;
  int64_t block_count;
  int64_t mask_block;
};

struct ForwardTileArgs {
  int head_dim;
  int nq;                   // valid lanes (<= Br); padded lanes hold zeros
  const float* qt;          // [D][Br], pre-multiplied by scale * log2(e)
  const float* k;           // row j of this head at k + j * kv_stride (fp32)
  const float* vt;          // V^T of this head's key blocks: block b at vt + b * D * Bc, [D][Bc]
  int64_t kv_stride;
  const KeyBlockRef* blocks;
  int num_blocks;
  LaneMask mask;
  float* o;                 // state rows (normalised O) at o + i * o_stride
  int64_t o_stride;
  float* lse;               // state LSE per lane (natural log), contiguous
  float* scratch;           // forward_scratch_floats(D) floats
  // bf16 inputs on an ISA with a bf16 dot product (TileKernels::bf16_dot): Q as bf16 pairs
  // [D/2][Br] (unscaled; lane i holds Q[i][2p] low, Q[i][2p+1] high) and K rows as bf16 at
  // k16 + j * kv_stride; scores are then multiplied by score_scale. Null: the fp32 path.
  const uint32_t* qt_pairs = nullptr;
  const bf16_bits* k16 = nullptr;
  float score_scale = 1.0f;
  // The AMX path (TileKernels::amx, with qt_pairs and k16): V^T of this head's key blocks as bf16,
  // block b at vt16 + b * D * Bc, [D][Bc] (vt is then unused).
  const bf16_bits* vt16 = nullptr;
};

// One (query tile, head) visited by a backward key-block item.
struct BackwardTileRef {
  int nq;
  TileKind kind;
  const float* qt;          // [D][Br], pre-multiplied by scale * log2(e)
  const float* dot;         // dO transposed, [D][Br]
  const float* q;           // natural rows: q + i * q_stride (fp32)
  int64_t q_stride;
  const float* dout;        // natural rows: dout + i * dout_stride (fp32)
  int64_t dout_stride;
  const float* lse2;        // [Br] LSE in log2 units; +inf for rows that see no key
  const float* delta;       // [Br] rowsum(dO * O)
  const int64_t* lane_lo;   // per lane key_range, for partial tiles
  const int64_t* lane_hi;
  const int64_t* lane_brow;
  float* dqt;               // [D][Br] this thread's dQ accumulator for the tile (transposed)
  // bf16 dot path: Q and dO as bf16 pairs over the head dim [D/2][Br] (for S and dP), and as
  // pairs of consecutive rows [Br/2][D] (lane d holds row 2p, dim d low and row 2p+1 high; for
  // dK = dS^T Q and dV = P^T dO, whose sums run over the queries). q and dout are then unused.
  const uint32_t* qt_pairs = nullptr;
  const uint32_t* dot_pairs = nullptr;
  const uint32_t* q_row_pairs = nullptr;
  const uint32_t* dout_row_pairs = nullptr;
};

struct BackwardBlockArgs {
  int head_dim;
  float scale;              // softmax scale (dS carries it into dQ and dK)
  int nk;
  const float* k;           // block rows: k + j * kv_stride (fp32)
  const float* v;
  int64_t kv_stride;
  const int64_t* k_pos;     // positions of the block's rows
  float* dk;                // accumulated in place: dk + j * dkv_stride
  float* dv;
  int64_t dkv_stride;
  const BackwardTileRef* tiles;
  int num_tiles;
  const uint8_t* block_mask;
  int64_t block_count;
  int64_t mask_block;
  float* scratch;           // backward_scratch_floats() floats
  // bf16 dot path: K and V block rows as bf16 (stride kv_stride); k and v are then unused.
  // All five products take bf16 operands with fp32 sums; P and dS are rounded to bf16 for
  // dV = P^T dO, dK = dS^T Q and dQ = dS K, as FlashAttention-2 does on GPUs.
  const bf16_bits* k16 = nullptr;
  const bf16_bits* v16 = nullptr;
  float score_scale = 1.0f;        // scale * log2(e), applied to bf16-dot scores
};

// One work item of the decode kernel (kernels/cpu/decode_cpu.hpp): the nq query rows of one
// key/value head (its H / Hkv query heads times the new tokens, packed as the rows of one tile,
// as FlashDecoding does) against a run of that head's cached rows. It writes the run's state, not
// yet normalised: acc = sum p V, l = sum p, m = the max (log2 units), which the driver merges.
struct DecodeBlockArgs {
  int head_dim;
  int nq;                    // <= kDecodeMaxRows
  const float* q;            // [nq][D], pre-multiplied by scale * log2(e)
  const int64_t* q_pos;      // [nq]
  const void* k;             // row j at k + j * D elements (one head's rows, contiguous)
  const void* v;
  bool bf16;                 // k, v are bf16 (else fp32)
  const int64_t* k_pos;      // [rows], ascending
  int64_t rows;
  int64_t window_left;       // key j visible to query i when j <= i and (left < 0 or j >= i - left)
  float* acc;                // [nq][D]
  float* m;                  // [nq]; a row that saw no key: -FLT_MAX and l = 0
  float* l;                  // [nq]
  float* scratch;            // decode_scratch_floats(D) floats
  // bf16 K on an ISA with the bf16 dot product: Q as bf16 pairs [nq][D/2] (unscaled; the low half
  // holds the even element), scores multiplied by score_scale. Null: q above (the FMA path).
  const uint32_t* q_pairs = nullptr;
  float score_scale = 1.0f;
};
inline constexpr int kDecodeMaxRows = 64;
// Keys per block of both passes: whole vectors of scores on every ISA, and P V's products summed
// from zero over 32 keys before they join the running sum.
inline constexpr int kDecodeKeyBlock = 32;
// The most rows one call takes: its rows' scores stay in L2 between the passes (64 x 2048 floats).
inline constexpr int64_t kDecodeChunkRows = 2048;
inline int64_t decode_scratch_floats(int head_dim) {
  // The block's K widened, K and V of a padded tail block, every row's scores over the run.
  return int64_t(3 * kDecodeKeyBlock) * head_dim + int64_t(kDecodeMaxRows) * (kDecodeChunkRows + 1) + 64;
}

using PackLanesFn = void (*)(const float* src, int64_t stride, int nq, int head_dim, float scale, float* dst,
                            int lanes);

// The function table each ISA translation unit provides.
struct TileKernels {
  const char* name;
  int lanes;        // W
  int query_tile;   // Br
  int key_block;    // Bc of the forward
  int backward_key_block;  // Bc of a backward item
  void (*forward_tile)(const ForwardTileArgs&);
  void (*backward_block)(const BackwardBlockArgs&);
  float (*fma_loop)(int64_t iters, float seed);  // the benchmark's FMA peak probe
  int fma_flops_per_iter;
  bool bf16_dot;    // takes bf16 pairs (exact products, fp32 sums): forward Q K^T; every backward product
  float (*bf16_dot_loop)(int64_t iters, float seed);  // the bf16 dot-product peak probe (bf16_dot only)
  int bf16_dot_flops_per_iter;
  // dst[d][i] = scale * src[i * stride + d] for i < nq, lanes past nq 0: fp32 rows packed as
  // transposed lanes [D][lanes] (a query tile: lanes = Br; a key block's V^T: lanes = Bc).
  PackLanesFn pack_lanes;
  // dst[i * stride + d] += src[d][i] for i < nq: a tile's transposed lanes added to its rows.
  void (*add_lanes_to_rows)(const float* src, int nq, int head_dim, float* dst, int64_t stride);
  void (*decode_block)(const DecodeBlockArgs&);
  // Sum of n floats read once (the read-bandwidth probe of the decode benchmark).
  float (*read_loop)(const float* p, int64_t n);
  // AMX (kernels/cpu/attention_amx.cpp): bf16 inputs take the tile matrix unit for every product
  // of the forward and the backward, with P and dS rounded to bf16 (SamePrecision::bf16_products);
  // fp32 inputs and the decode kernel run the AVX-512 code. tile_loop: the matrix unit's peak probe.
  bool amx = false;
  int amx_key_block = 0;  // Bc of the AMX forward (bf16 inputs): fewer loads and stores of O^T per key
  float (*tile_loop)(int64_t iters, float seed) = nullptr;
  int tile_flops_per_iter = 0;
};

inline int64_t forward_scratch_floats(const TileKernels& t, int head_dim) {
  // Qt is packed by the driver; here Ot [D][Br] and ST [Bc][Br] plus row statistics; on the AMX
  // path (its own Bc) also P^T as pairs of key rows [Bc/2][Br] and a tail block's K rows,
  // zero-padded, [Bc][D] bf16.
  const int64_t bc = t.amx && t.amx_key_block > t.key_block ? t.amx_key_block : t.key_block;
  const int64_t tile = bc * t.query_tile;
  const int64_t amx = t.amx ? tile / 2 + bc * head_dim / 2 : 0;
  return int64_t(head_dim) * t.query_tile + tile + 8 * t.query_tile + amx;
}
inline int64_t backward_scratch_floats(const TileKernels& t, int head_dim) {
  // The dK and dV panels [Bc][D] each; ST [Bc][Br] fp32, then the fp32 path's K^T [D][Bc] (dS is
  // formed in dP's epilogue, so no dPT); or on the bf16 path dPT [Bc][Br] fp32, P and dS as bf16
  // rows [Bc][Br], dS as pairs of key rows [Bc/2][Br] and K^T as pairs of key rows [D][Bc/2].
  // Sized for either.
  const int64_t tile = int64_t(t.backward_key_block) * t.query_tile;
  const int64_t kt_f32 = int64_t(head_dim) * t.backward_key_block;
  const int64_t bf16_extra = t.bf16_dot ? tile + tile / 2 + int64_t(head_dim) * (t.backward_key_block / 2) : 0;
  // AMX: (dPT in the 2 * tile) P and dS as bf16 rows [Bc][Br] each, dS as pairs [Bc/2][Br], K^T as bf16 [D][Bc], and
  // a tail block's K and V rows zero-padded, [Bc][D] bf16 each.
  const int64_t amx_extra = t.amx ? 3 * (tile / 2) + kt_f32 / 2 + kt_f32 : 0;
  const int64_t extra = kt_f32 > bf16_extra ? kt_f32 : bf16_extra;
  return 2 * kt_f32 + 2 * tile + (extra > amx_extra ? extra : amx_extra) + 4 * t.query_tile;
}

}  // namespace ringattn::kernels::cpu
