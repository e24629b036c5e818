// Elementwise fp32 kernels (kernels/cuda/elementwise.hpp): grid-stride loops.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.hpp"

namespace ringattn::kernels {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

__global__ void fill_kernel(float* p, size_t n, float value) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = value;
}

__global__ void add_kernel(float* dst, const float* src, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

__global__ void add_bias_kernel(float* y, const float* bias, size_t n, size_t cols) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] += bias[i % cols];
}

__global__ void round_to_bf16_kernel(bf16_bits* dst, const float* src, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = float_to_bf16(src[i]);
}

// Thread i handles plane i % planes of head vector i / planes, (batch, rows, heads) in order: the
// planes of one head are neighbours, so a warp reads consecutive addresses.
__global__ void rotate_kernel(float* x, RotaryTable table, size_t n, int64_t heads, float sign) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t vector = i / size_t(table.planes);
    const int64_t row = int64_t(vector / size_t(heads)) % table.rows;
    rotate_plane(table, row, x + vector * size_t(table.head_dim), int64_t(i % size_t(table.planes)), sign);
  }
}

unsigned blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return b < kMaxBlocks ? unsigned(b) : kMaxBlocks;
}

}  // namespace

void cuda_fill(float* p, size_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  gpu::launch_kernel(fill_kernel, blocks_for(n), kThreads, 0, stream, p, n, value);
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_fill");
}

void cuda_add(float* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gpu::launch_kernel(add_kernel, blocks_for(n), kThreads, 0, stream, dst, src, n);
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_add");
}

void cuda_add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  const size_t n = size_t(rows) * size_t(cols);
  if (n == 0) return;
  gpu::launch_kernel(add_bias_kernel, blocks_for(n), kThreads, 0, stream, y, bias, n, size_t(cols));
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_add_bias");
}

void cuda_round_to_bf16(bf16_bits* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gpu::launch_kernel(round_to_bf16_kernel, blocks_for(n), kThreads, 0, stream, dst, src, n);
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_round_to_bf16");
}

void cuda_rotate(float* x, const RotaryTable& table, int64_t batch, int64_t heads, bool inverse, cudaStream_t stream) {
  const size_t n = size_t(batch) * size_t(table.rows) * size_t(heads) * size_t(table.planes);
  if (n == 0) return;
  gpu::launch_kernel(rotate_kernel, blocks_for(n), kThreads, 0, stream, x, table, n, heads, inverse ? -1.0f : 1.0f);
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_rotate");
}

}  // namespace ringattn::kernels
