// Tensor-core backward pass: FlashAttention-2's one pass over key blocks (recomputation from LSE
// and delta, 5 matrix products per tile pair), with dQ summed in a fixed order (deterministic).
//
// CTA = kWarps warps = one block of 16 * kWarps keys of one (kv head, batch); warp w owns keys
// 16w..16w+15 and keeps their dK, dV in registers (at D = 256 two CTAs share a key block, each
// with half of the columns). Per visible tile of kRows query rows (of every query head of the
// group, tile_pipeline.cuh's QueryTiles, double-buffered by cp.async):
//   S^T = K Q^T, dP^T = V dO^T                     (registers; rows = this warp's keys)
//   P^T = exp(S^T - LSE), dS^T = P^T (dP^T - delta) (dS^T also to shared memory, rounded)
//   dV += P^T dO, dK += dS^T Q                     (P^T, dS^T straight from registers)
//   dQ_part = dS K                                 (dS from shared memory; the warps split the
//                                                   tile's rows and columns)
// and dQ_part is added to dQ (fp32, global memory, atomic additions performed at L2) once the key
// block that visits the tile before this one has added its part (dq_order.cuh): the additions to
// each dQ element come in ascending key block order, so the result is bitwise reproducible,
// without an accumulator per key block. Every fragment comes from shared memory by ldmatrix
// (.trans for the k-major operands). Rows that saw no key (LSE = -inf) get P = 0.
#include <algorithm>
#include <optional>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/params.cuh"
#include "kernels/cuda/row_statistics.cuh"
#include "kernels/cuda/tensor_core_launch.cuh"
#include "kernels/cuda/tile_pipeline.cuh"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::gpu {
namespace {

// A tile shape: query rows per tile; the CTAs per multiprocessor the registers are allotted for
// (__launch_bounds__); the architecture family it is compiled for (0: every family;
// tensor_core_launch.cuh). Shared memory: K, V and key positions, the visibility words of a
// partial tile, dS^T, then the double-buffered query tiles.
template <int D, int kRows_, int kMinBlocks_, int kArch_>
struct BackwardShape {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kKeys = 16 * kWarps;  // keys per CTA
  static constexpr int kRows = kRows_;       // query rows per tile
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kArch = kArch_;
  // Columns of dK, dV and dQ one CTA accumulates: all, or at D = 256 half (two CTAs per key block,
  // each recomputing S and dP, whose accumulators for 256 columns would otherwise spill).
  static constexpr int kColumns = D <= 128 ? D : 128;
  static constexpr int kSplits = D / kColumns;
  // dQ_part = dS K: the warps split the tile into 16-row groups x column groups, each computed
  // in chunks of 32 (or 16) columns.
  static constexpr int kDqRowGroups = kRows / 16;
  static constexpr int kDqColumns = kColumns / (kWarps / kDqRowGroups);
  static constexpr int kDqChunk = kDqColumns % 32 == 0 ? 32 : 16;
  static constexpr int LD = D + 8;           // K, V, Q, dO rows (16 bytes of padding)
  static constexpr int kDsLd = kRows + 8;    // dS^T rows
  static constexpr int kWords = kKeys / 32;  // visibility words per query row
  using Queries = QueryTiles<D, kRows, kKeys, kThreads>;

  static_assert(kWarps % kDqRowGroups == 0 && kDqColumns % kDqChunk == 0, "dQ columns in whole chunks per warp");
  static_assert(kKeys % 32 == 0 && kRows % kWarps == 0, "whole visibility words, rows split over the warps");

