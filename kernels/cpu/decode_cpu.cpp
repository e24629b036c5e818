// The driver of the CPU decode kernel: the queries packed per key/value head, the visible rows
// found by position, the (head, row group, chunk) work items run on the threads and merged in
// chunk order. The arithmetic of one item is in decode_tiles.inl, compiled per ISA.
#include "kernels/cpu/decode_cpu.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cpu/dispatch.hpp"
#include "kernels/cpu/packing.hpp"
#include "kernels/cpu/tile_args.hpp"
#include "kernels/mask/mask.hpp"

namespace ringattn::kernels {

namespace {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
// The running max of a row that has seen no key (see decode_tiles.inl).
constexpr float kNoKeyMax = -3.402823466e38f;

int thread_count(const CpuOptions& options) { return options.threads > 0 ? options.threads : omp_get_max_threads(); }

// Many new tokens (a prefill chunk through pass-Q): each KV head's group runs through the forward
// kernel, whose query tiles reuse every cached K/V block across a tile's rows from cache, against
// its contiguous cached rows (a head-major cache is (rows, 1 head, D) to it). Q and O of the group
// are copied into (tokens, G, D) and back; LSE (H, tokens) is already per head.
void decode_through_forward(const AttentionDims& dims, const DecodeQueries& q, const CachedKeyValues& kv,
                            const VisibleRows& visible, int64_t window_left, const AttentionState& state,
                            const CpuOptions& options) {
  const int64_t H = dims.heads, Hkv = dims.kv_heads, G = H / Hkv, D = dims.head_dim, T = q.tokens;
  const size_t qb = size_t(dtype_bytes(q.dtype)), kb = size_t(dtype_bytes(kv.dtype)), group = size_t(G * D);
  Mask mask;
  mask.causal = true;
  mask.window_left = window_left;
  const MaskView view = mask.view();
  const AttentionDims per_head{1, G, 1, D, dims.scale};
  std::vector<char> qg(size_t(T) * group * qb);
  std::vector<float> og(size_t(T) * group);
  for (int64_t g = 0; g < Hkv; ++g) {
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(qg.data() + size_t(t) * group * qb,
                  static_cast<const char*>(q.q) + (size_t(t * H) * size_t(D) + size_t(g) * group) * qb, group * qb);
    std::fill(og.begin(), og.end(), 0.0f);  // an empty state: O = 0 (LSE is -inf already)
    const size_t first = size_t(g * kv.head_stride + visible.first) * size_t(D) * kb;
    const KeyValueRows rows{static_cast<const char*>(kv.k) + first, static_cast<const char*>(kv.v) + first, kv.dtype,
                            visible.last - visible.first, kv.pos + visible.first};
    attention_forward(per_head, QueryRows{qg.data(), q.dtype, T, q.pos}, rows, view,
                      AttentionState{og.data(), state.lse + g * G * T}, options);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(state.o + size_t(t * H) * size_t(D) + size_t(g) * group, og.data() + size_t(t) * group,
                  group * sizeof(float));
  }
}

}  // namespace

bool decode_runs_forward_kernel(int64_t tokens) {
  const int64_t tile = cpu_query_tile(), tiles = (tokens + tile - 1) / tile;
  return tokens * 8 >= tiles * tile * 7;
}

SamePrecision decode_same_precision(int64_t tokens, DType dtype) {
  return decode_runs_forward_kernel(tokens) ? cpu_same_precision(dtype) : SamePrecision::fp32();
}

VisibleRows decode_visible_rows(const DecodeQueries& q, const CachedKeyValues& kv, int64_t window_left) {
  if (q.tokens == 0 || kv.rows == 0) return {};
  const int64_t* begin = kv.pos;
  const int64_t* end = kv.pos + kv.rows;
  const int64_t q_first = q.pos[0], q_last = q.pos[q.tokens - 1];
  VisibleRows r;
  r.first = window_left < 0 ? 0 : std::lower_bound(begin, end, q_first - window_left) - begin;
  r.last = std::upper_bound(begin, end, q_last) - begin;
  return r;
}

uint64_t decode_bytes_read(const AttentionDims& dims, const CachedKeyValues& kv, int64_t window_left,
                           const DecodeQueries& q) {
  const VisibleRows r = decode_visible_rows(q, kv, window_left);
  if (r.empty()) return 0;
  return uint64_t(r.last - r.first) * uint64_t(dims.kv_heads * dims.head_dim * dtype_bytes(kv.dtype)) * 2;
}

void decode_forward(const AttentionDims& dims, const DecodeQueries& q, const CachedKeyValues& kv,
                    int64_t window_left, const AttentionState& state, const CpuOptions& options) {
  const int64_t H = dims.heads, Hkv = dims.kv_heads, G = H / Hkv, D = dims.head_dim, T = q.tokens;
  std::fill_n(state.o, T * H * D, 0.0f);
  std::fill_n(state.lse, H * T, -std::numeric_limits<float>::infinity());
  const VisibleRows visible = decode_visible_rows(q, kv, window_left);
  if (visible.empty()) return;
  if (decode_runs_forward_kernel(T)) return decode_through_forward(dims, q, kv, visible, window_left, state, options);

  // Row r of head g's tile is token r / G of query head g * G + r % G, scaled into log2 units.
  const int64_t rows_per_head = G * T;
  const int64_t groups = (rows_per_head + cpu::kDecodeMaxRows - 1) / cpu::kDecodeMaxRows;
  std::vector<float> qs(static_cast<size_t>(Hkv * rows_per_head * D));
  std::vector<int64_t> qpos(static_cast<size_t>(rows_per_head));
  const float qscale = dims.scale * kLog2e;
  for (int64_t g = 0; g < Hkv; ++g)
    for (int64_t r = 0; r < rows_per_head; ++r) {
      const int64_t t = r / G, h = g * G + r % G;
      for (int64_t d = 0; d < D; ++d)
        qs[size_t((g * rows_per_head + r) * D + d)] = cpu::element(q.q, q.dtype, (t * H + h) * D + d) * qscale;
    }
  for (int64_t r = 0; r < rows_per_head; ++r) qpos[size_t(r)] = q.pos[r / G];
  const cpu::TileKernels& tk = cpu::selected_tile_kernels();
  // bf16 K and Q on the bf16 dot product: Q's bf16 values as pairs, the scale applied to scores.
  std::vector<uint32_t> q_pairs;
  if (kv.dtype == DType::bf16 && q.dtype == DType::bf16 && tk.bf16_dot && D % (2 * tk.lanes) == 0) {
    q_pairs.resize(size_t(Hkv * rows_per_head * D / 2));
    const auto* q16 = static_cast<const bf16_bits*>(q.q);
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t r = 0; r < rows_per_head; ++r) {
        const bf16_bits* row = q16 + ((r / G) * H + g * G + r % G) * D;
        for (int64_t p = 0; p < D / 2; ++p)
          q_pairs[size_t((g * rows_per_head + r) * (D / 2) + p)] = uint32_t(row[2 * p]) | uint32_t(row[2 * p + 1]) << 16;
      }
  }

