// Blockwise exact attention on an NVIDIA GPU: the semantics of kernels/attention.hpp (same
// layouts, same partial states, same masks), with every pointer in device memory (positions
// and the MaskView's arrays too) and work queued on a CUDA stream. Built only when
// RINGATTN_HAVE_CUDA; compiled for sm_80 and newer.
//
// Two implementations behind one call:
//  - tensor cores (mma.sync m16n8k16 fed by ldmatrix, bf16 or fp16 inputs, head dims 64, 96, 128
//    and 256): FlashAttention-2 tiles, P and dS rounded to the input type for their products, fp32
//    accumulation;
//  - "simple" CUDA-core fp32 kernels for every other case (fp32 inputs, other head dims up to 256),
//    also selectable for any input as a cross-check (CudaOptions::kernel, RINGATTN_CUDA_KERNEL=simple).
// Both skip key blocks the mask hides before any arithmetic (kernels/mask/tile_plan.hpp) and
// apply the element mask on partial blocks only. The backward pass is deterministic: the tensor-core
// kernel (one pass over key blocks, FlashAttention-2's 5 products) adds each key block's part of
// dQ in ascending key block order; the simple kernels compute dQ and dK/dV separately.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention.hpp"
#include "kernels/mask/mask_view.hpp"

namespace ringattn::kernels {

// As QueryRows / KeyValueRows, with device pointers (pos too).
struct CudaQueryRows {
  const void* data = nullptr;  // Q (B, rows, H, D)
  DType type = DType::bf16;
  int64_t rows = 0;
  const int64_t* pos = nullptr;
};

struct CudaKeyValueRows {
  const void* k = nullptr;  // (B, rows, Hkv, D)
  const void* v = nullptr;
  DType type = DType::bf16;
  int64_t rows = 0;
  const int64_t* pos = nullptr;
};

enum class CudaKernel : uint8_t {
  automatic,    // tensor cores when supported (cuda_tensor_cores_apply), else simple
  tensor_core,  // tensor cores or std::invalid_argument
  simple,       // CUDA-core fp32 kernels
};

struct CudaOptions {
  cudaStream_t stream = nullptr;
  CudaKernel kernel = CudaKernel::automatic;
  // Device memory the tensor-core backward pass may use for its bookkeeping (the order of its dQ
  // additions), of cuda_attention_backward_workspace_bytes; while it is null or smaller, each
  // backward call allocates its own (stream-ordered, cudaMallocAsync). Not shared between calls
  // that may run at the same time.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// True when the tensor-core kernels handle these inputs: bf16/fp16, head_dim 64, 96, 128 or 256,
// and 16-byte aligned Q/K/V/dO pointers (and, checked per call, a block mask of fewer than 2^31
// positions). (RINGATTN_CUDA_KERNEL=simple turns `automatic` to simple.)
bool cuda_tensor_cores_apply(const AttentionDims& dims, DType type, const void* q, const void* k, const void* v,
                             const void* dout = nullptr);
// Head dims any CUDA kernel supports: 1..256 (the tensor-core path: 64, 96, 128 and 256).
bool cuda_supports_head_dim(int64_t head_dim);
// Which kernel a call with these options and inputs runs: "tensor_core" or "simple".
const char* cuda_kernel_name(const AttentionDims& dims, DType type, const void* q, const void* k, const void* v,
                             const CudaOptions& options);

// Attends the queries to the keys/values and merges the result into `state` (device memory;
// it holds the queries' result over other keys, or is empty: O = 0, LSE = -inf). Asynchronous
// on options.stream. The mask's doc_offsets and block_mask must be device pointers (its run
// index pointers are ignored).
void cuda_attention_forward(const AttentionDims& dims, const CudaQueryRows& q, const CudaKeyValueRows& kv,
                            const MaskView& mask, const AttentionState& state, const CudaOptions& options);

// dst <- merge(dst, src), as merge_states.
void cuda_merge_states(const AttentionDims& dims, int64_t rows, const AttentionState& dst, const float* src_o,
                       const float* src_lse, cudaStream_t stream);

// delta = rowsum(dO * O), (B, H, rows).
void cuda_attention_delta(const AttentionDims& dims, int64_t rows, const float* o, const void* dout,
                          DType dout_type, float* delta, cudaStream_t stream);

// As attention_backward: dq += dL/dQ through these keys, dk += dL/dK, dv += dL/dV (fp32).
// `dout` has the layout and type of q.data. Deterministic: bitwise the same on every run (the
// tensor-core kernel adds to dQ in a fixed order of key blocks; the simple kernels use no atomics).

void cuda_attention_backward(const AttentionDims& dims, const CudaQueryRows& q, const CudaKeyValueRows& kv,
                             const void* dout, const float* lse, const float* delta, float* dq, float* dk, float* dv,
                             const MaskView& mask, const CudaOptions& options);

// Bytes of CudaOptions::workspace a backward call over `q_rows` query rows uses (O(batch x heads x
// q_rows / 16): one flag per query tile and head); 0 for head dims off the tensor cores.
size_t cuda_attention_backward_workspace_bytes(const AttentionDims& dims, int64_t q_rows);

}  // namespace ringattn::kernels