  static constexpr size_t kKeyBytes = sizeof(uint16_t) * 2 * size_t(kKeys) * LD + sizeof(int64_t) * kKeys;
  static constexpr size_t kWordBytes = sizeof(uint32_t) * kRows * kWords;
  static constexpr size_t kDsBytes = sizeof(uint16_t) * size_t(kKeys) * kDsLd;
  __host__ __device__ static constexpr size_t shared_bytes() {
    return kKeyBytes + kWordBytes + kDsBytes + Queries::shared_bytes();
  }
};

// The shape per head dim and architecture family, chosen by occupancy as the forward's (docs/gpu.md,
// "The tensor-core kernels"): the most CTAs per multiprocessor without spills, with query tiles
// of at least 32 rows unless smaller ones are needed to reach two CTAs; on a tie, larger tiles.
template <int D, int Arch>
struct BackwardChoice;
template <int Arch>
struct BackwardChoice<64, Arch> {  // 244 registers, 69 KiB: 2 CTAs (32 rows too; 16 rows: 3)
  using type = BackwardShape<64, 64, 2, 0>;
};
template <int Arch>
struct BackwardChoice<96, Arch> {  // 240 registers, 61 KiB: 2 CTAs
  using type = BackwardShape<96, 32, 2, 0>;
};
template <int Arch>
struct BackwardChoice<128, Arch> {  // 254 registers, 77 KiB: 2 CTAs
  using type = BackwardShape<128, 32, 2, 0>;
};
template <>
struct BackwardChoice<256, 80> {  // 254 registers, 141 KiB: 1 CTA (16 rows: 105 KiB, 1 CTA too)
  using type = BackwardShape<256, 32, 1, 80>;
};
template <>
struct BackwardChoice<256, 90> {  // 250 registers, 105 KiB: 2 CTAs (32 rows: 1)
  using type = BackwardShape<256, 16, 2, 90>;
};

template <class T, int D, class Tiles>
__device__ __forceinline__ void backward_tile(const AttentionParams& p) {
  constexpr int kKeys = Tiles::kKeys, kRows = Tiles::kRows, kColumns = Tiles::kColumns, kWords = Tiles::kWords;
  constexpr int LD = Tiles::LD;
  constexpr int NT = kRows / 8;  // query n-tiles of S^T
  constexpr int DT = kColumns / 8;
  constexpr int QT = Tiles::kDqChunk / 8;  // dQ n-tiles per warp and chunk
  constexpr int KC = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem);  // [kKeys][LD]
  uint16_t* vs = ks + kKeys * LD;                    // [kKeys][LD]
  int64_t* kpos = reinterpret_cast<int64_t*>(vs + kKeys * LD);
  uint32_t* visible_words = reinterpret_cast<uint32_t*>(smem + Tiles::kKeyBytes);  // [kRows][kWords]
  uint16_t* dst = reinterpret_cast<uint16_t*>(smem + Tiles::kKeyBytes + Tiles::kWordBytes);  // dS^T [kKeys][kDsLd]

  // The CTA index, fastest first: column split, kv head, batch entry, key block. Key blocks vary
  // slowest: a CTA waits only for CTAs of earlier key blocks (dq_order.cuh), and the first key
  // blocks, which the most causal queries see, start first. 32-bit divisions, once per CTA.
  unsigned cta = blockIdx.x;
  const int split = int(cta % Tiles::kSplits);
  cta /= Tiles::kSplits;
  const int kvh = int(cta % unsigned(p.kv_heads));
  cta /= unsigned(p.kv_heads);
  const int b = int(cta % unsigned(p.batch));
  const int kb = int(cta / unsigned(p.batch));
  const int c0 = split * kColumns;  // first column of dK, dV, dQ
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, quad_lane = lane & 3;
  const RowSpan kspan = row_span(p.k_pos, p.k_rows, kKeys, kb);
  typename Tiles::Queries queries(p, kspan, kb, b, kvh, smem + Tiles::kKeyBytes + Tiles::kWordBytes + Tiles::kDsBytes,
                                  tid);
  if (!queries.start()) return;

  const int64_t krow0 = b * p.k_rows + kspan.row0;
  load_rows_to_shared<D>(ks, LD, kKeys, p.k, krow0, kspan.count, p.kv_heads, kvh, tid, Tiles::kThreads);
  load_rows_to_shared<D>(vs, LD, kKeys, p.v, krow0, kspan.count, p.kv_heads, kvh, tid, Tiles::kThreads);
  for (int j = tid; j < kKeys; j += Tiles::kThreads) kpos[j] = j < kspan.count ? p.k_pos[kspan.row0 + j] : 0;

  const int keys[2] = {warp * 16 + (lane >> 2), warp * 16 + (lane >> 2) + 8};  // this thread's accumulator rows
  __syncthreads();  // key positions in shared memory
  const int word = warp >> 1;  // keys[] lie in words [.][warp / 2]
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;

