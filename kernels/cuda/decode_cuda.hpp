// The CUDA decode kernel: a few new tokens of one sequence against its cached K/V rows on this
// rank, giving the partial state (O, LSE) the ranks then merge. The semantics of the CPU decode
// kernel (kernels/cpu/decode_cpu.hpp: the cache's head-major layout, causal + left window, O = 0
// and LSE = -inf for a row that sees no key), with every pointer in device memory and the work
// queued on a stream.
//
// Split-KV (FlashDecoding): decode reads every cached row once per step and is bound by memory
// bandwidth, while one query row per (token, head) leaves a query tile nearly empty. So the
// G = H / Hkv query heads of a group (times the new tokens) are the rows of one thread block's
// tile, the visible rows are split along the keys among thread blocks (grid: splits x row groups
// x Hkv), each split's partial state goes to a workspace, and a second kernel merges the splits'
// states in split order (double sums, LSE rounded once). The split count depends on the shapes
// only, never on the device: the same inputs give the same bits on every GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention.hpp"

namespace ringattn::kernels {

// The new tokens of one sequence: q (tokens, H, D) on the device, at consecutive positions
// first_pos, first_pos + 1, ... (decode's and a pass-Q prefill's new tokens always are).
struct CudaDecodeQueries {
  const void* q = nullptr;
  DType dtype = DType::f32;
  int64_t tokens = 1;
  int64_t first_pos = 0;
};

// One sequence's cached rows on this rank, head-major (head g's row j at k + (g * head_stride +
// j) * D elements), positions ascending on the device; only rows [first, last) are read: the
// caller's decode_visible_rows (the host holds the positions too).
struct CudaCachedRows {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::f32;
  int64_t head_stride = 0;
  const int64_t* pos = nullptr;
  int64_t first = 0, last = 0;
};

// Head dims the decode kernel supports: multiples of 16 up to 256.
bool cuda_decode_supports_head_dim(int64_t head_dim);
// Bytes of device workspace every call with this head dim needs at most (the splits' partial
// states; independent of the cache's length, the heads and the tokens).
size_t cuda_decode_workspace_bytes(int64_t head_dim);
// The splits along the keys a call makes (1: no workspace is used, no merge kernel runs).
int64_t cuda_decode_splits(const AttentionDims& dims, int64_t tokens, int64_t visible_rows);

// Writes state.o (tokens, H, D) normalised and state.lse (H, tokens) (device memory) of the
// queries against kv's rows [first, last) under causal + window_left (-1: unbounded). `workspace`
// holds cuda_decode_workspace_bytes(dims.head_dim). dims.batch is ignored (one sequence).
// Asynchronous on `stream`.
void cuda_decode_forward(const AttentionDims& dims, const CudaDecodeQueries& q, const CudaCachedRows& kv,
                         int64_t window_left, const AttentionState& state, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);

// The all-reduce merge's local halves (kernels/cpu/state_weights.hpp's semantics), on device
// memory, asynchronous on `stream`.
void cuda_weigh_states(const AttentionDims& dims, int64_t rows, const float* o, const float* lse, const float* max_lse,
                       float* sums, cudaStream_t stream);
void cuda_finish_weighted_states(const AttentionDims& dims, int64_t rows, const float* sums, const float* max_lse,
                                 float* o, float* lse, cudaStream_t stream);

}  // namespace ringattn::kernels
