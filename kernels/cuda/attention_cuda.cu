// The public entry points of kernels/cuda/attention_cuda.hpp: argument checks, the choice between the
// tensor-core and the simple kernels, and the small kernels (merge of states, delta).
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/params.cuh"
#include "kernels/cuda/tensor_core_launch.cuh"

namespace ringattn::kernels {
namespace {

using gpu::AttentionParams;

void check_dims(const AttentionDims& dims, const char* what) {
  if (dims.batch < 1 || dims.heads < 1 || dims.kv_heads < 1 || dims.heads % dims.kv_heads != 0)
    throw std::invalid_argument(std::string(what) + ": heads must be a positive multiple of kv_heads");
  if (!cuda_supports_head_dim(dims.head_dim))
    throw std::invalid_argument(std::string(what) + ": head_dim " + std::to_string(dims.head_dim) +
                                " is not supported by the CUDA kernels (1 to 256)");
}

bool forced_simple() {
  const char* env = std::getenv("RINGATTN_CUDA_KERNEL");
  if (!env || !*env || std::strcmp(env, "auto") == 0 || std::strcmp(env, "tensor_core") == 0) return false;
  if (std::strcmp(env, "simple") == 0) return true;
  throw std::invalid_argument(std::string("RINGATTN_CUDA_KERNEL=") + env + ": expected auto, tensor_core or simple");
}

// The tensor-core kernels divide positions by the block mask's block size in 32 bits.
bool block_mask_fits_32_bits(const MaskView& mask) {
  return !mask.has_block_mask() || (mask.mask_block > 0 && mask.block_count * mask.mask_block < (int64_t(1) << 31));
}

bool use_tensor_cores(const AttentionDims& dims, DType type, const void* q, const void* k, const void* v,
                      const void* dout, const MaskView& mask, const CudaOptions& options, const char* what) {
  const bool supported = cuda_tensor_cores_apply(dims, type, q, k, v, dout) && block_mask_fits_32_bits(mask);
  switch (options.kernel) {
    case CudaKernel::simple:
      return false;
    case CudaKernel::tensor_core:
      if (!supported)
        throw std::invalid_argument(std::string(what) +
                                    ": the tensor-core kernels need bf16 or fp16 inputs, head_dim "
                                    "64, 96, 128 or 256, 16-byte aligned pointers and a block mask of "
                                    "fewer than 2^31 positions");
      return true;
    case CudaKernel::automatic:
      break;
  }
  return supported && !forced_simple();
}

AttentionParams make_params(const AttentionDims& dims, const CudaQueryRows& q, const CudaKeyValueRows& kv,
                            const MaskView& mask) {
  if (q.type != kv.type) throw std::invalid_argument("CUDA attention: Q and K/V must have the same element type");
  AttentionParams p;
  p.batch = dims.batch;
  p.heads = dims.heads;
  p.kv_heads = dims.kv_heads;
  p.head_dim = static_cast<int>(dims.head_dim);
  p.scale = dims.scale;
  p.type = q.type;
  p.q = q.data;
  p.q_rows = q.rows;
  p.q_pos = q.pos;
  p.k = kv.k;
  p.v = kv.v;
  p.k_rows = kv.rows;
  p.k_pos = kv.pos;
  p.mask = mask;
  p.mask.row_run_ptr = nullptr;  // host-side index; the kernels classify blocks themselves
  p.mask.row_runs = nullptr;
  p.mask.col_run_ptr = nullptr;
  p.mask.col_runs = nullptr;
  return p;
}

__global__ void merge_kernel(int64_t batch, int64_t heads, int64_t rows, int head_dim, float* dst_o, float* dst_lse,
                             const float* src_o, const float* src_lse) {
  // One warp per (b, i, h) row.
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= batch * rows * heads) return;
  const int64_t h = row % heads, i = (row / heads) % rows, b = row / (heads * rows);
  const int64_t at = (b * heads + h) * rows + i;
  const float l1 = dst_lse[at], l2 = src_lse[at];
  const float m = fmaxf(l1, l2);
  if (m == gpu::neg_inf()) return;  // neither side saw a key
  const float w1 = expf(l1 - m), w2 = expf(l2 - m), sum = w1 + w2;
  float* o1 = dst_o + row * head_dim;
  const float* o2 = src_o + row * head_dim;
  for (int d = lane; d < head_dim; d += 32) o1[d] = (o1[d] * w1 + o2[d] * w2) / sum;
  __syncwarp();
  if (lane == 0) dst_lse[at] = m + logf(sum);
}

__global__ void delta_kernel(int64_t batch, int64_t heads, int64_t rows, int head_dim, const float* o, const void* dout,
                             DType type, float* delta) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // (b, i, h)
  const int lane = threadIdx.x % 32;
  if (row >= batch * rows * heads) return;
  const int64_t h = row % heads, i = (row / heads) % rows, b = row / (heads * rows);
  float sum = 0.0f;
  for (int d = lane; d < head_dim; d += 32)
    sum += o[row * head_dim + d] * gpu::load_element(dout, type, row * head_dim + d);
  sum = gpu::warp_sum(sum);
  if (lane == 0) delta[(b * heads + h) * rows + i] = sum;
}

