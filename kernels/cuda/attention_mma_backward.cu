// Tensor-core backward pass (FlashAttention-2 recomputation from LSE and delta), in two
// deterministic kernels instead of one kernel with atomic dQ updates:
//
//   dQ kernel:   CTA = 4 warps = 64 query rows of one (head, batch), as the forward pass.
//                Per visible key block: S = Q K^T, dP = dO V^T, P = exp(S - LSE),
//                dS = P (dP - delta), dQ += dS K (dS rounded to the input type).
//   dK/dV kernel: CTA = 4 warps = 64 keys of one (kv head, batch); warp w owns keys 16w..16w+15
//                and keeps their dK, dV in registers. Per visible tile of 32 query rows (of every
//                query head of the group): S^T = K Q^T, dP^T = V dO^T, P^T, dS^T as above,
//                dV += P^T dO, dK += dS^T Q.
//
// Each output row is written by exactly one CTA, so results do not depend on scheduling; the
// price is recomputing S and dP in both kernels (7 matrix products per tile pair instead of
// FlashAttention-2's 5, whose dQ is summed over key blocks with atomics, in no fixed order).
// Both kernels double-buffer the tiles they stream (K/V blocks, or Q/dO tiles) with cp.async
// (tile_pipeline.cuh) and load every fragment with ldmatrix (.trans for the k-major operands).
// At D = 256 the dQ kernel takes blocks of 32 keys and two dK/dV CTAs share each key block, each
// accumulating half of the columns (BackwardTiles).
// Rows that saw no key (LSE = -inf) get P = 0 and contribute nothing.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/params.cuh"
#include "kernels/cuda/row_statistics.cuh"
#include "kernels/cuda/tile_pipeline.cuh"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kDqRows = 64;  // dQ kernel: query rows per CTA
constexpr int kKvKeys = 64;  // dK/dV kernel: keys per CTA
constexpr int kKvRows = 32;  // dK/dV kernel: query rows per tile

// Per head dim. dQ kernel: keys per block (32 at D = 256, so that the double-buffered blocks fit
// sm_80's shared memory). dK/dV kernel: the dK/dV columns one CTA accumulates; at D = 256 two
// CTAs share a key block, each with half the columns (each recomputes S and dP, whose 256 + 256
// accumulator registers per thread would otherwise spill).
template <int D>
struct BackwardTiles {
  static constexpr int kDqKeys = D <= 128 ? 64 : 32;
  static constexpr int kKvColumns = D <= 128 ? D : 128;
  static constexpr int kColumnSplits = D / kKvColumns;
};

// dQ kernel: the query tile (Q, dO, row statistics), then the double-buffered K/V blocks.
template <int D>
__host__ __device__ constexpr size_t dq_tile_bytes() {
  return sizeof(uint16_t) * 2 * size_t(kDqRows) * (D + 8) + sizeof(RowMask) * kDqRows + 2 * sizeof(float) * kDqRows;
}
template <int D>
__host__ __device__ constexpr size_t dq_smem() {
  return dq_tile_bytes<D>() + KeyBlocks<D, BackwardTiles<D>::kDqKeys, kThreads>::shared_bytes();
}

