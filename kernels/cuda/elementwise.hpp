// Elementwise fp32 kernels on device memory, queued on a CUDA stream: what a backend needs
// around the attention kernels (filling states, adding gradient partials), and what the LoRA
// layer does around its GEMMs (biases, rotary embeddings, rounding GEMM operands to bf16).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/rotary.hpp"
#include "util/dtype.hpp"

namespace ringattn::kernels {

void cuda_fill(float* p, size_t n, float value, cudaStream_t stream);
// dst += src
void cuda_add(float* dst, const float* src, size_t n, cudaStream_t stream);

// y (rows, cols) += bias (cols,), the bias broadcast over the rows.
void cuda_add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// dst = src rounded to bfloat16 (float_to_bf16: to nearest even, as the CPU rounds).
void cuda_round_to_bf16(bf16_bits* dst, const float* src, size_t n, cudaStream_t stream);
// Rotates x (batch, table.rows, heads, table.head_dim) in place by the table's angles (kernels/rotary.hpp),
// whose cos and sin are device memory; inverse = by the opposite angles. One thread per plane.
void cuda_rotate(float* x, const RotaryTable& table, int64_t batch, int64_t heads, bool inverse, cudaStream_t stream);

}  // namespace ringattn::kernels