unsigned warp_rows_grid(int64_t rows, const char* what) {
  const int64_t blocks = (rows + 7) / 8;  // 8 warps of 32 per block of 256 threads
  if (blocks > 0x7fffffff) throw std::invalid_argument(std::string(what) + ": too many rows for one launch");
  return static_cast<unsigned>(blocks);
}

}  // namespace

namespace gpu {
int arch_family() {
  int device = 0, major = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  RINGATTN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9 ? 90 : 80;
}
}  // namespace gpu

bool cuda_supports_head_dim(int64_t head_dim) { return head_dim >= 1 && head_dim <= gpu::kSimpleMaxHeadDim; }

bool cuda_tensor_cores_apply(const AttentionDims& dims, DType type, const void* q, const void* k, const void* v,
                             const void* dout) {
  if (type == DType::f32) return false;
  if (dims.head_dim != 64 && dims.head_dim != 96 && dims.head_dim != 128 && dims.head_dim != 256) return false;
  for (const void* p : {q, k, v, dout})
    if (p && !gpu::aligned(p, 16)) return false;
  return true;
}

const char* cuda_kernel_name(const AttentionDims& dims, DType type, const void* q, const void* k, const void* v,
                             const CudaOptions& options) {
  const bool tensor = use_tensor_cores(dims, type, q, k, v, nullptr, MaskView{}, options, "cuda_kernel_name");
  return tensor ? "tensor_core" : "simple";
}

void cuda_attention_forward(const AttentionDims& dims, const CudaQueryRows& q, const CudaKeyValueRows& kv,
                            const MaskView& mask, const AttentionState& state, const CudaOptions& options) {
  check_dims(dims, "cuda_attention_forward");
  if (q.rows == 0 || kv.rows == 0) return;
  AttentionParams p = make_params(dims, q, kv, mask);
  p.o = state.o;
  p.lse = state.lse;
  if (use_tensor_cores(dims, q.type, q.data, kv.k, kv.v, nullptr, mask, options, "cuda_attention_forward")) {
    if (!gpu::aligned(state.o, 8))
      throw std::invalid_argument("cuda_attention_forward: the state's O must be 8-byte aligned");
    gpu::forward_tensor_core(p, options.stream);
  } else {
    gpu::forward_simple(p, options.stream);
  }
}

void cuda_attention_backward(const AttentionDims& dims, const CudaQueryRows& q, const CudaKeyValueRows& kv,
                             const void* dout, const float* lse, const float* delta, float* dq, float* dk, float* dv,
                             const MaskView& mask, const CudaOptions& options) {
  check_dims(dims, "cuda_attention_backward");
  if (q.rows == 0 || kv.rows == 0) return;
  AttentionParams p = make_params(dims, q, kv, mask);
  p.dout = dout;
  p.lse_in = lse;
  p.delta = delta;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  if (use_tensor_cores(dims, q.type, q.data, kv.k, kv.v, dout, mask, options, "cuda_attention_backward")) {
    if (!gpu::aligned(dq, 8) || !gpu::aligned(dk, 8) || !gpu::aligned(dv, 8))
      throw std::invalid_argument("cuda_attention_backward: dq, dk and dv must be 8-byte aligned");
    gpu::backward_tensor_core(p, options.workspace, options.workspace_bytes, options.stream);
  } else {
    gpu::backward_simple(p, options.stream);
  }
}

size_t cuda_attention_backward_workspace_bytes(const AttentionDims& dims, int64_t q_rows) {
  if (!cuda_tensor_cores_apply(dims, DType::bf16, nullptr, nullptr, nullptr) || q_rows <= 0) return 0;
  return gpu::backward_workspace_bytes(static_cast<int>(dims.head_dim), dims.batch, dims.heads, q_rows);
}

void cuda_merge_states(const AttentionDims& dims, int64_t rows, const AttentionState& dst, const float* src_o,
                       const float* src_lse, cudaStream_t stream) {
  const int64_t n = dims.batch * rows * dims.heads;
  if (n == 0) return;
  gpu::launch_kernel(merge_kernel, warp_rows_grid(n, "cuda_merge_states"), 256, 0, stream, dims.batch, dims.heads, rows,
                     static_cast<int>(dims.head_dim), dst.o, dst.lse, src_o, src_lse);
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_merge_states");
}

void cuda_attention_delta(const AttentionDims& dims, int64_t rows, const float* o, const void* dout,
                          DType dout_type, float* delta, cudaStream_t stream) {
  const int64_t n = dims.batch * rows * dims.heads;
  if (n == 0) return;
  gpu::launch_kernel(delta_kernel, warp_rows_grid(n, "cuda_attention_delta"), 256, 0, stream, dims.batch, dims.heads,
                     rows, static_cast<int>(dims.head_dim), o, dout, dout_type, delta);
  RINGATTN_CUDA_CHECK_LAUNCH("cuda_attention_delta");
}

}  // namespace ringattn::kernels
