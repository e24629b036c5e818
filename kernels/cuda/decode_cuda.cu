// The CUDA decode kernel (kernels/cuda/decode_cuda.hpp): split-KV partial states, then their merge.
//
//   split kernel: CTA = 4 warps = up to 16 query rows of one K/V head's group (row r is token
//                 r / G of query head g G + r % G) against one split of the visible rows, in
//                 tiles of 32 keys loaded 16 bytes per thread and staged as fp32 in shared memory. Scores: one lane per key, the
//                 group's rows dealt round the warps (row r to warp r % 4, so that the usual 4-8
//                 rows of a decode step keep every warp busy); softmax statistics by warp
//                 shuffles. P V: one thread per output column, every row. Each tile's sums
//                 start from zero and are then added to the running ones (docs/kernels.md "Long
//                 sums"). A tile no row of the group can see (causal, window) is skipped before
//                 it is read. With one split the kernel writes the normalised state itself.
//   merge kernel: CTA = one query row, a thread per column: the splits' states merged in split
//                 order in double, O divided once, LSE = m ln 2 + ln l rounded once.
#include <algorithm>
#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_cuda.hpp"
#include "kernels/cuda/elementwise.hpp"

namespace ringattn::kernels::gpu {
namespace {

constexpr int kRows = 16;  // query rows per CTA
constexpr int kKeys = 32;  // keys per tile: one per lane
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = kRows / kWarps;
constexpr int kMaxHeadDim = 256;
constexpr int kChunks = kMaxHeadDim / kThreads;  // output columns per thread: d = tid + 128 c
// Splits: at least this many keys each, at most this many splits, and at most this many partial
// rows (splits x H x tokens) in the workspace, which bounds it whatever the call.
constexpr int64_t kMinSplitKeys = 256;
constexpr int64_t kMaxSplits = 128;
constexpr int64_t kPartialRows = 4096;

struct DecodeParams {
  int heads = 1, kv_heads = 1, group = 1, head_dim = 64;
  int64_t tokens = 1;
  float scale_log2 = 0.0f;
  const void* q = nullptr;  // (tokens, H, D)
  DType q_type = DType::f32;
  int64_t q_first = 0;
  const void* k = nullptr;  // head-major: head g's row j at (g * head_stride + j) * D
  const void* v = nullptr;
  DType kv_type = DType::f32;
  int64_t head_stride = 0;
  const int64_t* pos = nullptr;
  int64_t first = 0, last = 0;  // the rows read
  int64_t window_left = -1;
  int64_t split_rows = 0;
  int splits = 1;
  float* o = nullptr;        // (tokens, H, D)
  float* lse = nullptr;      // (H, tokens)
  float* partial = nullptr;  // splits > 1: [split][kv head][row] of (acc[D], m, l)

  __host__ __device__ int64_t rows_per_head() const { return int64_t(group) * tokens; }
};

// The output indices of row `row` of K/V head g's tile.
__device__ __forceinline__ int64_t o_index(const DecodeParams& p, int g, int64_t row) {
  const int64_t t = row / p.group, h = int64_t(g) * p.group + row % p.group;
  return (t * p.heads + h) * p.head_dim;
}
__device__ __forceinline__ int64_t lse_index(const DecodeParams& p, int g, int64_t row) {
  const int64_t t = row / p.group, h = int64_t(g) * p.group + row % p.group;
  return h * p.tokens + t;
}

// 16 bytes of a bf16 or fp32 array from element `at` (16-byte aligned) as fp32: 8 or 4 values.
__device__ __forceinline__ void load_vector(const void* base, DType t, int64_t at, float (&out)[8]) {
  if (t == DType::bf16) {
    const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + at);
    const unsigned words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)  // the lower half is the first element
      out[2 * i] = __uint_as_float(words[i] << 16), out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  } else {
    const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const float*>(base) + at);
    out[0] = __uint_as_float(w.x), out[1] = __uint_as_float(w.y), out[2] = __uint_as_float(w.z);
    out[3] = __uint_as_float(w.w);
  }
}

