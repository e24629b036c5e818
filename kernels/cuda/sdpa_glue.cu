// The CUDA backend's kernels around cuDNN's SDPA calls (kernels/cuda/sdpa_glue.hpp).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sdpa_glue.hpp"

namespace ringattn::kernels {
namespace {

constexpr int kThreads = 256;

// One thread per (sequence, head, row): the row's D outputs and its LSE.
__global__ void merge_kernel(AttentionDims dims, int64_t q_rows, const cudnn::SdpaSegment* segments, int64_t nseg,
                             int64_t s_q, const bf16_bits* o_call, const float* stats, AttentionState state,
                             int64_t total) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t H = dims.heads, D = dims.head_dim;
  const int64_t r = t % s_q, h = (t / s_q) % H, n = t / (s_q * H);
  const cudnn::SdpaSegment seg = segments[n % nseg];
  const int64_t b = n / nseg;
  if (r >= seg.q_rows) return;
  const float l2 = stats[t];
  if (!(l2 > -INFINITY)) return;  // -inf or NaN: the row saw nothing in this call
  const int64_t i = seg.q_row0 + r;
  float& l1 = state.lse[(b * H + h) * q_rows + i];
  const float m = fmaxf(l1, l2);
  const float w1 = l1 == -INFINITY ? 0.0f : expf(l1 - m), w2 = expf(l2 - m), sum = w1 + w2;
  float* o = state.o + ((b * q_rows + i) * H + h) * D;
  const bf16_bits* oc = o_call + ((b * q_rows + i) * H + h) * D;
  for (int64_t d = 0; d < D; ++d) o[d] = (w1 * o[d] + w2 * bf16_to_float(oc[d])) / sum;
  l1 = m + logf(sum);
}

__global__ void gather_kernel(AttentionDims dims, int64_t q_rows, const cudnn::SdpaSegment* segments, int64_t nseg,
                              int64_t s_q, const float* lse, float* stats, int64_t total) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t H = dims.heads;
  const int64_t r = t % s_q, h = (t / s_q) % H, n = t / (s_q * H);
  const cudnn::SdpaSegment seg = segments[n % nseg];
  stats[t] = r < seg.q_rows ? lse[((n / nseg) * H + h) * q_rows + seg.q_row0 + r] : 0.0f;
}

__global__ void add_rows_kernel(float* dst, const bf16_bits* src, int64_t rows, int64_t row_elems, int64_t row0,
                                int64_t count, int64_t total) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t per_batch = count * row_elems;
  const int64_t e = (t / per_batch) * rows * row_elems + row0 * row_elems + t % per_batch;
  dst[e] += bf16_to_float(src[e]);
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void cuda_merge_sdpa_output(const AttentionDims& dims, int64_t q_rows, const cudnn::SdpaSegment* segments, int64_t nseg,
                            int64_t s_q, const bf16_bits* o_call, const float* stats, const AttentionState& state,
                            cudaStream_t stream) {
  const int64_t total = dims.batch * nseg * dims.heads * s_q;
  if (total == 0) return;
  gpu::launch_kernel(merge_kernel, blocks_for(total), kThreads, 0, stream, dims, q_rows, segments, nseg, s_q, o_call,
                     stats, state, total);
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_merge_sdpa_output");
}

void cuda_gather_sdpa_stats(const AttentionDims& dims, int64_t q_rows, const cudnn::SdpaSegment* segments, int64_t nseg,
                            int64_t s_q, const float* lse, float* stats, cudaStream_t stream) {
  const int64_t total = dims.batch * nseg * dims.heads * s_q;
  if (total == 0) return;
  gpu::launch_kernel(gather_kernel, blocks_for(total), kThreads, 0, stream, dims, q_rows, segments, nseg, s_q, lse,
                     stats, total);
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_gather_sdpa_stats");
}

void cuda_add_sdpa_rows(float* dst, const bf16_bits* src, int64_t batch, int64_t rows, int64_t row_elems, int64_t row0,
                        int64_t count, cudaStream_t stream) {
  const int64_t total = batch * count * row_elems;
  if (total == 0) return;
  gpu::launch_kernel(add_rows_kernel, blocks_for(total), kThreads, 0, stream, dst, src, rows, row_elems, row0, count,
                     total);
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_add_sdpa_rows");
}

}  // namespace ringattn::kernels