// dK/dV kernel: the key block (K, V, positions), the visibility words of a partial tile (bit j of
// word [r][h]: query row r sees key 32 h + j), then the double-buffered query tiles.
template <int D>
__host__ __device__ constexpr size_t kv_block_bytes() {
  return sizeof(uint16_t) * 2 * size_t(kKvKeys) * (D + 8) + sizeof(int64_t) * kKvKeys +
         sizeof(uint32_t) * kKvRows * (kKvKeys / 32);
}
template <int D>
__host__ __device__ constexpr size_t dkdv_smem() {
  return kv_block_bytes<D>() + QueryTiles<D, kKvRows, kThreads>::shared_bytes();
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(AttentionParams p) {
  constexpr int kDqKeys = BackwardTiles<D>::kDqKeys;
  constexpr int LD = D + 8;
  constexpr int NT = kDqKeys / 8;
  constexpr int DT = D / 8;
  constexpr int KC = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);  // [kDqRows][LD]
  uint16_t* dos = qs + kDqRows * LD;                 // [kDqRows][LD]
  RowMask* rmask = reinterpret_cast<RowMask*>(dos + kDqRows * LD);
  float* lse2 = reinterpret_cast<float*>(rmask + kDqRows);
  float* dlt = lse2 + kDqRows;

  // Causal: the last query tiles see the most keys; they start first (heaviest first).
  const int64_t tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = int(blockIdx.y) / p.group();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, quad_lane = lane & 3;
  const RowSpan qspan = row_span(p.q_pos, p.q_rows, kDqRows, tile);
  KeyBlocks<D, kDqKeys, kThreads> keys(p, qspan, b, kvh, smem + dq_tile_bytes<D>(), tid);
  if (!keys.start()) return;

  const int64_t qrow0 = b * p.q_rows + qspan.row0;
  load_rows_to_shared<D>(qs, LD, kDqRows, p.q, qrow0, qspan.count, p.heads, h, tid, kThreads);
  load_rows_to_shared<D>(dos, LD, kDqRows, p.dout, qrow0, qspan.count, p.heads, h, tid, kThreads);
  load_row_statistics(p, qspan, b, h, kDqRows, rmask, lse2, dlt, tid, kThreads);
  __syncthreads();

  // This thread's two rows: their element masks and statistics in registers for the whole loop.
  const int rows[2] = {warp * 16 + (lane >> 2), warp * 16 + (lane >> 2) + 8};
  const RowMask row_masks[2] = {rmask[rows[0]], rmask[rows[1]]};
  const float row_lse2[2] = {lse2[rows[0]], lse2[rows[1]]}, row_delta[2] = {dlt[rows[0]], dlt[rows[1]]};
  float dq[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

  const float scale_log2 = p.scale * kLog2e;
  keys.run([&](const RowSpan& kspan, TileKind kind, const uint16_t* ks, const uint16_t* vs, const int64_t* kpos) {
    float s[NT][4], dp[NT][4];
    product_transposed<T, NT, KC>(qs, ks, LD, warp * 16, lane, s);    // S = Q K^T
    product_transposed<T, NT, KC>(dos, vs, LD, warp * 16, lane, dp);  // dP = dO V^T
                                                                      // dS = P (dP - delta), into s.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * quad_lane + (e & 1);
        bool ok = col < kspan.count;
        if (ok && kind == TileKind::partial) ok = row_sees_32(p.mask, row_masks[e >> 1], kpos[col]);
        const float pr = ok ? exp2f(s[nt][e] * scale_log2 - row_lse2[e >> 1]) : 0.0f;
        s[nt][e] = pr * (dp[nt][e] - row_delta[e >> 1]);
      }
    accumulate_product<T, kDqKeys / 16, DT>(s, ks, LD, lane, dq);  // dQ += dS K
  });

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (rows[rr] >= qspan.count) continue;
    float* out = p.dq + ((qrow0 + rows[rr]) * p.heads + h) * D + 2 * quad_lane;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      float2 x = *reinterpret_cast<float2*>(out + dt * 8);
      x.x += p.scale * dq[dt][2 * rr];
      x.y += p.scale * dq[dt][2 * rr + 1];
      *reinterpret_cast<float2*>(out + dt * 8) = x;
    }
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(AttentionParams p) {
  constexpr int kColumns = BackwardTiles<D>::kKvColumns;  // of dK and dV, from column c0
  constexpr int kSplits = BackwardTiles<D>::kColumnSplits;
  constexpr int LD = D + 8;
  constexpr int NT = kKvRows / 8;  // query n-tiles
  constexpr int DT = kColumns / 8;
  constexpr int KC = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem);  // [kKvKeys][LD]
  uint16_t* vs = ks + kKvKeys * LD;                  // [kKvKeys][LD]
  int64_t* kpos = reinterpret_cast<int64_t*>(vs + kKvKeys * LD);
  uint32_t* visible_words = reinterpret_cast<uint32_t*>(kpos + kKvKeys);  // [kKvRows][kKvKeys / 32]
  static_assert(kKvKeys == 64 && kKvRows % 4 == 0, "two visibility words per query row, rows split over 4 warps");

  // Key block kb's first columns split in blockIdx.x % kSplits (a power of 2: no division). The
  // first key blocks are seen by the most causal queries, and start first.
  const int64_t kb = blockIdx.x / kSplits, kvh = blockIdx.y, b = blockIdx.z;
  const int c0 = int(blockIdx.x % kSplits) * kColumns;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, quad_lane = lane & 3;
  const RowSpan kspan = row_span(p.k_pos, p.k_rows, kKvKeys, kb);
  QueryTiles<D, kKvRows, kThreads> queries(p, kspan, b, kvh, smem + kv_block_bytes<D>(), tid);
  if (!queries.start()) return;

  const int64_t krow0 = b * p.k_rows + kspan.row0;
  load_rows_to_shared<D>(ks, LD, kKvKeys, p.k, krow0, kspan.count, p.kv_heads, kvh, tid, kThreads);
  load_rows_to_shared<D>(vs, LD, kKvKeys, p.v, krow0, kspan.count, p.kv_heads, kvh, tid, kThreads);
  for (int j = tid; j < kKvKeys; j += kThreads) kpos[j] = j < kspan.count ? p.k_pos[kspan.row0 + j] : 0;

  const int keys[2] = {warp * 16 + (lane >> 2), warp * 16 + (lane >> 2) + 8};  // this thread's accumulator rows
  __syncthreads();  // key positions in shared memory
  const int64_t lane_key_pos[2] = {kpos[lane], kpos[lane + 32]};  // the keys this lane tests for the ballots
  const int word_half = warp >> 1;                                  // keys[] lie in words [.][warp / 2]
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;

  const float scale_log2 = p.scale * kLog2e;
  queries.run([&](const RowSpan& qspan, TileKind kind, const uint16_t* qs, const uint16_t* dos, const RowMask* rmask,
                  const float* lse2, const float* dlt) {
    if (kind == TileKind::partial) {  // (uniform) element mask as bits: one ballot per row and half
#pragma unroll 1
      for (int i = 0; i < kKvRows / 4; ++i) {
        const int r = warp * (kKvRows / 4) + i;
        const RowMask rm = rmask[r];
        const bool row = r < qspan.count;
        const bool see0 = row && lane < kspan.count && row_sees_32(p.mask, rm, lane_key_pos[0]);
        const bool see1 = row && lane + 32 < kspan.count && row_sees_32(p.mask, rm, lane_key_pos[1]);
        const unsigned w0 = __ballot_sync(0xffffffffu, see0), w1 = __ballot_sync(0xffffffffu, see1);
        if (lane == 0) visible_words[2 * r] = w0, visible_words[2 * r + 1] = w1;
      }
      __syncthreads();
    }
    float st[NT][4], dpt[NT][4];  // S^T and dP^T: this warp's 16 keys x 32 queries
    product_transposed<T, NT, KC>(ks, qs, LD, warp * 16, lane, st);
    product_transposed<T, NT, KC>(vs, dos, LD, warp * 16, lane, dpt);
    // P^T into st, dS^T into dpt.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = keys[e >> 1];
        const int col = nt * 8 + 2 * quad_lane + (e & 1);  // query within the tile
        const bool ok = kind == TileKind::partial ? ((visible_words[2 * col + word_half] >> (key & 31)) & 1u) != 0
                                                  : key < kspan.count && col < qspan.count;
        const float pr = ok ? exp2f(st[nt][e] * scale_log2 - lse2[col]) : 0.0f;
        st[nt][e] = pr;
        dpt[nt][e] = pr * (dpt[nt][e] - dlt[col]);
      }
    accumulate_product<T, kKvRows / 16, DT>(st, dos + c0, LD, lane, dv);  // dV += P^T dO
    accumulate_product<T, kKvRows / 16, DT>(dpt, qs + c0, LD, lane, dk);  // dK += dS^T Q
  });

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

