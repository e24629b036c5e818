// What the LoRA layer's algorithm (layer.cpp, projection.cpp) asks of the place it runs: GEMMs
// and a few elementwise operations on its memory. One algorithm, two implementations:
//
//   CPU    host memory; GEMMs by OpenBLAS sgemm (bf16 operands widened to fp32 first, which is
//          exact), cut into blocks of rows with progress() between them so that transfers in
//          flight advance; the elementwise work in plain loops;
//   CUDA   device memory; GEMMs by cuBLAS (cublasSgemm, and cublasGemmEx with bf16 inputs, fp32
//          output and CUBLAS_COMPUTE_32F), the elementwise work by small kernels
//          (kernels/cuda/elementwise.hpp), all queued on the CUDA backend's stream; on the CPU
//          emulation (-DRINGATTN_CUDA_EMULATION=ON) the same calls, cuBLAS served by the CPU GEMM.
//
// Memory itself (allocation, uploads, downloads, zeroing, waiting) is the AttentionBackend's:
// the layer's buffers live where the attention's do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "kernels/rotary.hpp"
#include "util/dtype.hpp"
#include "runtime/backend.hpp"

namespace ringattn {

// How a GEMM reads a row-major operand: as stored (n) or transposed (t).
enum class Op : uint8_t { n, t };

class LayerOps {
 public:
  virtual ~LayerOps() = default;
  virtual const char* name() const = 0;  // "cpu" or "cuda"

  // C (m, n) = alpha op(A) op(B) + beta C, row-major with leading dimensions lda, ldb, ldc;
  // op(A) is (m, k) and op(B) (k, n). A and B hold `type` elements (fp32 or bf16: bf16 products
  // are exact in fp32), C is fp32 and every sum is fp32. Stream-ordered.
  virtual void gemm(Op op_a, Op op_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                    const void* b, int64_t ldb, DType type, float beta, float* c, int64_t ldc) = 0;
  // y (rows, cols) += bias (cols,).
  virtual void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) = 0;
  // Rotates x (batch, table.rows, heads, table.head_dim) in place (kernels/rotary.hpp); the
  // table's angles are in this memory. inverse: by the opposite angles.
  virtual void rotate(float* x, const kernels::RotaryTable& table, int64_t batch, int64_t heads, bool inverse) = 0;
  // dst = src rounded to bfloat16 (to nearest even).
  virtual void round_to_bf16(bf16_bits* dst, const float* src, size_t n) = 0;
  // dst = src, both in this memory.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;

  // Called between blocks of long host computations, so that transfers in flight advance (the
  // CPU's GEMMs; the GPU computes on its own).
  void set_progress(std::function<void()> progress) { progress_ = std::move(progress); }

 protected:
  std::function<void()> progress_;
};

// The operations for `backend`'s memory: the CPU's (OpenBLAS with `threads` threads) or, with the
// CUDA backend, the GPU's on its stream (throws Fault in a build without CUDA).
std::unique_ptr<LayerOps> make_layer_ops(AttentionBackend& backend, int threads);
std::unique_ptr<LayerOps> make_cuda_layer_ops(AttentionBackend& backend);  // builds with CUDA only

// The CPU GEMM: C (m, n) = alpha op(A) op(B) + beta C in fp32, row-major (OpenBLAS sgemm).
void host_sgemm(Op op_a, Op op_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Sets the number of threads of the BLAS used by the CPU GEMM (process-wide).
void set_blas_threads(int threads);

}  // namespace ringattn