  const int64_t visible_rows = visible.last - visible.first;
  const int64_t chunks = (visible_rows + kDecodeChunkRows - 1) / kDecodeChunkRows;
  const int64_t items = Hkv * groups * chunks;
  // Item (g, group, chunk) at (g * groups + group) * chunks + chunk: its rows' acc [nq][D], m, l
  // (written by the item: not initialised here, it is one read of the cache's size / (D + 2)).
  const int64_t state_floats = std::min<int64_t>(cpu::kDecodeMaxRows, rows_per_head) * (D + 2);
  std::unique_ptr<float[]> partial(new float[size_t(items * state_floats)]);
  const size_t element_bytes = static_cast<size_t>(dtype_bytes(kv.dtype));
  const int threads = static_cast<int>(std::min<int64_t>(thread_count(options), items));
  const int64_t scratch_floats = cpu::decode_scratch_floats(static_cast<int>(D));
  std::unique_ptr<float[]> scratch(new float[size_t(threads * scratch_floats)]);  // not zero-filled: written before read

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t chunk = item % chunks, group = item / chunks % groups, g = item / chunks / groups;
    const int64_t r0 = group * cpu::kDecodeMaxRows;
    const int nq = static_cast<int>(std::min<int64_t>(cpu::kDecodeMaxRows, rows_per_head - r0));
    const int64_t j0 = visible.first + chunk * kDecodeChunkRows;
    const int64_t n = std::min(kDecodeChunkRows, visible.last - j0);
    float* acc = partial.get() + item * state_floats;
    float* m = acc + nq * D;
    float* l = m + nq;
    const size_t first = static_cast<size_t>((g * kv.head_stride + j0) * D) * element_bytes;
    cpu::DecodeBlockArgs a{static_cast<int>(D),
                           nq,
                           qs.data() + (g * rows_per_head + r0) * D,
                           qpos.data() + r0,
                           static_cast<const char*>(kv.k) + first,
                           static_cast<const char*>(kv.v) + first,
                           kv.dtype == DType::bf16,
                           kv.pos + j0,
                           n,
                           window_left,
                           acc,
                           m,
                           l,
                           scratch.get() + omp_get_thread_num() * scratch_floats,
                           q_pairs.empty() ? nullptr : q_pairs.data() + (g * rows_per_head + r0) * (D / 2),
                           qscale};
    tk.decode_block(a);
  }

  // The chunks of each (head, row group) merged in chunk order.
  for (int64_t g = 0; g < Hkv; ++g)
    for (int64_t group = 0; group < groups; ++group) {
      const int64_t r0 = group * cpu::kDecodeMaxRows;
      const int nq = static_cast<int>(std::min<int64_t>(cpu::kDecodeMaxRows, rows_per_head - r0));
      const float* first = partial.get() + (g * groups + group) * chunks * state_floats;
      for (int i = 0; i < nq; ++i) {
        float m_all = kNoKeyMax;
        for (int64_t c = 0; c < chunks; ++c) m_all = std::max(m_all, first[c * state_floats + nq * D + i]);
        double l_all = 0.0;
        std::vector<double> o(static_cast<size_t>(D), 0.0);
        for (int64_t c = 0; c < chunks; ++c) {
          const float* acc = first + c * state_floats;
          const float l = acc[nq * D + nq + i];
          if (l == 0.0f) continue;
          const double w = std::exp2(double(acc[nq * D + i]) - m_all);
          l_all += w * l;
          for (int64_t d = 0; d < D; ++d) o[size_t(d)] += w * acc[i * D + d];
        }
        if (l_all == 0.0) continue;  // no visible key: O = 0, LSE = -inf
        const int64_t r = r0 + i, t = r / G, h = g * G + r % G;
        float* out = state.o + (t * H + h) * D;
        for (int64_t d = 0; d < D; ++d) out[d] = static_cast<float>(o[size_t(d)] / l_all);
        state.lse[h * T + t] = (m_all + static_cast<float>(std::log2(l_all))) * kLn2;
      }
    }
}