// Opted in unconditionally (a no-op below 48 KiB), so that a bad size fails here, named.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  RINGATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <class T, int D>
void launch(const AttentionParams& p, cudaStream_t stream) {
  const int64_t tiles = tile_count(p.q_rows, kDqRows);
  check_grid(tiles, p.heads, p.batch, "cuda_attention_backward");
  allow_smem(dq_kernel<T, D>, dq_smem<D>());
  launch_kernel(dq_kernel<T, D>, dim3(unsigned(tiles), unsigned(p.heads), unsigned(p.batch)), kThreads, dq_smem<D>(),
                stream, p);
  RINGATTN_CUDA_CHECK_LAUNCH("backward_tensor_core dq");

  const int64_t blocks = tile_count(p.k_rows, kKvKeys) * BackwardTiles<D>::kColumnSplits;
  check_grid(blocks, p.kv_heads, p.batch, "cuda_attention_backward");
  allow_smem(dkdv_kernel<T, D>, dkdv_smem<D>());
  launch_kernel(dkdv_kernel<T, D>, dim3(unsigned(blocks), unsigned(p.kv_heads), unsigned(p.batch)), kThreads,
                dkdv_smem<D>(), stream, p);
  RINGATTN_CUDA_CHECK_LAUNCH("backward_tensor_core dkdv");
}

}  // namespace

void backward_tensor_core(const AttentionParams& p, cudaStream_t stream) {
  const bool bf16 = p.type == ElementType::bf16;
  switch (p.head_dim) {
    case 64:
      return bf16 ? launch<__nv_bfloat16, 64>(p, stream) : launch<__half, 64>(p, stream);
    case 96:
      return bf16 ? launch<__nv_bfloat16, 96>(p, stream) : launch<__half, 96>(p, stream);
    case 128:
      return bf16 ? launch<__nv_bfloat16, 128>(p, stream) : launch<__half, 128>(p, stream);
    default:
      return bf16 ? launch<__nv_bfloat16, 256>(p, stream) : launch<__half, 256>(p, stream);
  }
}

}  // namespace ringattn::kernels::gpu