// f(r, c, d) for each of the tile's rows r < nrows and this thread's output columns d = tid + 128 c
// (unrolled: acc[r][c] stays in registers).
template <class F>
__device__ __forceinline__ void for_outputs(int tid, int D, int nrows, F&& f) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = tid + kThreads * c;
    if (d >= D) continue;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= nrows) break;
      f(r, c, d);
    }
  }
}

__global__ void __launch_bounds__(kThreads) decode_split_kernel(DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = p.head_dim;
  float* qs = reinterpret_cast<float*>(smem);  // [kRows][D], scaled to log2 units
  float* ks = qs + kRows * D;                  // [kKeys][D + 1]
  float* vs = ks + kKeys * (D + 1);            // [kKeys][D]
  float* ps = vs + kKeys * D;                  // [kRows][kKeys]
  float* alpha = ps + kRows * kKeys;           // [kRows]: this tile's rescaling of the running sums
  float* m_out = alpha + kRows;                // [kRows]
  float* l_out = m_out + kRows;                // [kRows]
  int64_t* kpos = reinterpret_cast<int64_t*>(l_out + kRows);  // [kKeys] (8-byte aligned: D % 16 == 0)

  const int split = blockIdx.x, g = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t r0 = int64_t(blockIdx.y) * kRows;
  const int nrows = p.rows_per_head() - r0 < kRows ? int(p.rows_per_head() - r0) : kRows;
  const int64_t j_begin = p.first + split * p.split_rows;
  const int64_t j_end = p.last < j_begin + p.split_rows ? p.last : j_begin + p.split_rows;
  const int64_t qp_lo = p.q_first + r0 / p.group, qp_hi = p.q_first + (r0 + nrows - 1) / p.group;

  for (int idx = tid; idx < kRows * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    qs[idx] = r < nrows ? load_element(p.q, p.q_type, o_index(p, g, r0 + r) + d) * p.scale_log2 : 0.0f;
  }
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRows][kChunks];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) m[i] = neg_inf(), l[i] = 0.0f;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[r][c] = 0.0f;

  const int64_t head0 = int64_t(g) * p.head_stride;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeys) {
    const int count = j_end - j0 < kKeys ? int(j_end - j0) : kKeys;
    // Positions ascend: the tile is hidden from every row when its first key is after the last
    // query or its last key before the first query's window (the same answer in every thread).
    const int64_t kp_lo = p.pos[j0], kp_hi = p.pos[j0 + count - 1];
    if (kp_lo > qp_hi || (p.window_left >= 0 && kp_hi < qp_lo - p.window_left)) continue;
    __syncthreads();  // the previous tile is no longer read
    // 16 bytes per load (8 bf16 or 4 fp32 elements; rows are 32-byte multiples), coalesced.
    const int per_vector = p.kv_type == DType::bf16 ? 8 : 4, vectors = D / per_vector;
    for (int idx = tid; idx < kKeys * vectors; idx += kThreads) {
      const int j = idx / vectors, d0 = idx % vectors * per_vector;
      float kx[8] = {}, vx[8] = {};
      if (j < count) {
        const int64_t at = (head0 + j0 + j) * D + d0;
        load_vector(p.k, p.kv_type, at, kx);
        load_vector(p.v, p.kv_type, at, vx);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e)  // (a constant bound keeps kx, vx in registers)
        if (e < per_vector) ks[j * (D + 1) + d0 + e] = kx[e], vs[j * D + d0 + e] = vx[e];
    }
    for (int j = tid; j < kKeys; j += kThreads) kpos[j] = j < count ? p.pos[j0 + j] : INT64_MAX;  // never visible
    __syncthreads();

#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + kWarps * i;
      if (r < nrows) {  // warp-uniform
        const float* qrow = qs + r * D;
        const float* krow = ks + lane * (D + 1);
        float s = 0.0f;
        for (int d = 0; d < D; ++d) s = fmaf(qrow[d], krow[d], s);
        const int64_t qp = p.q_first + (r0 + r) / p.group, kp = kpos[lane];
        const bool seen = kp <= qp && (p.window_left < 0 || kp >= qp - p.window_left);
        s = seen ? s : neg_inf();
        const float m_new = fmaxf(m[i], warp_max(s));
        // A row that has seen only masked keys keeps m = -inf; a finite stand-in keeps exp2 at 0, not NaN.
        const float m_safe = m_new == neg_inf() ? 0.0f : m_new;
        const float pr = exp2_approx(s - m_safe);
        const float a = exp2_approx(m[i] - m_safe);
        l[i] = fmaf(l[i], a, warp_sum(pr));
        m[i] = m_new;
        ps[r * kKeys + lane] = pr;
        if (lane == 0) alpha[r] = a;
      }
    }
    __syncthreads();

    for_outputs(tid, D, nrows, [&](int r, int c, int d) {
      float tile = 0.0f;  // this tile's P V from zero, then added to the running sum
      for (int j = 0; j < kKeys; ++j) tile = fmaf(ps[r * kKeys + j], vs[j * D + d], tile);
      acc[r][c] = fmaf(acc[r][c], alpha[r], tile);
    });
  }

  // The rows' statistics, from their warps to every thread.
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kWarps * i;
    if (r < nrows && lane == 0) m_out[r] = m[i], l_out[r] = l[i];
  }
  __syncthreads();

  // One split: the normalised state; several: this split's (acc, m, l) for the merge kernel.
  float* partial = p.splits == 1 ? nullptr
                                 : p.partial + ((int64_t(split) * p.kv_heads + g) * p.rows_per_head() + r0) * (D + 2);
  for_outputs(tid, D, nrows, [&](int r, int c, int d) {
    if (partial) partial[r * (D + 2) + d] = acc[r][c];
    else p.o[o_index(p, g, r0 + r) + d] = l_out[r] > 0.0f ? acc[r][c] / l_out[r] : 0.0f;
  });
  if (tid >= nrows) return;
  if (partial) {
    partial[tid * (D + 2) + D] = m_out[tid], partial[tid * (D + 2) + D + 1] = l_out[tid];
  } else {
    const float lr = l_out[tid];
    p.lse[lse_index(p, g, r0 + tid)] = lr > 0.0f ? lse_of(m_out[tid], lr) : neg_inf();
  }
}

