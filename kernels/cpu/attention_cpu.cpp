// The drivers of the CPU kernels: tiles planned from the mask before any arithmetic
// (tile_schedule), packing, threading and the deterministic dQ/dK/dV reductions. The arithmetic
// of one tile is in attention_tiles.inl, compiled once per ISA (dispatch.cpp picks one).
#include "kernels/cpu/attention_cpu.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/dispatch.hpp"
#include "kernels/cpu/packing.hpp"
#include "kernels/cpu/tile_args.hpp"
#include "kernels/cpu/tile_schedule.hpp"

namespace ringattn::kernels {

namespace {

using cpu::BackwardBlockArgs;
using cpu::BackwardTileRef;
using cpu::ForwardTileArgs;
using cpu::KeyBlockRef;
using cpu::PackedKeyValues;
using cpu::PackRequest;
using cpu::TileKernels;
using cpu::candidate_key_blocks;
using cpu::element;
using cpu::lane_masks;
using cpu::make_row_blocks;
using cpu::pack_key_values;
using cpu::pack_pairs;

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kInf = std::numeric_limits<float>::infinity();
// Fewest backward work items for which the ISA's larger backward key block is used.
constexpr int64_t kMinBackwardItems = 64;

// n zeroed elements, 64-byte aligned, from a thread's own workspace: the tile buffers the vector
// kernels load and store whole 64-byte vectors from, which then never straddle two cache lines
// (a std::vector guarantees 16 bytes, so where the heap placed one decided it).
template <class T>
T* tile_buffer(cpu::Workspace& ws, size_t n) {
  T* p = ws.take<T>(n);
  std::fill_n(p, n, T{});
  return p;
}

int thread_count(const CpuOptions& options) {
  return options.threads > 0 ? options.threads : omp_get_max_threads();
}

void check_dims(const AttentionDims& dims) {
  if (dims.batch < 1 || dims.heads < 1 || dims.kv_heads < 1 || dims.heads % dims.kv_heads != 0)
    throw std::invalid_argument("attention: heads must be a positive multiple of kv_heads");
  if (!cpu_supports_head_dim(dims.head_dim))
    throw std::invalid_argument("attention: head_dim " + std::to_string(dims.head_dim) +
                                " is not supported by the CPU kernels (multiples of 16 up to 512)");
}

}  // namespace

void attention_forward(const AttentionDims& dims, const QueryRows& q, const KeyValueRows& kv, const MaskView& mask,
                       const AttentionState& state, const CpuOptions& options) {
  check_dims(dims);
  if (q.rows == 0 || kv.rows == 0) return;
  const TileKernels& tk = cpu::selected_tile_kernels();
  const int lanes = tk.query_tile;
  const int D = static_cast<int>(dims.head_dim);
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, group = H / Hkv;
  // bf16 inputs on an ISA with a bf16 dot product: scores from bf16 pairs, the rest in fp32; on
  // AMX every product from bf16 (V^T blocks in bf16 too), in key blocks of its own size.
  const bool dot16 = (tk.bf16_dot || tk.amx) && q.dtype == DType::bf16 && kv.dtype == DType::bf16;
  const bool tiles16 = dot16 && tk.amx;
  const int key_block = tiles16 ? tk.amx_key_block : tk.key_block;
  const std::vector<RowSpan> qtiles = make_row_blocks(q.pos, q.rows, lanes);
  const std::vector<RowSpan> kblocks = make_row_blocks(kv.pos, kv.rows, key_block);
  const int threads = thread_count(options);
  cpu::Workspace workspace;
  const PackedKeyValues packed =
      pack_key_values(dims, kv, PackRequest{!dot16, false, dot16, false}, threads, workspace);
  const float* vt =
      tiles16 ? nullptr : cpu::pack_value_blocks(dims, kv, kblocks, key_block, tk.pack_lanes, threads, workspace);
  const bf16_bits* vt16 =
      tiles16 ? cpu::pack_value_blocks_bf16(dims, kv, kblocks, key_block, threads, workspace) : nullptr;
  const int64_t items = static_cast<int64_t>(qtiles.size()) * B * H;
  const float qscale = dims.scale * kLog2e;

#pragma omp parallel num_threads(threads)
  {
    cpu::Workspace tile_ws;
    float* qt = tile_buffer<float>(tile_ws, dot16 ? 0 : static_cast<size_t>(D) * lanes);
    float* q_rows = tile_buffer<float>(tile_ws, !dot16 && q.dtype != DType::f32 ? static_cast<size_t>(D) * lanes : 0);
    uint32_t* qt_pairs = tile_buffer<uint32_t>(tile_ws, dot16 ? static_cast<size_t>(D / 2) * lanes : 0);
    float* scratch = tile_buffer<float>(tile_ws, static_cast<size_t>(cpu::forward_scratch_floats(tk, D)));
    std::vector<int64_t> lane_data(3 * static_cast<size_t>(lanes));
    std::vector<int32_t> candidates;
    std::vector<std::pair<size_t, size_t>> ranges;
    std::vector<KeyBlockRef> refs;
    const bool main_thread = omp_get_thread_num() == 0;

    // Head-major order: consecutive items share one head's K/V, which then stays in cache
    // (tile-major order cycles through every head's K/V and streams them from memory).
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      if (main_thread && options.progress) options.progress();
      const int64_t ntiles = static_cast<int64_t>(qtiles.size());
      const int64_t b = item / (H * ntiles);
      const int64_t h = (item / ntiles) % H;
      const RowSpan& tile = qtiles[static_cast<size_t>(item % ntiles)];
      const PosRange first = key_range(mask, q.pos[tile.row0]);
      const PosRange last = key_range(mask, q.pos[tile.row0 + tile.count - 1]);
      candidate_key_blocks(mask, PosRange{first.lo, last.hi}, tile.pmin, tile.pmax, kblocks, ranges, candidates);
      refs.clear();
      for (int32_t kb : candidates) {
        const TileKind kind = classify_tile(mask, tile, kblocks[kb]);
        if (kind != TileKind::empty)
          refs.push_back(KeyBlockRef{kblocks[kb].row0, static_cast<int32_t>(kblocks[kb].count), kind, kb});
      }
      if (refs.empty()) continue;  // these queries see none of these keys: state unchanged
      lane_masks(mask, q.pos, tile, lanes, lane_data.data(), lane_data.data() + lanes, lane_data.data() + 2 * lanes);

      const int64_t qrow = (b * q.rows + tile.row0) * H + h;  // row index in (B*rows*H) units
      const int64_t kvh = h / group;
      const int64_t kv_offset = packed.offset(b, kvh, Hkv);
      ForwardTileArgs args{};
      if (dot16) {
        pack_pairs(q.data, qrow * D, H * D, tile.count, D, lanes, qt_pairs);
        args.qt_pairs = qt_pairs;
        args.k16 = packed.k16 + kv_offset;
        args.score_scale = qscale;
      } else {
        cpu::pack_lanes_from(tk.pack_lanes, q.data, q.dtype, qrow * D, H * D, tile.count, D, qscale, q_rows, qt,
                             lanes);
        args.qt = qt;
        args.k = packed.k + kv_offset;
      }
      args.head_dim = D;
      args.nq = tile.count;
      const int64_t vt_offset = (b * Hkv + kvh) * static_cast<int64_t>(kblocks.size()) * D * key_block;
      if (tiles16)
        args.vt16 = vt16 + vt_offset;
      else
        args.vt = vt + vt_offset;
      args.kv_stride = D;
      args.blocks = refs.data();
      args.num_blocks = static_cast<int>(refs.size());
      args.mask = cpu::LaneMask{lane_data.data(), lane_data.data() + lanes, lane_data.data() + 2 * lanes, kv.pos,
                                mask.block_mask, mask.block_count, mask.mask_block};
      args.o = state.o + qrow * D;
      args.o_stride = H * D;
      args.lse = state.lse + (b * H + h) * q.rows + tile.row0;
      args.scratch = scratch;
      tk.forward_tile(args);
    }
  }
}

