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

}  // namespace ringattn::kernels