__global__ void __launch_bounds__(kThreads) decode_merge_kernel(DecodeParams p) {
  const int D = p.head_dim;
  const int64_t rows = p.rows_per_head(), at = blockIdx.x;  // (kv head, row)
  const int g = int(at / rows);
  const int64_t row = at % rows;
  const int64_t split_stride = int64_t(p.kv_heads) * rows * (D + 2);
  const float* first = p.partial + at * (D + 2);
  float m_all = neg_inf();
  for (int s = 0; s < p.splits; ++s) m_all = fmaxf(m_all, first[s * split_stride + D]);
  double l_all = 0.0, o[kChunks] = {};
  if (m_all != neg_inf())
    for (int s = 0; s < p.splits; ++s) {
      const float* state = first + s * split_stride;
      const float ls = state[D + 1];
      if (ls == 0.0f) continue;  // no visible key in this split
      const double w = exp2(double(state[D]) - double(m_all));
      l_all += w * double(ls);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = threadIdx.x + kThreads * c;
        if (d < D) o[c] += w * double(state[d]);
      }
    }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = threadIdx.x + kThreads * c;
    if (d < D) p.o[o_index(p, g, row) + d] = l_all > 0.0 ? float(o[c] / l_all) : 0.0f;
  }
  if (threadIdx.x == 0)
    p.lse[lse_index(p, g, row)] = l_all > 0.0 ? float(double(m_all) * double(kLn2) + log(l_all)) : neg_inf();
}

