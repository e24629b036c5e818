// The generic half of the CPU kernels: which tiles meet which blocks (planned from the mask
// before any arithmetic), threading, packing, and the choice of instruction set. The
// arithmetic itself is in attention_tiles.inl, compiled once per ISA.
#include "kernels/attention_cpu.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/tile_args.hpp"

namespace ringattn::kernels {
namespace cpu {
#if defined(RINGATTN_X86_ISAS)
namespace avx512 { TileKernels tile_kernels(); }
namespace avx512bf16 { TileKernels tile_kernels(); }
namespace avx2 { TileKernels tile_kernels(); }
#endif
namespace scalar { TileKernels tile_kernels(); }
}  // namespace cpu

namespace {

using cpu::BackwardBlockArgs;
using cpu::BackwardTileRef;
using cpu::ForwardTileArgs;
using cpu::KeyBlockRef;
using cpu::TileKernels;

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kInf = std::numeric_limits<float>::infinity();

TileKernels choose_kernels() {
  const char* forced = std::getenv("RINGATTN_ISA");
  const std::string want = forced ? forced : "";
#if defined(RINGATTN_X86_ISAS)
  const bool has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool has_avx512bf16 = has_avx512 && __builtin_cpu_supports("avx512bf16");
  const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (want.empty()) {
    if (has_avx512bf16) return cpu::avx512bf16::tile_kernels();
    if (has_avx512) return cpu::avx512::tile_kernels();
    return has_avx2 ? cpu::avx2::tile_kernels() : cpu::scalar::tile_kernels();
  }
  if (want == "avx512bf16" && has_avx512bf16) return cpu::avx512bf16::tile_kernels();
  if (want == "avx512" && has_avx512) return cpu::avx512::tile_kernels();
  if (want == "avx2" && has_avx2) return cpu::avx2::tile_kernels();
#else
  if (want.empty()) return cpu::scalar::tile_kernels();
#endif
  if (want == "scalar") return cpu::scalar::tile_kernels();
  throw std::invalid_argument("RINGATTN_ISA=" + want +
                              ": not one of avx512bf16, avx512, avx2, scalar, or not supported by this CPU");
}

const TileKernels& kernels() {
  static const TileKernels k = choose_kernels();
  return k;
}

// A run of consecutive rows processed together (a query tile or a key block).
struct RowBlock {
  int64_t row0;
  int32_t count;
  int64_t pmin;
  int64_t pmax;
};

// Splits rows (positions strictly increasing) into blocks of at most `block` rows. A block holds
// an arithmetic progression of positions; contiguous blocks start at multiples of `block`, so
// that tiles line up with the mask's blocks and with each other across ranks.
std::vector<RowBlock> make_row_blocks(const int64_t* pos, int64_t rows, int block) {
  std::vector<RowBlock> out;
  int64_t j = 0;
  while (j < rows) {
    int64_t k = j + 1;
    int64_t stride = 0;
    while (k < rows && k - j < block) {
      const int64_t step = pos[k] - pos[k - 1];
      if (stride == 0) stride = step;
      else if (step != stride) break;
      if (stride == 1 && pos[k] % block == 0) break;
      ++k;
    }
    out.push_back(RowBlock{j, static_cast<int32_t>(k - j), pos[j], pos[k - 1]});
    j = k;
  }
  return out;
}

// Indices of the blocks whose positions meet [lo, hi].
std::pair<size_t, size_t> blocks_meeting(const std::vector<RowBlock>& blocks, int64_t lo, int64_t hi) {
  auto first = std::partition_point(blocks.begin(), blocks.end(), [&](const RowBlock& b) { return b.pmax < lo; });
  auto last = std::partition_point(first, blocks.end(), [&](const RowBlock& b) { return b.pmin <= hi; });
  return {static_cast<size_t>(first - blocks.begin()), static_cast<size_t>(last - blocks.begin())};
}

// Key blocks that queries with positions in [qmin, qmax] may see: those meeting the union of the
// queries' key ranges, and, with a block-mask index, only those under nonzero mask blocks of the
// queries' mask rows. Ascending, without duplicates. Classification happens afterwards.
void candidate_key_blocks(const MaskView& m, PosRange span, int64_t qmin, int64_t qmax,
                          const std::vector<RowBlock>& kblocks, std::vector<std::pair<size_t, size_t>>& ranges,
                          std::vector<int32_t>& out) {
  out.clear();
  if (span.empty()) return;
  ranges.clear();
  if (m.has_block_mask() && m.row_run_ptr) {
    const int64_t n = m.mask_block;
    for (int64_t br = qmin / n; br <= qmax / n; ++br) {
      for (int64_t r = m.row_run_ptr[br]; r < m.row_run_ptr[br + 1]; ++r) {
        const int64_t a = std::max(span.lo, int64_t{m.row_runs[2 * r]} * n);
        const int64_t b = std::min(span.hi, int64_t{m.row_runs[2 * r + 1]} * n - 1);
        if (a > b) continue;
        auto range = blocks_meeting(kblocks, a, b);
        if (range.first < range.second) ranges.push_back(range);
      }
    }
    std::sort(ranges.begin(), ranges.end());
  } else {
    auto range = blocks_meeting(kblocks, span.lo, span.hi);
    if (range.first < range.second) ranges.push_back(range);
  }
  size_t next = 0;
  for (const auto& [first, last] : ranges) {
    for (size_t kb = std::max(first, next); kb < last; ++kb) out.push_back(static_cast<int32_t>(kb));
    next = std::max(next, last);
  }
}

TileKind classify(const MaskView& m, const int64_t* qpos, const RowBlock& qt, const RowBlock& kb) {
  const PosRange first = key_range(m, qpos[qt.row0]);
  const PosRange last = key_range(m, qpos[qt.row0 + qt.count - 1]);
  const TileKind by_interval = classify_intervals(first, last, kb.pmin, kb.pmax);
  if (by_interval == TileKind::empty) return by_interval;
  return combine(by_interval, classify_block_mask(m, qt.pmin, qt.pmax, kb.pmin, kb.pmax));
}

// Per-lane key ranges (and mask rows) of a query tile; padded lanes see nothing.
void lane_masks(const MaskView& m, const int64_t* qpos, const RowBlock& qt, int lanes, int64_t* lo, int64_t* hi,
                int64_t* brow) {
  for (int i = 0; i < lanes; ++i) {
    if (i < qt.count) {
      const int64_t p = qpos[qt.row0 + i];
      const PosRange r = key_range(m, p);
      lo[i] = r.lo;
      hi[i] = r.hi;
      brow[i] = m.has_block_mask() ? p / m.mask_block : 0;
    } else {
      lo[i] = kFarAway;
      hi[i] = -1;
      brow[i] = 0;
    }
  }
}

inline float element(const void* base, DType dtype, int64_t index) {
  return dtype == DType::f32 ? static_cast<const float*>(base)[index]
                             : bf16_to_float(static_cast<const bf16_bits*>(base)[index]);
}

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

// K and V of one call in head-major order [b][kv head][row][d]: fp32 for the fp32 arithmetic,
// and (bf16 inputs on an ISA with a bf16 dot product) bf16 for the products that take bf16
// pairs. Packing once per call costs O(rows) next to O(rows_q * rows) of arithmetic, and keeps
// each head's rows contiguous: in the (B, rows, Hkv, D) input, consecutive rows of one head are
// Hkv*D elements apart, often a whole page, and streaming a block of them thrashes the TLB
// (measured: 2.5x slower at Hkv = 8).
struct PackedKeyValues {
  // Head-major rows: the caller's arrays themselves when their layout already is head-major
  // (a single K/V head, as in MQA) and their type is the one asked for; else copies.
  const float* k = nullptr;
  const float* v = nullptr;
  const bf16_bits* k16 = nullptr;
  const bf16_bits* v16 = nullptr;
  std::vector<float> k_copy, v_copy;
  std::vector<bf16_bits> k16_copy, v16_copy;
  int64_t rows = 0, head_dim = 0;
  int64_t offset(int64_t b, int64_t kvh, int64_t kv_heads) const { return ((b * kv_heads + kvh) * rows) * head_dim; }
};

struct PackRequest {
  bool k32 = false, v32 = false, k16 = false, v16 = false;
};

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

const char* cpu_isa() { return kernels().name; }
int cpu_query_tile() { return kernels().query_tile; }
int cpu_key_block() { return kernels().key_block; }
double measure_fma_peak_gflops(int threads, double seconds) {
  const TileKernels& tk = kernels();
  // Calibrate the iteration count on one thread, then run every thread at once.
  int64_t iters = 1 << 16;
  double elapsed = 0.0;
  float sink = 0.0f;
  for (;;) {
    const double t0 = omp_get_wtime();
    sink += tk.fma_loop(iters, 1.0f);
    elapsed = omp_get_wtime() - t0;
    if (elapsed > seconds / 4 || iters > (int64_t{1} << 40)) break;
    iters *= 4;
  }
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    double t0 = 0.0, t1 = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
#pragma omp barrier
#pragma omp single
      t0 = omp_get_wtime();
      sink += tk.fma_loop(iters, float(omp_get_thread_num()));
#pragma omp barrier
#pragma omp single
      t1 = omp_get_wtime();
    }
    best = std::max(best, double(iters) * tk.fma_flops_per_iter * threads / (t1 - t0) / 1e9);
  }
  volatile float observed = sink;  // keeps the loops from being optimised away
  (void)observed;
  return best;
}