  // This warp's part of dQ_part: 16 rows from dq_row0, kDqColumns columns from dq_col0.
  const int dq_row0 = (warp % Tiles::kDqRowGroups) * 16;
  const int dq_col0 = c0 + (warp / Tiles::kDqRowGroups) * Tiles::kDqColumns;
  // The flags of this batch entry's query tiles, indexed in 32 bits (the launch checks they fit).
  const unsigned tiles = unsigned(tile_count(p.q_rows, kRows));
  int* const flags = p.dq_flags + unsigned(b) * unsigned(p.heads) * tiles * Tiles::kSplits;
  constexpr unsigned kNone = ~0u;
  unsigned published = kNone;  // the flag of the last tile whose dQ this CTA added to, not yet published

  const float scale_log2 = p.scale * kLog2e;
  queries.run([&](const QueryTile& tile, const uint16_t* qs, const uint16_t* dos, const RowMask* rmask,
                  const float* lse2, const float* dlt) {
    // Every thread's additions to the previous tile were made before the barriers between two
    // bodies: let the next key block add to it.
    if (tid == 0 && published != kNone) publish_flag(flags + published, kb + 1);
    if (tile.kind == TileKind::partial) {  // (uniform) element mask as bits: one ballot per row and word
      int64_t lane_key_pos[kWords];          // the keys this lane tests
#pragma unroll
      for (int w = 0; w < kWords; ++w) lane_key_pos[w] = kpos[lane + 32 * w];
#pragma unroll 1
      for (int i = 0; i < kRows / Tiles::kWarps; ++i) {
        const int r = warp * (kRows / Tiles::kWarps) + i;
        const RowMask rm = rmask[r];
        const bool row = r < tile.span.count;
#pragma unroll
        for (int w = 0; w < kWords; ++w) {
          const bool sees = row && lane + 32 * w < kspan.count && row_sees_32(p.mask, rm, lane_key_pos[w]);
          const unsigned bits = __ballot_sync(0xffffffffu, sees);
          if (lane == 0) visible_words[kWords * r + w] = bits;
        }
      }
      __syncthreads();
    }
    float st[NT][4], dpt[NT][4];  // S^T and dP^T: this warp's 16 keys x kRows queries
    product_transposed<T, NT, KC>(ks, qs, LD, warp * 16, lane, st);
    product_transposed<T, NT, KC>(vs, dos, LD, warp * 16, lane, dpt);
    // P^T into st, dS^T into dpt.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = keys[e >> 1];
        const int col = nt * 8 + 2 * quad_lane + (e & 1);  // query within the tile
        const bool ok = tile.kind == TileKind::partial
                            ? ((visible_words[kWords * col + word] >> (key & 31)) & 1u) != 0
                            : key < kspan.count && col < tile.span.count;
        // The scaled score rounded before the subtraction, as the forward rounds it (see there):
        // P is then recomputed from the same rounded exponent that produced O and LSE, where an
        // FFMA would differ by 2^(rounding error of the product), ~4e-4 at scores of 1e4.
        const float pr = ok ? exp2_approx(__fmul_rn(st[nt][e], scale_log2) - lse2[col]) : 0.0f;
        st[nt][e] = pr;
        dpt[nt][e] = pr * (dpt[nt][e] - dlt[col]);
      }
    store_accumulators<T, NT>(dpt, dst, Tiles::kDsLd, warp * 16, lane);  // dS^T, for dQ below
    accumulate_product<T, kRows / 16, DT>(st, dos + c0, LD, lane, dv);   // dV += P^T dO
    accumulate_product<T, kRows / 16, DT>(dpt, qs + c0, LD, lane, dk);   // dK += dS^T Q
    __syncthreads();  // dS^T complete

    // dQ += dS K, in chunks of columns (fewer live registers), added after the tile's previous
    // visitor has added its part (dq_order.cuh).
    const unsigned flag = (unsigned(tile.head) * tiles + unsigned(tile.index)) * Tiles::kSplits + split;
    float* dq_rows[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = dq_row0 + (lane >> 2) + 8 * rr;
      dq_rows[rr] = row < tile.span.count ? p.dq + ((b * p.q_rows + tile.span.row0 + row) * p.heads + tile.head) * D +
                                                dq_col0 + 2 * quad_lane
                                          : nullptr;
    }
#pragma unroll
    for (int chunk = 0; chunk < Tiles::kDqColumns; chunk += Tiles::kDqChunk) {
      float dq[QT][4];
#pragma unroll
      for (int qt = 0; qt < QT; ++qt) dq[qt][0] = dq[qt][1] = dq[qt][2] = dq[qt][3] = 0.0f;
      accumulate_transposed_product<T, kKeys / 16, QT>(dst, Tiles::kDsLd, dq_row0, ks + dq_col0 + chunk, LD, lane,
                                                       dq);
      if (chunk == 0) wait_for_flag(flags + flag, tile.previous + 1);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        if (!dq_rows[rr]) continue;
#pragma unroll
        for (int qt = 0; qt < QT; ++qt)
          add_pair_to_global(dq_rows[rr] + chunk + qt * 8, p.scale * dq[qt][2 * rr], p.scale * dq[qt][2 * rr + 1]);
      }
    }
    published = flag;  // published by one thread after the barriers that end this body
  });
  if (tid == 0 && published != kNone) publish_flag(flags + published, kb + 1);  // after run()'s final barrier

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (keys[rr] >= kspan.count) continue;
    const int64_t at = ((krow0 + keys[rr]) * p.kv_heads + kvh) * D + c0 + 2 * quad_lane;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      float2 x = *reinterpret_cast<float2*>(p.dk + at + dt * 8);
      x.x += p.scale * dk[dt][2 * rr];
      x.y += p.scale * dk[dt][2 * rr + 1];
      *reinterpret_cast<float2*>(p.dk + at + dt * 8) = x;
      float2 y = *reinterpret_cast<float2*>(p.dv + at + dt * 8);
      y.x += dv[dt][2 * rr];
      y.y += dv[dt][2 * rr + 1];
      *reinterpret_cast<float2*>(p.dv + at + dt * 8) = y;
    }
  }
}

