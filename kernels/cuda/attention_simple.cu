// CUDA-core fp32 attention: the plain path for fp32 inputs and head dims the tensor-core
// kernels do not cover, and a cross-check of those kernels. One lane per key of a 32-key block:
// lane j computes the score of key j, warp shuffles give the row maximum and sum, and each lane
// accumulates the output columns d = lane + 32 c. Everything is fp32; inputs are converted on load.
//
//   forward:  CTA = 4 warps = one tile of 32 query rows (8 per warp) for one (head, batch).
//   dQ:       the same shape, recomputing P and dP from LSE and delta (FlashAttention-2).
//   dK, dV:   CTA = 1 warp = one block of 32 keys for one (kv head, batch); lane j owns key j's
//             dK/dV row in shared memory, and the warp walks every query row that may see the block.
// Blocks the mask hides are skipped before any arithmetic (tile_plan.hpp).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/params.cuh"
#include "kernels/cuda/row_statistics.cuh"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::gpu {
namespace {

constexpr int kRows = 32;  // query rows per tile
constexpr int kKeys = 32;  // keys per block: one per lane
constexpr int kWarps = 4;
constexpr int kRowsPerWarp = kRows / kWarps;
constexpr int kChunks = kSimpleMaxHeadDim / 32;  // output columns per lane: d = lane + 32 c

__device__ __forceinline__ int64_t q_index(const AttentionParams& p, int64_t b, int64_t row, int64_t h) {
  return ((b * p.q_rows + row) * p.heads + h) * p.head_dim;
}
__device__ __forceinline__ int64_t kv_index(const AttentionParams& p, int64_t b, int64_t row, int64_t kvh) {
  return ((b * p.k_rows + row) * p.kv_heads + kvh) * p.head_dim;
}

// Loads key block `ks_span` of (b, kvh) as fp32 into ks/vs (row strides ld_k, ld_v), zero past its end.
__device__ void load_key_block(const AttentionParams& p, const RowSpan& span, int64_t b, int64_t kvh, float* ks,
                               int ld_k, float* vs, int ld_v, int64_t* kpos, int tid, int threads) {
  const int D = p.head_dim;
  for (int idx = tid; idx < kKeys * D; idx += threads) {
    const int j = idx / D, d = idx % D;
    float kx = 0.0f, vx = 0.0f;
    if (j < span.count) {
      const int64_t at = kv_index(p, b, span.row0 + j, kvh) + d;
      kx = load_element(p.k, p.type, at);
      vx = load_element(p.v, p.type, at);
    }
    ks[j * ld_k + d] = kx;
    vs[j * ld_v + d] = vx;
  }
  for (int j = tid; j < kKeys; j += threads) kpos[j] = j < span.count ? p.k_pos[span.row0 + j] : 0;
}

// True when any key block in `blocks` is visible to the tile (every thread gets the same answer).
__device__ bool tile_sees_any(const AttentionParams& p, const RowSpan& q, TileRange blocks) {
  for (int64_t kb = blocks.first; kb < blocks.last; ++kb)
    if (classify_tile(p.mask, q, row_span(p.k_pos, p.k_rows, kKeys, kb)) != TileKind::empty) return true;
  return false;
}

__global__ void __launch_bounds__(kWarps * 32) forward_kernel(AttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = p.head_dim;
  float* qs = reinterpret_cast<float*>(smem);  // [kRows][D], scaled to log2 units
  float* ks = qs + kRows * D;                  // [kKeys][D + 1]
  float* vs = ks + kKeys * (D + 1);            // [kKeys][D]
  int64_t* kpos = reinterpret_cast<int64_t*>(vs + kKeys * D);
  RowMask* rmask = reinterpret_cast<RowMask*>(kpos + kKeys);

  const int64_t tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = int(blockIdx.y) / p.group();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const RowSpan qspan = row_span(p.q_pos, p.q_rows, kRows, tile);
  const TileRange blocks = key_blocks_for_queries(p.mask, qspan, p.k_pos, p.k_rows, kKeys);
  if (!tile_sees_any(p, qspan, blocks)) return;  // the state keeps what it holds

  const float scale_log2 = p.scale * kLog2e;
  for (int idx = tid; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    qs[idx] = r < qspan.count ? load_element(p.q, p.type, q_index(p, b, qspan.row0 + r, h) + d) * scale_log2 : 0.0f;
  }
  for (int r = tid; r < kRows; r += blockDim.x)
    rmask[r] = r < qspan.count ? row_mask(p.mask, p.q_pos[qspan.row0 + r]) : RowMask{};

  // Continue from the incoming state: normalised O with LSE means running max LSE (log2 units)
  // and running sum 1, to fp32 rounding (continue_state); an empty state (LSE = -inf) has sum 0.
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kChunks];
  bool grew[kRowsPerWarp];  // saw a visible key in this call; other rows keep their state bit for bit
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    const bool valid = r < qspan.count;
    const float lse_in = valid ? p.lse[(b * p.heads + h) * p.q_rows + qspan.row0 + r] : neg_inf();
    const bool seen = valid && lse_in != neg_inf();
    const ContinuedState state = continue_state(lse_in);
    m[i] = seen ? state.m : neg_inf();
    l[i] = seen ? state.l : 0.0f;
    grew[i] = false;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      acc[i][c] = 0.0f;
      if (seen && d < D) acc[i][c] = p.o[q_index(p, b, qspan.row0 + r, h) + d] * state.l;
    }
  }

  for (int64_t kb = blocks.first; kb < blocks.last; ++kb) {
    const RowSpan kspan = row_span(p.k_pos, p.k_rows, kKeys, kb);
    const TileKind kind = classify_tile(p.mask, qspan, kspan);
    if (kind == TileKind::empty) continue;
    __syncthreads();  // the previous block is no longer read
    load_key_block(p, kspan, b, kvh, ks, D + 1, vs, D, kpos, tid, blockDim.x);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp * kRowsPerWarp + i;
      if (r < qspan.count) {  // warp-uniform
        const float* qrow = qs + r * D;
        const float* krow = ks + lane * (D + 1);
        float s = 0.0f;
        for (int d = 0; d < D; ++d) s = fmaf(qrow[d], krow[d], s);
        const bool ok = lane < kspan.count && (kind == TileKind::full || row_sees(p.mask, rmask[r], kpos[lane]));
        s = ok ? s : neg_inf();
        const float row_max = warp_max(s);
        grew[i] = grew[i] || row_max != neg_inf();
        const float m_new = fmaxf(m[i], row_max);
        // A row that has seen only masked keys keeps m = -inf; a finite stand-in keeps exp2 at 0, not NaN.
        const float m_safe = m_new == neg_inf() ? 0.0f : m_new;
        const float pr = exp2f(s - m_safe);
        const float alpha = exp2f(m[i] - m_safe);
        l[i] = l[i] * alpha + warp_sum(pr);
        m[i] = m_new;
        // The block's P V from zero, then added (a chain over every key would round each term
        // against the whole running sum: see dkdv_kernel).
        float block[kChunks];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) block[c] = 0.0f;
        for (int j = 0; j < kKeys; ++j) {
          const float pj = __shfl_sync(0xffffffffu, pr, j);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int d = lane + 32 * c;
            if (d < D) block[c] = fmaf(pj, vs[j * D + d], block[c]);
          }
        }
