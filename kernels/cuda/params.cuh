// One parameter struct for every attention kernel launch (FlashAttention's Flash_fwd_params
// idea), and the launchers each implementation provides. Private to kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/mask/mask_view.hpp"

namespace ringattn::kernels::gpu {

struct AttentionParams {
  int64_t batch = 1, heads = 1, kv_heads = 1;
  int head_dim = 64;
  float scale = 0.125f;
  DType type = DType::bf16;

  const void* q = nullptr;  // (B, q_rows, H, D); dout has the same layout and type
  int64_t q_rows = 0;
  const int64_t* q_pos = nullptr;
  const void* k = nullptr;  // (B, k_rows, Hkv, D)
  const void* v = nullptr;
  int64_t k_rows = 0;
  const int64_t* k_pos = nullptr;
  MaskView mask;  // device pointers; run index unused

  // Forward: the state, read and rewritten.
  float* o = nullptr;    // (B, q_rows, H, D)
  float* lse = nullptr;  // (B, H, q_rows)

  // Backward.
  const void* dout = nullptr;
  const float* lse_in = nullptr;  // (B, H, q_rows), natural log
  const float* delta = nullptr;   // (B, H, q_rows)
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  int* dq_flags = nullptr;  // tensor cores: per query tile and head, the last key block that added to dQ, + 1

  // Query heads per K/V head; a 32-bit division (heads fit: the launches check them), which the
  // GPU does inline rather than through the 64-bit division subroutine.
  __host__ __device__ int group() const { return int(heads) / int(kv_heads); }
};

// CUDA-core fp32 kernels (any element type, head_dim <= 256).
void forward_simple(const AttentionParams& p, cudaStream_t stream);
void backward_simple(const AttentionParams& p, cudaStream_t stream);

// Tensor-core kernels (bf16/fp16, head_dim 64, 96, 128 or 256, 16-byte aligned inputs).
void forward_tensor_core(const AttentionParams& p, cudaStream_t stream);
// The flags of the ordered dQ additions live in `workspace` when it holds
// backward_workspace_bytes(...), else in memory the call allocates (stream-ordered).
void backward_tensor_core(const AttentionParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);
size_t backward_workspace_bytes(int head_dim, int64_t batch, int64_t heads, int64_t q_rows);

constexpr int kSimpleMaxHeadDim = 256;

}  // namespace ringattn::kernels::gpu
