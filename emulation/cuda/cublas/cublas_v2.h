// The subset of cuBLAS (cublas_v2.h) the project calls, for the CPU emulation of CUDA
// (-DRINGATTN_CUDA_EMULATION=ON): found before any real cublas_v2.h by the emulated build, served
// by emulation/cuda/cublas_emulation.cpp with the CPU GEMM (OpenBLAS sgemm, which the CPU backend's
// LoRA layer uses too).
//
// What is modelled: the handle and its stream (a call first waits for work queued on that stream,
// as a copy does; the GEMM then runs when called, like the emulation's kernels); column-major
// operands with their transposes and leading dimensions; cublasSgemm, and cublasGemmEx with
// CUDA_R_32F or CUDA_R_16BF inputs, a CUDA_R_32F output and CUBLAS_COMPUTE_32F (bf16 products are
// exact in fp32, sums are fp32); argument checks as cuBLAS makes them (CUBLAS_STATUS_INVALID_VALUE);
// operands outside device allocations fail with CUBLAS_STATUS_EXECUTION_FAILED, where a GPU
// would fault. What is not: other types and compute types (CUBLAS_STATUS_NOT_SUPPORTED), math
// modes, workspaces, the GPU's summation order.
#pragma once

#include "emulation/cuda/cuda_emulation.hpp"

enum cublasStatus_t : int {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cudaDataType : int { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
typedef cudaDataType cudaDataType_t;
enum cublasComputeType_t : int { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t : int { CUBLAS_GEMM_DEFAULT = -1 };

struct cublasContext;
using cublasHandle_t = cublasContext*;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
const char* cublasGetStatusString(cublasStatus_t status);

// C (m, n) = alpha op(A) op(B) + beta C, column-major; alpha and beta in host memory.
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo);