void merge_states(const AttentionDims& dims, int64_t rows, const AttentionState& dst, const float* src_o,
                  const float* src_lse) {
  const int64_t B = dims.batch, H = dims.heads, D = dims.head_dim;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < rows; ++i) {
        float& l1 = dst.lse[(b * H + h) * rows + i];
        const float l2 = src_lse[(b * H + h) * rows + i];
        const float m = std::max(l1, l2);
        if (m == -kInf) continue;  // neither side saw a key
        const float w1 = std::exp(l1 - m), w2 = std::exp(l2 - m), sum = w1 + w2;
        float* o1 = dst.o + ((b * rows + i) * H + h) * D;
        const float* o2 = src_o + ((b * rows + i) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) o1[d] = (o1[d] * w1 + o2[d] * w2) / sum;
        l1 = m + std::log(sum);
      }
}

void attention_delta(const AttentionDims& dims, int64_t rows, const float* o, const void* dout, DType dout_dtype,
                     float* delta) {
  const int64_t B = dims.batch, H = dims.heads, D = dims.head_dim;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * rows + i) * H + h) * D;
        double sum = 0.0;
        for (int64_t d = 0; d < D; ++d) sum += double(o[base + d]) * element(dout, dout_dtype, base + d);
        delta[(b * H + h) * rows + i] = static_cast<float>(sum);
      }
}

