// Elementwise fp32 kernels on device memory, queued on a CUDA stream: what a backend needs
// around the attention kernels (filling states, adding gradient partials).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace ringattn::kernels {

void cuda_fill(float* p, size_t n, float value, cudaStream_t stream);
// dst += src
void cuda_add(float* dst, const float* src, size_t n, cudaStream_t stream);

}  // namespace ringattn::kernels