#pragma unroll
        for (int c = 0; c < kChunks; ++c) acc[i][c] = fmaf(acc[i][c], alpha, block[c]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    if (r >= qspan.count || !grew[i]) continue;
    const bool any = l[i] > 0.0f;
    const float inv = any ? 1.0f / l[i] : 0.0f;
    const int64_t base = q_index(p, b, qspan.row0 + r, h);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      if (d < D) p.o[base + d] = acc[i][c] * inv;
    }
    if (lane == 0) p.lse[(b * p.heads + h) * p.q_rows + qspan.row0 + r] = any ? lse_of(m[i], l[i]) : neg_inf();
  }
}

// dQ += scale * dS K with dS = P * (dP - delta), P = exp(S - LSE), dP = dO V^T.
__global__ void __launch_bounds__(kWarps * 32) dq_kernel(AttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = p.head_dim;
  float* qs = reinterpret_cast<float*>(smem);  // [kRows][D], scaled to log2 units
  float* dos = qs + kRows * D;                 // [kRows][D]
  float* ks = dos + kRows * D;                 // [kKeys][D + 1]
  float* vs = ks + kKeys * (D + 1);            // [kKeys][D + 1]
  int64_t* kpos = reinterpret_cast<int64_t*>(vs + kKeys * (D + 1));
  RowMask* rmask = reinterpret_cast<RowMask*>(kpos + kKeys);
  float* lse2 = reinterpret_cast<float*>(rmask + kRows);
  float* dlt = lse2 + kRows;

  const int64_t tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = int(blockIdx.y) / p.group();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const RowSpan qspan = row_span(p.q_pos, p.q_rows, kRows, tile);
  const TileRange blocks = key_blocks_for_queries(p.mask, qspan, p.k_pos, p.k_rows, kKeys);
  if (!tile_sees_any(p, qspan, blocks)) return;

  const float scale_log2 = p.scale * kLog2e;
  for (int idx = tid; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    const bool valid = r < qspan.count;
    const int64_t at = q_index(p, b, qspan.row0 + r, h) + d;
    qs[idx] = valid ? load_element(p.q, p.type, at) * scale_log2 : 0.0f;
    dos[idx] = valid ? load_element(p.dout, p.type, at) : 0.0f;
  }
  load_row_statistics(p, qspan, b, h, kRows, rmask, lse2, dlt, tid, blockDim.x);

  float acc[kRowsPerWarp][kChunks];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[i][c] = 0.0f;

  for (int64_t kb = blocks.first; kb < blocks.last; ++kb) {
    const RowSpan kspan = row_span(p.k_pos, p.k_rows, kKeys, kb);
    const TileKind kind = classify_tile(p.mask, qspan, kspan);
    if (kind == TileKind::empty) continue;
    __syncthreads();
    load_key_block(p, kspan, b, kvh, ks, D + 1, vs, D + 1, kpos, tid, blockDim.x);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp * kRowsPerWarp + i;
      if (r < qspan.count) {
        const float* krow = ks + lane * (D + 1);
        const float* vrow = vs + lane * (D + 1);
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < D; ++d) {
          s = fmaf(qs[r * D + d], krow[d], s);
          dp = fmaf(dos[r * D + d], vrow[d], dp);
        }
        const bool ok = lane < kspan.count && (kind == TileKind::full || row_sees(p.mask, rmask[r], kpos[lane]));
        const float pr = ok ? exp2f(s - lse2[r]) : 0.0f;
        const float ds = pr * (dp - dlt[r]);
        float block[kChunks];  // the block's dS K from zero, then added (as in the forward)
#pragma unroll
        for (int c = 0; c < kChunks; ++c) block[c] = 0.0f;
        for (int j = 0; j < kKeys; ++j) {
          const float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int d = lane + 32 * c;
            if (d < D) block[c] = fmaf(dsj, ks[j * (D + 1) + d], block[c]);
          }
        }
#pragma unroll
        for (int c = 0; c < kChunks; ++c) acc[i][c] += block[c];
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    if (r >= qspan.count) continue;
    const int64_t base = q_index(p, b, qspan.row0 + r, h);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      if (d < D) p.dq[base + d] += p.scale * acc[i][c];
    }
  }
}

