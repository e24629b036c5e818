// cuBLAS on the CPU emulation of CUDA (emulation/cuda/cublas/cublas_v2.h says what is modelled):
// every GEMM is served by OpenBLAS's cblas_sgemm in column-major order, with cuBLAS's own
// transposes and leading dimensions, so the caller's arguments reach the CPU GEMM unchanged.
#include <cblas.h>

#include <cstdint>
#include <vector>

#include "emulation/cuda/cublas/cublas_v2.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

bool is_device(const void* p) {
  cudaPointerAttributes a;
  return cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice;
}

size_t element_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

// A column-major operand of `rows` x `cols` elements with leading dimension `ld` lies in device
// memory: its first and its last element (a GPU would fault on anything else).
bool in_device_memory(const void* p, cudaDataType t, int rows, int cols, int ld) {
  if (rows == 0 || cols == 0) return true;
  const auto* first = static_cast<const char*>(p);
  const size_t last = (size_t(cols - 1) * size_t(ld) + size_t(rows - 1)) * element_bytes(t);
  return p && is_device(first) && is_device(first + last);
}

// The operand as fp32: itself, or its bf16 elements widened (exactly) into `storage`.
const float* as_float(const void* p, cudaDataType t, int rows, int cols, int ld, std::vector<float>& storage) {
  if (t == CUDA_R_32F || rows == 0 || cols == 0) return static_cast<const float*>(p);
  storage.resize(size_t(cols - 1) * size_t(ld) + size_t(rows));
  const auto* in = static_cast<const __nv_bfloat16*>(p);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = __bfloat162float(in[i]);
  return storage.data();
}

bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }
CBLAS_TRANSPOSE cblas_op(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }
int at_least_one(int v) { return v > 1 ? v : 1; }

cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    float alpha, const void* a, cudaDataType at, int lda, const void* b, cudaDataType bt, int ldb,
                    float beta, float* c, int ldc) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  // Stored shapes: op(A) is m x k, op(B) is k x n.
  const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  if (!valid_op(ta) || !valid_op(tb) || m < 0 || n < 0 || k < 0 || lda < at_least_one(a_rows) ||
      ldb < at_least_one(b_rows) || ldc < at_least_one(m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // Stream order: what was queued on the handle's stream before this call comes first.
  if (cudaStreamSynchronize(handle->stream) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (!in_device_memory(a, at, a_rows, a_cols, lda) || !in_device_memory(b, bt, b_rows, b_cols, ldb) ||
      !in_device_memory(c, CUDA_R_32F, m, n, ldc))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  std::vector<float> wide_a, wide_b;
  const float* af = as_float(a, at, a_rows, a_cols, lda, wide_a);
  const float* bf = as_float(b, bt, b_rows, b_cols, ldb, wide_b);
  cblas_sgemm(CblasColMajor, cblas_op(ta), cblas_op(tb), m, n, k, alpha, af, lda, bf, ldb, beta, c, ldc);
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  }
  return "unknown error";
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  return gemm(handle, transa, transb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t) {
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  // The combinations served: fp32 or bf16 inputs of one type, an fp32 output, fp32 compute
  // (whose alpha and beta are floats).
  const bool inputs = (Atype == CUDA_R_32F || Atype == CUDA_R_16BF) && Btype == Atype;
  if (!inputs || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(handle, transa, transb, m, n, k, *static_cast<const float*>(alpha), A, Atype, lda, B, Btype, ldb,
              *static_cast<const float*>(beta), static_cast<float*>(C), ldc);
}