// The all-reduce merge's halves: one thread per element of O (its row's w recomputed: one exp).
struct StateShape {
  int64_t batch, rows, heads, head_dim;
  __device__ int64_t elements() const { return batch * rows * heads * head_dim; }
  // The lse index of O's element `idx`, and whether it is its row's first.
  __device__ int64_t row_of(int64_t idx, bool* first) const {
    const int64_t d = idx % head_dim, rest = idx / head_dim, h = rest % heads, i = rest / heads % rows,
                  b = rest / heads / rows;
    *first = d == 0;
    return (b * heads + h) * rows + i;
  }
};

__global__ void weigh_states_kernel(StateShape sh, const float* o, const float* lse, const float* max_lse,
                                    float* sums) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, n = sh.elements();
  if (idx >= n) return;
  bool first = false;
  const int64_t s = sh.row_of(idx, &first);
  const float w = max_lse[s] == neg_inf() || lse[s] == neg_inf() ? 0.0f : expf(lse[s] - max_lse[s]);
  sums[idx] = o[idx] * w;
  if (first) sums[n + s] = w;
}

__global__ void finish_weighted_states_kernel(StateShape sh, const float* sums, const float* max_lse, float* o,
                                              float* lse) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, n = sh.elements();
  if (idx >= n) return;
  bool first = false;
  const int64_t s = sh.row_of(idx, &first);
  const float total = sums[n + s];
  o[idx] = total > 0.0f ? sums[idx] / total : 0.0f;
  if (first) lse[s] = total > 0.0f ? max_lse[s] + logf(total) : neg_inf();
}

unsigned elementwise_blocks(const StateShape& sh) {
  return unsigned((sh.batch * sh.rows * sh.heads * sh.head_dim + 255) / 256);
}

// Keys per split (a multiple of the tile) for `visible` rows: one split below 2 kMinSplitKeys.
int64_t split_rows_for(const AttentionDims& dims, int64_t tokens, int64_t visible) {
  int64_t splits = std::max<int64_t>(1, visible / kMinSplitKeys);
  splits = std::min(splits, kMaxSplits);
  splits = std::min(splits, std::max<int64_t>(1, kPartialRows / std::max<int64_t>(1, dims.heads * tokens)));
  const int64_t per = (visible + splits - 1) / splits;
  return (per + kKeys - 1) / kKeys * kKeys;
}

}  // namespace
}  // namespace ringattn::kernels::gpu