// dK += scale * dS^T Q and dV += P^T dO for one block of 32 keys, over every query that may see it.
// Each lane adds one query row at a time to its key's row in shared memory, so the shared rows
// hold panels of kPanelTiles query tiles (256 rows, the panels of the plain fp32 computation,
// kernels/reference.cpp), each added to dK and dV in global memory (this CTA's rows) when full:
// one chain over every query row (and the GQA group's heads) made dV 4.7x, dK 3.8x the plain
// fp32 error at L = 2048, causal.
constexpr int kPanelTiles = 256 / kRows;

__global__ void __launch_bounds__(32) dkdv_kernel(AttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = p.head_dim;
  float* ks = reinterpret_cast<float*>(smem);  // [kKeys][D + 1]
  float* vs = ks + kKeys * (D + 1);
  float* dks = vs + kKeys * (D + 1);
  float* dvs = dks + kKeys * (D + 1);
  // One query row at a time: scaled to log2 units for the score (rounded exactly as in the
  // forward pass, so that P matches the forward LSE even for huge scores), raw for dK, and dO.
  float* qrow = dvs + kKeys * (D + 1);                              // [D]
  float* qraw = qrow + D;                                           // [D]
  float* dorow = qraw + D;                                          // [D]
  int64_t* kpos = reinterpret_cast<int64_t*>(dorow + D + (D & 1));  // 8-byte aligned

  const int64_t kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x;
  const RowSpan kspan = row_span(p.k_pos, p.k_rows, kKeys, kb);
  const TileRange tiles = query_tiles_for_keys(p.mask, kspan, p.q_pos, p.q_rows, kRows);
  if (tiles.empty()) return;

  load_key_block(p, kspan, b, kvh, ks, D + 1, vs, D + 1, kpos, lane, 32);
  for (int idx = lane; idx < kKeys * (D + 1); idx += 32) dks[idx] = dvs[idx] = 0.0f;
  __syncwarp();

  const float scale_log2 = p.scale * kLog2e;
  const float* krow = ks + lane * (D + 1);
  const float* vrow = vs + lane * (D + 1);
  float* dkrow = dks + lane * (D + 1);
  float* dvrow = dvs + lane * (D + 1);
  // dK, dV += the panel in shared memory, which is then zero again.
  auto add_panel = [&] {
    __syncwarp();  // every lane's row is complete
    for (int idx = lane; idx < kspan.count * D; idx += 32) {
      const int j = idx / D, d = idx % D;
      const int64_t at = kv_index(p, b, kspan.row0 + j, kvh) + d;
      p.dk[at] += p.scale * dks[j * (D + 1) + d];
      p.dv[at] += dvs[j * (D + 1) + d];
      dks[j * (D + 1) + d] = dvs[j * (D + 1) + d] = 0.0f;
    }
    __syncwarp();
  };
  int panel_tiles = 0;
  for (int64_t g = 0; g < p.group(); ++g) {
    const int64_t h = kvh * p.group() + g;
    for (int64_t qt = tiles.first; qt < tiles.last; ++qt) {
      const RowSpan qspan = row_span(p.q_pos, p.q_rows, kRows, qt);
      const TileKind kind = classify_tile(p.mask, qspan, kspan);
      if (kind == TileKind::empty) continue;
      for (int64_t r = 0; r < qspan.count; ++r) {
        const int64_t row = qspan.row0 + r;
        const int64_t base = q_index(p, b, row, h);
        __syncwarp();  // every lane is done with the previous row
        for (int d = lane; d < D; d += 32) {
          qraw[d] = load_element(p.q, p.type, base + d);
          qrow[d] = qraw[d] * scale_log2;
          dorow[d] = load_element(p.dout, p.type, base + d);
        }
        __syncwarp();
        const int64_t at = (b * p.heads + h) * p.q_rows + row;
        const float lse2 = lse_to_log2_offset(p.lse_in[at]);
        const float dlt = p.delta[at];
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < D; ++d) {
          s = fmaf(qrow[d], krow[d], s);
          dp = fmaf(dorow[d], vrow[d], dp);
        }
        bool ok = lane < kspan.count;
        if (ok && kind == TileKind::partial) ok = row_sees(p.mask, row_mask(p.mask, p.q_pos[row]), kpos[lane]);
        const float pr = ok ? exp2f(s - lse2) : 0.0f;
        const float ds = pr * (dp - dlt);
        for (int d = 0; d < D; ++d) {
          dvrow[d] = fmaf(pr, dorow[d], dvrow[d]);
          dkrow[d] = fmaf(ds, qraw[d], dkrow[d]);
        }
      }
      if (++panel_tiles == kPanelTiles) add_panel(), panel_tiles = 0;
    }
  }
  if (panel_tiles > 0) add_panel();
}