template <class T, int D, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks) backward_kernel(AttentionParams p) {
  if constexpr (compiled_here<Shape>) backward_tile<T, D, Shape>(p);
}

template <class Shape>
int64_t flag_count(const AttentionParams& p) {
  return p.batch * p.heads * tile_count(p.q_rows, Shape::kRows) * Shape::kSplits;
}

template <class T, int D, class Shape>
void launch(TypeTag<T>, HeadDim<D>, TypeTag<Shape>, const AttentionParams& p, cudaStream_t stream) {
  const int64_t ctas = tile_count(p.k_rows, Shape::kKeys) * Shape::kSplits * p.kv_heads * p.batch;
  if (ctas > 0x7fffffff || flag_count<Shape>(p) > 0x7fffffff)
    throw std::invalid_argument("cuda_attention_backward: too many key blocks or query tiles x heads x batch entries "
                                "for one launch");
  launch_with_shared_memory(backward_kernel<T, D, Shape>, dim3(unsigned(ctas)), Shape::kThreads, Shape::shared_bytes(),
                            stream, p);
}

// Device memory the call allocates, released (stream-ordered) however the call ends.
struct StreamAllocation {
  void* data = nullptr;
  cudaStream_t stream;
  StreamAllocation(size_t bytes, cudaStream_t s) : stream(s) { RINGATTN_CUDA_CHECK(cudaMallocAsync(&data, bytes, s)); }
  ~StreamAllocation() { cudaFreeAsync(data, stream); }
  StreamAllocation(const StreamAllocation&) = delete;
  StreamAllocation& operator=(const StreamAllocation&) = delete;
};

}  // namespace

size_t backward_workspace_bytes(int head_dim, int64_t batch, int64_t heads, int64_t q_rows) {
  AttentionParams p;
  p.batch = batch, p.heads = heads, p.q_rows = q_rows, p.head_dim = head_dim;
  int64_t flags = 0;
  dispatch_tensor_core(p, [&](auto, auto dim) {  // the larger of the two families' needs
    constexpr int D = decltype(dim)::value;
    flags = std::max(flag_count<typename BackwardChoice<D, 80>::type>(p),
                     flag_count<typename BackwardChoice<D, 90>::type>(p));
  });
  return sizeof(int) * size_t(flags);
}

void backward_tensor_core(const AttentionParams& params, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream) {
  AttentionParams p = params;
  const size_t bytes = backward_workspace_bytes(p.head_dim, p.batch, p.heads, p.q_rows);
  std::optional<StreamAllocation> own;
  if (workspace == nullptr || workspace_bytes < bytes) workspace = own.emplace(bytes, stream).data;
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(workspace, 0, bytes, stream));  // no key block has added to any tile
  p.dq_flags = static_cast<int*>(workspace);
  launch_for_arch<BackwardChoice>(p, [&](auto... instance) { launch(instance..., p, stream); });
}

}  // namespace ringattn::kernels::gpu