namespace ringattn::kernels {

bool cuda_decode_supports_head_dim(int64_t head_dim) {
  return head_dim >= 16 && head_dim <= gpu::kMaxHeadDim && head_dim % 16 == 0;
}

size_t cuda_decode_workspace_bytes(int64_t head_dim) {
  return size_t(gpu::kPartialRows) * size_t(head_dim + 2) * sizeof(float);
}

int64_t cuda_decode_splits(const AttentionDims& dims, int64_t tokens, int64_t visible_rows) {
  if (visible_rows <= 0 || tokens <= 0) return 0;
  const int64_t per = gpu::split_rows_for(dims, tokens, visible_rows);
  return (visible_rows + per - 1) / per;
}

void cuda_decode_forward(const AttentionDims& dims, const CudaDecodeQueries& q, const CudaCachedRows& kv,
                         int64_t window_left, const AttentionState& state, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  using namespace gpu;
  if (dims.heads < 1 || dims.kv_heads < 1 || dims.heads % dims.kv_heads != 0 || dims.heads > 65535)
    throw std::invalid_argument("CUDA decode: heads must be a positive multiple of kv_heads");
  if (!cuda_decode_supports_head_dim(dims.head_dim))
    throw std::invalid_argument("CUDA decode: head_dim " + std::to_string(dims.head_dim) +
                                " is not supported (multiples of 16 up to 256)");
  if (kv.dtype != DType::bf16 && kv.dtype != DType::f32)
    throw std::invalid_argument("CUDA decode: the cache holds bf16 or fp32");
  if (!aligned(kv.k, 16) || !aligned(kv.v, 16))
    throw std::invalid_argument("CUDA decode: the cache's K and V must be 16-byte aligned");
  const int64_t T = q.tokens, H = dims.heads, D = dims.head_dim, visible = kv.last - kv.first;
  if (T < 1) return;
  if (visible <= 0) {  // an empty share: O = 0, LSE = -inf
    cuda_fill(state.o, size_t(T * H * D), 0.0f, stream);
    cuda_fill(state.lse, size_t(H * T), -std::numeric_limits<float>::infinity(), stream);
    return;
  }
  DecodeParams p;
  p.heads = int(H), p.kv_heads = int(dims.kv_heads), p.group = int(H / dims.kv_heads), p.head_dim = int(D);
  p.tokens = T;
  p.scale_log2 = dims.scale * kLog2e;
  p.q = q.q, p.q_type = q.dtype, p.q_first = q.first_pos;
  p.k = kv.k, p.v = kv.v, p.kv_type = kv.dtype, p.head_stride = kv.head_stride, p.pos = kv.pos;
  p.first = kv.first, p.last = kv.last;
  p.window_left = window_left;
  p.split_rows = split_rows_for(dims, T, visible);
  p.splits = int((visible + p.split_rows - 1) / p.split_rows);
  p.o = state.o, p.lse = state.lse;
  const int64_t groups = (p.rows_per_head() + kRows - 1) / kRows;
  if (groups > 65535 || dims.kv_heads > 65535)
    throw std::invalid_argument("CUDA decode: too many query rows or heads for one launch");
  if (p.splits > 1) {
    if (!workspace || workspace_bytes < cuda_decode_workspace_bytes(D))
      throw std::invalid_argument("CUDA decode: the workspace is missing or smaller than cuda_decode_workspace_bytes");
    p.partial = static_cast<float*>(workspace);
  }
  const size_t shared = sizeof(float) * size_t(kRows * D + kKeys * (D + 1) + kKeys * D + kRows * kKeys + 3 * kRows) +
                        sizeof(int64_t) * kKeys;
  launch_with_shared_memory(decode_split_kernel, dim3(unsigned(p.splits), unsigned(groups), unsigned(dims.kv_heads)),
                            dim3(kThreads), shared, stream, p);
  if (p.splits > 1) {
    launch_kernel(decode_merge_kernel, dim3(unsigned(dims.kv_heads * p.rows_per_head())), dim3(kThreads), 0, stream,
                  p);
    RINGATTN_CUDA_CHECK_LAUNCH("decode merge");
  }
}

void cuda_weigh_states(const AttentionDims& dims, int64_t rows, const float* o, const float* lse, const float* max_lse,
                       float* sums, cudaStream_t stream) {
  const gpu::StateShape sh{dims.batch, rows, dims.heads, dims.head_dim};
  if (gpu::elementwise_blocks(sh) == 0) return;
  gpu::launch_kernel(gpu::weigh_states_kernel, dim3(gpu::elementwise_blocks(sh)), dim3(256), 0, stream, sh, o, lse,
                     max_lse, sums);
  RINGATTN_CUDA_CHECK_LAUNCH("weighing states");
}

void cuda_finish_weighted_states(const AttentionDims& dims, int64_t rows, const float* sums, const float* max_lse,
                                 float* o, float* lse, cudaStream_t stream) {
  const gpu::StateShape sh{dims.batch, rows, dims.heads, dims.head_dim};
  if (gpu::elementwise_blocks(sh) == 0) return;
  gpu::launch_kernel(gpu::finish_weighted_states_kernel, dim3(gpu::elementwise_blocks(sh)), dim3(256), 0, stream, sh,
                     sums, max_lse, o, lse);
  RINGATTN_CUDA_CHECK_LAUNCH("finishing weighted states");
}

}  // namespace ringattn::kernels