size_t forward_smem(int D) {
  return sizeof(float) * (size_t(kRows) * D + size_t(kKeys) * (D + 1) + size_t(kKeys) * D) + sizeof(int64_t) * kKeys +
         sizeof(RowMask) * kRows;
}
size_t dq_smem(int D) {
  return sizeof(float) * (2 * size_t(kRows) * D + 2 * size_t(kKeys) * (D + 1)) + sizeof(int64_t) * kKeys +
         sizeof(RowMask) * kRows + 2 * sizeof(float) * kRows;
}
size_t dkdv_smem(int D) {
  return sizeof(float) * (4 * size_t(kKeys) * (D + 1) + 3 * size_t(D) + (D & 1)) + sizeof(int64_t) * kKeys;
}

}  // namespace

void forward_simple(const AttentionParams& p, cudaStream_t stream) {
  const int64_t tiles = tile_count(p.q_rows, kRows);
  check_grid(tiles, p.heads, p.batch, "cuda_attention_forward");
  launch_with_shared_memory(forward_kernel, dim3(unsigned(tiles), unsigned(p.heads), unsigned(p.batch)), kWarps * 32,
                            forward_smem(p.head_dim), stream, p);
}

void backward_simple(const AttentionParams& p, cudaStream_t stream) {
  const int64_t tiles = tile_count(p.q_rows, kRows);
  check_grid(tiles, p.heads, p.batch, "cuda_attention_backward");
  launch_with_shared_memory(dq_kernel, dim3(unsigned(tiles), unsigned(p.heads), unsigned(p.batch)), kWarps * 32,
                            dq_smem(p.head_dim), stream, p);

  const int64_t blocks = tile_count(p.k_rows, kKeys);
  check_grid(blocks, p.kv_heads, p.batch, "cuda_attention_backward");
  launch_with_shared_memory(dkdv_kernel, dim3(unsigned(blocks), unsigned(p.kv_heads), unsigned(p.batch)), 32,
                            dkdv_smem(p.head_dim), stream, p);
}

}  // namespace ringattn::kernels::gpu
