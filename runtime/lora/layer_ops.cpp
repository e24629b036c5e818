// The LoRA layer's operations on the CPU (layer_ops.hpp), and the CPU GEMM.
#include "runtime/lora/layer_ops.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/errors.hpp"
#include "runtime/lora/rope.hpp"

namespace ringattn {

namespace {

// Rows per GEMM call between progress() calls: large enough that BLAS runs at speed, small
// enough that a gather in flight is served every few hundred microseconds.
constexpr int64_t kRowBlock = 256;

CBLAS_TRANSPOSE cblas_op(Op op) { return op == Op::n ? CblasNoTrans : CblasTrans; }

// A stored operand (rows, cols) with leading dimension ld, as fp32: itself, or its bf16 values
// widened (exactly) into `storage`.
const float* as_float(const void* p, DType type, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& storage) {
  if (type == DType::f32 || rows == 0 || cols == 0) return static_cast<const float*>(p);
  storage.resize(static_cast<size_t>((rows - 1) * ld + cols));
  const auto* in = static_cast<const bf16_bits*>(p);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = bf16_to_float(in[i]);
  return storage.data();
}

class CpuLayerOps final : public LayerOps {
 public:
  explicit CpuLayerOps(int threads) { set_blas_threads(threads); }
  const char* name() const override { return "cpu"; }

  void gemm(Op op_a, Op op_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda, const void* b,
            int64_t ldb, DType type, float beta, float* c, int64_t ldc) override {
    if (m == 0 || n == 0) return;
    std::vector<float> wide_a, wide_b;
    const float* bf = op_b == Op::n ? as_float(b, type, k, n, ldb, wide_b) : as_float(b, type, n, k, ldb, wide_b);
    if (op_a == Op::t) {  // A^T (k rows summed over): one call
      host_sgemm(op_a, op_b, m, n, k, alpha, as_float(a, type, k, m, lda, wide_a), lda, bf, ldb, beta, c, ldc);
      if (progress_) progress_();
      return;
    }
    // Rows of C are rows of A: blocks of them.
    const size_t element = static_cast<size_t>(dtype_bytes(type));
    for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, m - r0);
      const void* block = static_cast<const char*>(a) + static_cast<size_t>(r0 * lda) * element;
      host_sgemm(op_a, op_b, rows, n, k, alpha, as_float(block, type, rows, k, lda, wide_a), lda, bf, ldb, beta,
                 c + r0 * ldc, ldc);
      if (progress_) progress_();
    }
  }

  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) override {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) y[i * cols + j] += bias[j];
  }

  void rotate(float* x, const kernels::RotaryTable& table, int64_t batch, int64_t heads, bool inverse) override {
    rotate_rows(table, x, batch, heads, inverse);
  }

  void round_to_bf16(bf16_bits* dst, const float* src, size_t n) override {
    for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
};

}  // namespace

void host_sgemm(Op op_a, Op op_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, cblas_op(op_a), cblas_op(op_b), static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

void set_blas_threads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

std::unique_ptr<LayerOps> make_layer_ops(AttentionBackend& backend, int threads) {
  if (backend.memory() == comm::MemorySpace::host) return std::make_unique<CpuLayerOps>(threads);
#if defined(RINGATTN_WITH_CUDA)
  return make_cuda_layer_ops(backend);
#else
  throw Fault(std::string("the LoRA layer has no operations for the ") + backend.name() + " backend");
#endif
}

}  // namespace ringattn
