// The LoRA layer's operations on a GPU (layer_ops.hpp): cuBLAS GEMMs and the elementwise kernels
// of kernels/cuda/elementwise.hpp, queued on the CUDA backend's stream, so that they are ordered
// with the attention kernels and, through NcclCommunicator::order_after, with NCCL's transfers.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <string>

#include "kernels/cuda/elementwise.hpp"
#include "runtime/errors.hpp"
#include "runtime/lora/layer_ops.hpp"

namespace ringattn {

namespace {

void check(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Fault("cuBLAS: " + what + " failed: " + cublasGetStatusString(s));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Fault(std::string("LoRA layer on CUDA: ") + what + ": " + cudaGetErrorName(e) + " (" +
                       cudaGetErrorString(e) + ")");
}

int blas_int(int64_t v, const char* what) {
  if (v > INT_MAX) throw Fault(std::string("cuBLAS: ") + what + " " + std::to_string(v) + " exceeds int");
  return static_cast<int>(v);
}

cublasOperation_t cublas_op(Op op) { return op == Op::n ? CUBLAS_OP_N : CUBLAS_OP_T; }

class CudaLayerOps final : public LayerOps {
 public:
  explicit CudaLayerOps(AttentionBackend& backend) : stream_(static_cast<cudaStream_t>(backend.native_stream())) {
    check(cublasCreate(&handle_), "cublasCreate");
    check(cublasSetStream(handle_, stream_), "cublasSetStream");
  }
  ~CudaLayerOps() override { cublasDestroy(handle_); }
  CudaLayerOps(const CudaLayerOps&) = delete;
  CudaLayerOps& operator=(const CudaLayerOps&) = delete;

  const char* name() const override { return "cuda"; }

  // cuBLAS is column-major: the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
  // so B goes first and the shapes swap; the leading dimensions stay what they are.
  void gemm(Op op_a, Op op_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda, const void* b,
            int64_t ldb, DType type, float beta, float* c, int64_t ldc) override {
    if (m == 0 || n == 0) return;
    const int M = blas_int(n, "n"), N = blas_int(m, "m"), K = blas_int(k, "k");
    const int LDA = blas_int(ldb, "ldb"), LDB = blas_int(lda, "lda"), LDC = blas_int(ldc, "ldc");
    const std::string shape = " (" + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) + ")";
    if (type == DType::f32) {
      check(cublasSgemm(handle_, cublas_op(op_b), cublas_op(op_a), M, N, K, &alpha, static_cast<const float*>(b), LDA,
                        static_cast<const float*>(a), LDB, &beta, c, LDC),
            "cublasSgemm" + shape);
      return;
    }
    check(cublasGemmEx(handle_, cublas_op(op_b), cublas_op(op_a), M, N, K, &alpha, b, CUDA_R_16BF, LDA, a, CUDA_R_16BF,
                       LDB, &beta, c, CUDA_R_32F, LDC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (bf16 inputs, fp32 output and compute)" + shape);
  }

  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) override {
    kernels::cuda_add_bias(y, bias, rows, cols, stream_);
  }

  void rotate(float* x, const kernels::RotaryTable& table, int64_t batch, int64_t heads, bool inverse) override {
    kernels::cuda_rotate(x, table, batch, heads, inverse, stream_);
  }

  void round_to_bf16(bf16_bits* dst, const float* src, size_t n) override {
    kernels::cuda_round_to_bf16(dst, src, n, stream_);
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  }

 private:
  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

std::unique_ptr<LayerOps> make_cuda_layer_ops(AttentionBackend& backend) {
  if (backend.memory() != comm::MemorySpace::device || !backend.native_stream())
    throw Fault("the LoRA layer's CUDA operations need the CUDA backend");
  return std::make_unique<CudaLayerOps>(backend);
}

}  // namespace ringattn