bool cpu_supports_head_dim(int64_t head_dim) { return head_dim > 0 && head_dim <= 512 && head_dim % 16 == 0; }

void attention_forward(const AttentionDims& dims, const QueryRows& q, const KeyValueRows& kv, const MaskView& mask,
                       const AttentionState& state, const CpuOptions& options) {
  check_dims(dims);
  if (q.rows == 0 || kv.rows == 0) return;
  const TileKernels& tk = kernels();
  const int lanes = tk.query_tile;
  const int D = static_cast<int>(dims.head_dim);
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, group = H / Hkv;
  const std::vector<RowBlock> qtiles = make_row_blocks(q.pos, q.rows, lanes);
  const std::vector<RowBlock> kblocks = make_row_blocks(kv.pos, kv.rows, tk.key_block);
  const int threads = thread_count(options);
  // bf16 inputs on an ISA with a bf16 dot product: scores from bf16 pairs, the rest in fp32.
  const bool dot16 = tk.bf16_dot && q.dtype == DType::bf16 && kv.dtype == DType::bf16;
  const PackedKeyValues packed = pack_key_values(dims, kv, PackRequest{!dot16, true, dot16, false}, threads);
  const int64_t items = static_cast<int64_t>(qtiles.size()) * B * H;
  const float qscale = dims.scale * kLog2e;

#pragma omp parallel num_threads(threads)
  {
    std::vector<float> qt(dot16 ? 0 : static_cast<size_t>(D) * lanes);
    std::vector<uint32_t> qt_pairs(dot16 ? static_cast<size_t>(D / 2) * lanes : 0);
    std::vector<float> scratch(static_cast<size_t>(cpu::forward_scratch_floats(tk, D)));
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
      const RowBlock& tile = qtiles[static_cast<size_t>(item % ntiles)];
      const PosRange first = key_range(mask, q.pos[tile.row0]);
      const PosRange last = key_range(mask, q.pos[tile.row0 + tile.count - 1]);
      candidate_key_blocks(mask, PosRange{first.lo, last.hi}, tile.pmin, tile.pmax, kblocks, ranges, candidates);
      refs.clear();
      for (int32_t kb : candidates) {
        const TileKind kind = classify(mask, q.pos, tile, kblocks[kb]);
        if (kind != TileKind::empty) refs.push_back(KeyBlockRef{kblocks[kb].row0, kblocks[kb].count, kind});
      }
      if (refs.empty()) continue;  // these queries see none of these keys: state unchanged
      lane_masks(mask, q.pos, tile, lanes, lane_data.data(), lane_data.data() + lanes, lane_data.data() + 2 * lanes);

      const int64_t qrow = (b * q.rows + tile.row0) * H + h;  // row index in (B*rows*H) units
      const int64_t kvh = h / group;
      const int64_t kv_offset = packed.offset(b, kvh, Hkv);
      ForwardTileArgs args{};
      if (dot16) {
        pack_pairs(q.data, qrow * D, H * D, tile.count, D, lanes, qt_pairs.data());
        args.qt_pairs = qt_pairs.data();
        args.k16 = packed.k16 + kv_offset;
        args.score_scale = qscale;
      } else {
        pack_transposed(q.data, q.dtype, qrow * D, H * D, tile.count, D, lanes, qscale, qt.data());
        args.qt = qt.data();
        args.k = packed.k + kv_offset;
      }
      args.head_dim = D;
      args.nq = tile.count;
      args.v = packed.v + kv_offset;
      args.kv_stride = D;
      args.blocks = refs.data();
      args.num_blocks = static_cast<int>(refs.size());
      args.mask = cpu::LaneMask{lane_data.data(), lane_data.data() + lanes, lane_data.data() + 2 * lanes, kv.pos,
                                mask.block_mask, mask.block_count, mask.mask_block};
      args.o = state.o + qrow * D;
      args.o_stride = H * D;
      args.lse = state.lse + (b * H + h) * q.rows + tile.row0;
      args.scratch = scratch.data();
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
  const TileKernels& tk = kernels();
  const int lanes = tk.query_tile;
  const int D = static_cast<int>(dims.head_dim);
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, group = H / Hkv;
  const std::vector<RowBlock> qtiles = make_row_blocks(q.pos, q.rows, lanes);
  const std::vector<RowBlock> kblocks = make_row_blocks(kv.pos, kv.rows, tk.key_block);
  const int threads = thread_count(options);
  // bf16 inputs on an ISA with a bf16 dot product: S = Q K^T and dP = dO V^T from bf16 pairs;
  // dV, dK and dQ (products with P and dS) in fp32.
  const bool dot16 = tk.bf16_dot && q.dtype == DType::bf16 && kv.dtype == DType::bf16;
  const PackedKeyValues packed = pack_key_values(dims, kv, PackRequest{true, !dot16, dot16, dot16}, threads);
  // dK/dV accumulate head-major like K/V (contiguous rows per head), added to the output at the
  // end; with one K/V head the output is head-major itself and takes them directly.
  const bool dkv_in_place = Hkv == 1;
  const size_t kv_elems = dkv_in_place ? 0 : static_cast<size_t>(B * Hkv * kv.rows * D);
  std::vector<float> dk_packed(kv_elems, 0.0f), dv_packed(kv_elems, 0.0f);
  float* dk_rows = dkv_in_place ? dk : dk_packed.data();
  float* dv_rows = dkv_in_place ? dv : dv_packed.data();
  const float qscale = dims.scale * kLog2e;

  // Query tiles are processed in super-tiles; each thread accumulates the dQ of the blocks it
  // owns into a private buffer covering one super-tile (bounded memory), reduced in thread order
  // so that results do not depend on scheduling. dK/dV rows belong to one key-block item each.
  const int64_t slot_floats = int64_t(D) * lanes;
  const int64_t budget_tiles = std::max<int64_t>(1, (int64_t{4} << 20) / (4 * slot_floats * B * H));
  const int64_t ntiles = static_cast<int64_t>(qtiles.size());
  const int64_t super_tiles = std::min(budget_tiles, ntiles);
  const int64_t slots = super_tiles * B * H;  // (tile in super-tile, b, h)

  std::vector<float> qt_all(dot16 ? 0 : static_cast<size_t>(slots * slot_floats));
  std::vector<float> dot_all(dot16 ? 0 : static_cast<size_t>(slots * slot_floats));
  const int64_t slot_pairs = int64_t(D / 2) * lanes;
  std::vector<uint32_t> qt_pairs_all(dot16 ? static_cast<size_t>(slots * slot_pairs) : 0);
  std::vector<uint32_t> dot_pairs_all(dot16 ? static_cast<size_t>(slots * slot_pairs) : 0);
  // Q and dO rows of each slot, compact (row stride D) and fp32, for the dK/dV products.
  std::vector<float> natural(static_cast<size_t>(2 * slots * slot_floats));
  std::vector<float> lane_stats(static_cast<size_t>(2 * slots * lanes));  // lse2, delta
  std::vector<int64_t> lane_data(static_cast<size_t>(3 * super_tiles * lanes));
  std::vector<std::vector<float>> dq_partial(static_cast<size_t>(threads));
  std::vector<std::vector<uint8_t>> touched(static_cast<size_t>(threads));
  std::vector<int32_t> item_blocks;
  std::vector<std::pair<size_t, size_t>> ranges;

#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num();
    std::vector<float> scratch(static_cast<size_t>(cpu::backward_scratch_floats(tk)));
    std::vector<BackwardTileRef> refs;
    std::vector<float>& my_dq = dq_partial[static_cast<size_t>(tid)];
    std::vector<uint8_t>& my_touched = touched[static_cast<size_t>(tid)];
    my_dq.resize(static_cast<size_t>(slots * slot_floats));
    my_touched.assign(static_cast<size_t>(slots), 0);

    for (int64_t t0 = 0; t0 < ntiles; t0 += super_tiles) {
      const int64_t nt = std::min(super_tiles, ntiles - t0);
      // 1. Pack the super-tile's queries and output gradients once for every key block.
#pragma omp for schedule(static)
      for (int64_t s = 0; s < nt * B * H; ++s) {
        const int64_t tl = s / (B * H), b = (s / H) % B, h = s % H;
        const RowBlock& tile = qtiles[static_cast<size_t>(t0 + tl)];
        const int64_t qrow = (b * q.rows + tile.row0) * H + h;
        if (dot16) {
          pack_pairs(q.data, qrow * D, H * D, tile.count, D, lanes, &qt_pairs_all[s * slot_pairs]);
          pack_pairs(dout, qrow * D, H * D, tile.count, D, lanes, &dot_pairs_all[s * slot_pairs]);
        } else {
          pack_transposed(q.data, q.dtype, qrow * D, H * D, tile.count, D, lanes, qscale, &qt_all[s * slot_floats]);
          pack_transposed(dout, q.dtype, qrow * D, H * D, tile.count, D, lanes, 1.0f, &dot_all[s * slot_floats]);
        }
        float* nq = &natural[2 * s * slot_floats];
        float* ndo = nq + slot_floats;
        for (int i = 0; i < tile.count; ++i)
          for (int d = 0; d < D; ++d) {
            nq[i * D + d] = element(q.data, q.dtype, (qrow + i * H) * D + d);
            ndo[i * D + d] = element(dout, q.dtype, (qrow + i * H) * D + d);
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
        const RowBlock& first_tile = qtiles[static_cast<size_t>(t0)];
        const RowBlock& last_tile = qtiles[static_cast<size_t>(t0 + nt - 1)];
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
        const RowBlock& kb = kblocks[static_cast<size_t>(item_blocks[static_cast<size_t>(item / (B * Hkv))])];
        const int64_t b = (item / Hkv) % B, kvh = item % Hkv;
        refs.clear();
        for (int64_t tl = 0; tl < nt; ++tl) {
          const RowBlock& tile = qtiles[static_cast<size_t>(t0 + tl)];
          const TileKind kind = classify(mask, q.pos, tile, kb);
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
            } else {
              ref.qt = &qt_all[s * slot_floats];
              ref.dot = &dot_all[s * slot_floats];
            }
            ref.q = &natural[2 * s * slot_floats];
            ref.dout = ref.q + slot_floats;
            ref.q_stride = ref.dout_stride = D;
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
        args.k = packed.k + krow * D;
        if (dot16) {
          args.k16 = packed.k16 + krow * D;
          args.v16 = packed.v16 + krow * D;
          args.score_scale = qscale;
        } else {
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
        args.scratch = scratch.data();
        tk.backward_block(args);
      }

      // 3. dQ += sum over threads, in thread order.
#pragma omp for schedule(static)
      for (int64_t s = 0; s < nt * B * H; ++s) {
        const int64_t tl = s / (B * H), b = (s / H) % B, h = s % H;
        const RowBlock& tile = qtiles[static_cast<size_t>(t0 + tl)];
        float* out = dq + ((b * q.rows + tile.row0) * H + h) * D;
        for (int th = 0; th < threads; ++th) {
          if (!touched[static_cast<size_t>(th)][s]) continue;
          const float* part = &dq_partial[static_cast<size_t>(th)][s * slot_floats];
          for (int i = 0; i < tile.count; ++i)
            for (int d = 0; d < D; ++d) out[i * H * D + d] += part[d * lanes + i];
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

}  // namespace ringattn::kernels