void attention_backward(const AttentionDims& dims, const QueryRows& q, const KeyValueRows& kv, const void* dout,
                        const float* lse, const float* delta, float* dq, float* dk, float* dv, const MaskView& mask,
                        const CpuOptions& options) {
  check_dims(dims);
  if (q.rows == 0 || kv.rows == 0) return;
  const TileKernels& tk = cpu::selected_tile_kernels();
  const int lanes = tk.query_tile;
  const int D = static_cast<int>(dims.head_dim);
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, group = H / Hkv;
  const std::vector<RowSpan> qtiles = make_row_blocks(q.pos, q.rows, lanes);
  // One work item per (key block, batch, kv head). The ISA's larger backward block where that
  // still leaves many items (64: parallel work for as many threads as a rank has cores), else the
  // forward's. Chosen from the shape alone, so results never depend on the thread count.
  const int64_t wide_items = (kv.rows + tk.backward_key_block - 1) / tk.backward_key_block * B * Hkv;
  const int key_block = wide_items >= kMinBackwardItems ? tk.backward_key_block : tk.key_block;
  const std::vector<RowSpan> kblocks = make_row_blocks(kv.pos, kv.rows, key_block);
  const int threads = thread_count(options);
  // bf16 inputs on an ISA with a bf16 dot product: all five products take bf16 operands with
  // fp32 sums, P and dS rounded to bf16 (FlashAttention-2's bf16 backward); no fp32 K/V copies.
  // (On AMX the same operands, on the tiles.)
  const bool dot16 = (tk.bf16_dot || tk.amx) && q.dtype == DType::bf16 && kv.dtype == DType::bf16;
  cpu::Workspace workspace;
  const PackedKeyValues packed =
      pack_key_values(dims, kv, PackRequest{!dot16, !dot16, dot16, dot16}, threads, workspace);
  // dK/dV accumulate head-major like K/V (contiguous rows per head), added to the output at the
  // end; with one K/V head the output is head-major itself and takes them directly.
  const bool dkv_in_place = Hkv == 1;
  const size_t kv_elems = dkv_in_place ? 0 : static_cast<size_t>(B * Hkv * kv.rows * D);
  float* dk_packed = workspace.take<float>(kv_elems);
  float* dv_packed = workspace.take<float>(kv_elems);
  std::fill_n(dk_packed, kv_elems, 0.0f);
  std::fill_n(dv_packed, kv_elems, 0.0f);
  float* dk_rows = dkv_in_place ? dk : dk_packed;
  float* dv_rows = dkv_in_place ? dv : dv_packed;
  const float qscale = dims.scale * kLog2e;

  // Query tiles are processed in super-tiles; each thread accumulates the dQ of the blocks it
  // owns into a private buffer covering one super-tile (bounded memory), reduced in thread order
  // so that results do not depend on scheduling. dK/dV rows belong to one key-block item each.
  const int64_t slot_floats = int64_t(D) * lanes;
  const int64_t budget_tiles = std::max<int64_t>(1, (int64_t{4} << 20) / (4 * slot_floats * B * H));
  const int64_t ntiles = static_cast<int64_t>(qtiles.size());
  const int64_t super_tiles = std::min(budget_tiles, ntiles);
  const int64_t slots = super_tiles * B * H;  // (tile in super-tile, b, h)

  const size_t f32_slots = dot16 ? 0 : static_cast<size_t>(slots * slot_floats);
  float* qt_all = workspace.take<float>(f32_slots);
  float* dot_all = workspace.take<float>(f32_slots);
  const int64_t slot_pairs = int64_t(D / 2) * lanes;
  const size_t pair_slots = dot16 ? static_cast<size_t>(slots * slot_pairs) : 0;
  uint32_t* qt_pairs_all = workspace.take<uint32_t>(pair_slots);
  uint32_t* dot_pairs_all = workspace.take<uint32_t>(pair_slots);
  // Q and dO rows of each slot for the dK/dV products: compact fp32 rows (row stride D), or on the
  // bf16 path pairs of consecutive rows [lanes/2][D].
  float* natural = workspace.take<float>(2 * f32_slots);
  uint32_t* row_pairs_all = workspace.take<uint32_t>(2 * pair_slots);
  float* lane_stats = workspace.take<float>(static_cast<size_t>(2 * slots * lanes));  // lse2, delta
  std::vector<int64_t> lane_data(static_cast<size_t>(3 * super_tiles * lanes));
  // Each thread's dQ partials of the super-tile, [thread][slot][D][lanes].
  float* dq_partial = workspace.take<float>(static_cast<size_t>(threads * slots * slot_floats));
  // Sized here, not by each thread: OpenMP may start fewer threads than asked (OMP_DYNAMIC, a
  // caller's own parallel region), and the reduction below must then read "untouched".
  std::vector<std::vector<uint8_t>> touched(static_cast<size_t>(threads), std::vector<uint8_t>(static_cast<size_t>(slots), 0));
  std::vector<int32_t> item_blocks;
  std::vector<std::pair<size_t, size_t>> ranges;

#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num();
    cpu::Workspace tile_ws;
    float* scratch = tile_buffer<float>(tile_ws, static_cast<size_t>(cpu::backward_scratch_floats(tk, D)));
    std::vector<BackwardTileRef> refs;
    float* my_dq = dq_partial + tid * slots * slot_floats;
    std::vector<uint8_t>& my_touched = touched[static_cast<size_t>(tid)];

    for (int64_t t0 = 0; t0 < ntiles; t0 += super_tiles) {
      const int64_t nt = std::min(super_tiles, ntiles - t0);
      // 1. Pack the super-tile's queries and output gradients once for every key block.
#pragma omp for schedule(static)
      for (int64_t s = 0; s < nt * B * H; ++s) {
        const int64_t tl = s / (B * H), b = (s / H) % B, h = s % H;
        const RowSpan& tile = qtiles[static_cast<size_t>(t0 + tl)];
        const int64_t qrow = (b * q.rows + tile.row0) * H + h;
        if (dot16) {
          pack_pairs(q.data, qrow * D, H * D, tile.count, D, lanes, &qt_pairs_all[s * slot_pairs]);
          pack_pairs(dout, qrow * D, H * D, tile.count, D, lanes, &dot_pairs_all[s * slot_pairs]);
          uint32_t* qp = &row_pairs_all[2 * s * slot_pairs];
          cpu::pack_row_pairs(q.data, qrow * D, H * D, tile.count, D, lanes, qp);
          cpu::pack_row_pairs(dout, qrow * D, H * D, tile.count, D, lanes, qp + slot_pairs);
        } else {
          // The fp32 rows once (read from the source once), then their transposed lanes.
          float* nq = &natural[2 * s * slot_floats];
          float* ndo = nq + slot_floats;
          cpu::pack_rows(q.data, q.dtype, qrow * D, H * D, tile.count, D, nq);
          cpu::pack_rows(dout, q.dtype, qrow * D, H * D, tile.count, D, ndo);
          tk.pack_lanes(nq, D, tile.count, D, qscale, &qt_all[s * slot_floats], lanes);
          tk.pack_lanes(ndo, D, tile.count, D, 1.0f, &dot_all[s * slot_floats], lanes);
        }
        float* lse2 = &lane_stats[2 * s * lanes];
        float* dl = lse2 + lanes;
        for (int i = 0; i < lanes; ++i) {
          const bool valid = i < tile.count;
          const float l = valid ? lse[(b * H + h) * q.rows + tile.row0 + i] : -kInf;
          lse2[i] = l == -kInf ? kInf : l * kLog2e;  // rows that saw no key get P = 0
          dl[i] = valid ? delta[(b * H + h) * q.rows + tile.row0 + i] : 0.0f;
        }
        if (b == 0 && h == 0) {
          int64_t* ld = &lane_data[3 * tl * lanes];
          lane_masks(mask, q.pos, tile, lanes, ld, ld + lanes, ld + 2 * lanes);
        }
      }
#pragma omp single
      {
        const RowSpan& first_tile = qtiles[static_cast<size_t>(t0)];
        const RowSpan& last_tile = qtiles[static_cast<size_t>(t0 + nt - 1)];
        const PosRange span{key_range(mask, q.pos[first_tile.row0]).lo,
                            key_range(mask, q.pos[last_tile.row0 + last_tile.count - 1]).hi};
        candidate_key_blocks(mask, span, first_tile.pmin, last_tile.pmax, kblocks, ranges, item_blocks);
      }
      std::fill(my_touched.begin(), my_touched.end(), 0);

      // 2. One item per (key block, batch, kv head): owns its dK/dV rows for this super-tile.
      const int64_t nitems = static_cast<int64_t>(item_blocks.size()) * B * Hkv;
#pragma omp for schedule(static, 1)
      for (int64_t item = 0; item < nitems; ++item) {
        if (tid == 0 && options.progress) options.progress();
        const RowSpan& kb = kblocks[static_cast<size_t>(item_blocks[static_cast<size_t>(item / (B * Hkv))])];
        const int64_t b = (item / Hkv) % B, kvh = item % Hkv;
        refs.clear();
        for (int64_t tl = 0; tl < nt; ++tl) {
          const RowSpan& tile = qtiles[static_cast<size_t>(t0 + tl)];
          const TileKind kind = classify_tile(mask, tile, kb);
          if (kind == TileKind::empty) continue;
          const int64_t* ld = &lane_data[3 * tl * lanes];
          for (int64_t g = 0; g < group; ++g) {
            const int64_t h = kvh * group + g;
            const int64_t s = (tl * B + b) * H + h;
            float* dqt = &my_dq[s * slot_floats];
            if (!my_touched[s]) {
              std::fill(dqt, dqt + slot_floats, 0.0f);
              my_touched[s] = 1;
            }
            BackwardTileRef ref{};
            ref.nq = tile.count;
            ref.kind = kind;
            if (dot16) {
              ref.qt_pairs = &qt_pairs_all[s * slot_pairs];
              ref.dot_pairs = &dot_pairs_all[s * slot_pairs];
              ref.q_row_pairs = &row_pairs_all[2 * s * slot_pairs];
              ref.dout_row_pairs = ref.q_row_pairs + slot_pairs;
            } else {
              ref.qt = &qt_all[s * slot_floats];
              ref.dot = &dot_all[s * slot_floats];
              ref.q = &natural[2 * s * slot_floats];
              ref.dout = ref.q + slot_floats;
              ref.q_stride = ref.dout_stride = D;
            }
            ref.lse2 = &lane_stats[2 * s * lanes];
            ref.delta = ref.lse2 + lanes;
            ref.lane_lo = ld;
            ref.lane_hi = ld + lanes;
            ref.lane_brow = ld + 2 * lanes;
            ref.dqt = dqt;
            refs.push_back(ref);
          }
        }
        if (refs.empty()) continue;
        const int64_t krow = (b * Hkv + kvh) * kv.rows + kb.row0;  // head-major row
        BackwardBlockArgs args{};
        args.head_dim = D;
        args.scale = dims.scale;
        args.nk = kb.count;
        if (dot16) {
          args.k16 = packed.k16 + krow * D;
          args.v16 = packed.v16 + krow * D;
          args.score_scale = qscale;
        } else {
          args.k = packed.k + krow * D;
          args.v = packed.v + krow * D;
        }
        args.kv_stride = D;
        args.k_pos = kv.pos + kb.row0;
        args.dk = dk_rows + krow * D;
        args.dv = dv_rows + krow * D;
        args.dkv_stride = D;
        args.tiles = refs.data();
        args.num_tiles = static_cast<int>(refs.size());
        args.block_mask = mask.block_mask;
        args.block_count = mask.block_count;
        args.mask_block = mask.mask_block;
        args.scratch = scratch;
        tk.backward_block(args);
      }

      // 3. dQ += sum over threads, in thread order.
#pragma omp for schedule(static)
      for (int64_t s = 0; s < nt * B * H; ++s) {
        const int64_t tl = s / (B * H), b = (s / H) % B, h = s % H;
        const RowSpan& tile = qtiles[static_cast<size_t>(t0 + tl)];
        float* out = dq + ((b * q.rows + tile.row0) * H + h) * D;
        for (int th = 0; th < threads; ++th) {
          if (!touched[static_cast<size_t>(th)][s]) continue;
          tk.add_lanes_to_rows(&dq_partial[(th * slots + s) * slot_floats], tile.count, D, out, H * D);
        }
      }
    }

    // 4. dK, dV back to the (B, rows, Hkv, D) layout of the caller, added to what it holds
    // (every thread takes the same branch, as a worksharing loop requires).
    if (!dkv_in_place)
#pragma omp for collapse(2) schedule(static)
      for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < kv.rows; ++j)
        for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
          const int64_t dst = ((b * kv.rows + j) * Hkv + kvh) * D;
          const int64_t src = ((b * Hkv + kvh) * kv.rows + j) * D;
          for (int d = 0; d < D; ++d) {
            dk[dst + d] += dk_packed[src + d];
            dv[dst + d] += dv_packed[src + d];
          }
        }
  }
}

void release_cpu_workspace_cache() { cpu::release_cached_workspace(); }

}  // namespace ringattn::kernels