ReadBandwidthProbe::ReadBandwidthProbe(int threads, size_t bytes)
    : threads_(std::max(1, threads)), buffer_(bytes / sizeof(float)) {
  const int64_t n = int64_t(buffer_.size()), part = (n + threads_ - 1) / threads_;
#pragma omp parallel for num_threads(threads_) schedule(static, 1)
  for (int t = 0; t < threads_; ++t)
    std::fill(buffer_.begin() + std::min(n, t * part), buffer_.begin() + std::min(n, (t + 1) * part), 1.0f);
}

double ReadBandwidthProbe::pass() {
  const cpu::TileKernels& tk = cpu::selected_tile_kernels();
  const int64_t n = int64_t(buffer_.size()), part = (n + threads_ - 1) / threads_;
  double t0 = 0.0, t1 = 0.0;
  float sink = 0.0f;
#pragma omp parallel num_threads(threads_) reduction(+ : sink)
  {
    const int64_t t = omp_get_thread_num(), first = std::min(n, t * part), last = std::min(n, (t + 1) * part);
#pragma omp barrier
#pragma omp single
    t0 = omp_get_wtime();
    sink += tk.read_loop(buffer_.data() + first, last - first);
#pragma omp barrier
#pragma omp single
    t1 = omp_get_wtime();
  }
  volatile float observed = sink;  // keeps the reads
  (void)observed;
  return double(n) * sizeof(float) / (t1 - t0);
}

}  // namespace ringattn::kernels
