// The cuBLAS emulation (emulation/cuda/cublas_emulation.cpp) against a naive fp64 GEMM: every
// transpose combination with leading dimensions larger than the operands, fp32 (cublasSgemm,
// cublasGemmEx) and bf16 inputs (cublasGemmEx: products of bf16 values are exact in fp32, so only
// the fp32 sums differ), alpha and beta; and the errors cuBLAS gives (bad arguments, types it does
// not serve, an operand outside device memory).
#include <cublas_v2.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tests/support/gtest_or_mini.hpp"

namespace {

struct DeviceArray {
  void* p = nullptr;
  explicit DeviceArray(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceArray() { cudaFree(p); }
};

uint16_t to_bf16(float f) { return __float2bfloat16_rn(f).bits; }
float from_bf16(uint16_t b) { return __bfloat162float(__nv_bfloat16{b}); }

// Column-major element (i, j) of op(X) for X stored with leading dimension ld.
double at(const std::vector<float>& x, cublasOperation_t op, int ld, int i, int j) {
  return op == CUBLAS_OP_N ? x[size_t(i) + size_t(j) * size_t(ld)] : x[size_t(j) + size_t(i) * size_t(ld)];
}

void check_gemm(cublasOperation_t ta, cublasOperation_t tb, bool bf16, bool ex) {
  const int m = 5, n = 7, k = 9, pad = 3;
  const int lda = (ta == CUBLAS_OP_N ? m : k) + pad, ldb = (tb == CUBLAS_OP_N ? k : n) + pad, ldc = m + pad;
  const int a_cols = ta == CUBLAS_OP_N ? k : m, b_cols = tb == CUBLAS_OP_N ? n : k;
  std::mt19937 gen(unsigned(ta * 10 + tb));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(size_t(lda * a_cols)), b(size_t(ldb * b_cols)), c(size_t(ldc * n));
  for (float& v : a) v = bf16 ? from_bf16(to_bf16(u(gen))) : u(gen);
  for (float& v : b) v = bf16 ? from_bf16(to_bf16(u(gen))) : u(gen);
  for (float& v : c) v = u(gen);
  const float alpha = 0.75f, beta = -0.5f;
  // The expected C: padding rows (i >= m) keep their values.
  std::vector<double> want(c.begin(), c.end());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int l = 0; l < k; ++l) sum += at(a, ta, lda, i, l) * at(b, tb, ldb, l, j);
      want[size_t(i + j * ldc)] = alpha * sum + beta * double(c[size_t(i + j * ldc)]);
    }

  const size_t element = bf16 ? 2 : 4;
  DeviceArray da(a.size() * element), db(b.size() * element), dc(c.size() * sizeof(float));
  auto upload = [&](void* to, const std::vector<float>& from) {  // ("device" memory is the host's here)
    if (bf16)
      for (size_t i = 0; i < from.size(); ++i) static_cast<uint16_t*>(to)[i] = to_bf16(from[i]);
    else
      std::memcpy(to, from.data(), from.size() * sizeof(float));
  };
  upload(da.p, a);
  upload(db.p, b);
  std::memcpy(dc.p, c.data(), c.size() * sizeof(float));
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cublasSetStream(handle, stream), CUBLAS_STATUS_SUCCESS);
  const cudaDataType type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasStatus_t status =
      ex || bf16 ? cublasGemmEx(handle, ta, tb, m, n, k, &alpha, da.p, type, lda, db.p, type, ldb, &beta, dc.p,
                                CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                 : cublasSgemm(handle, ta, tb, m, n, k, &alpha, static_cast<const float*>(da.p), lda,
                               static_cast<const float*>(db.p), ldb, &beta, static_cast<float*>(dc.p), ldc);
  ASSERT_EQ(status, CUBLAS_STATUS_SUCCESS) << cublasGetStatusString(status);
  const float* got = static_cast<const float*>(dc.p);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LE(std::abs(double(got[i]) - want[i]), 1e-5)
        << "element " << i << " transa " << ta << " transb " << tb << " bf16 " << bf16;
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
}

TEST(CublasEmulation, EveryTransposeAndLeadingDimensionMatchesFp64) {
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T})
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      check_gemm(ta, tb, false, false);  // cublasSgemm
      check_gemm(ta, tb, false, true);   // cublasGemmEx, fp32 inputs
      check_gemm(ta, tb, true, true);    // cublasGemmEx, bf16 inputs
    }
}

TEST(CublasEmulation, RefusesWhatCublasRefuses) {
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  DeviceArray a(64 * sizeof(float)), b(64 * sizeof(float)), c(64 * sizeof(float));
  const float one = 1.0f, zero = 0.0f;
  auto sgemm = [&](int m, int n, int k, const void* ap, int lda, int ldc) {
    return cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, static_cast<const float*>(ap), lda,
                       static_cast<const float*>(b.p), 4, &zero, static_cast<float*>(c.p), ldc);
  };
  EXPECT_EQ(sgemm(4, 4, 4, a.p, 4, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(sgemm(4, 4, 4, a.p, 3, 4), CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(sgemm(4, 4, 4, a.p, 4, 2), CUBLAS_STATUS_INVALID_VALUE);  // ldc < m
  EXPECT_EQ(sgemm(-1, 4, 4, a.p, 4, 4), CUBLAS_STATUS_INVALID_VALUE);
  std::vector<float> host(64, 0.0f);
  EXPECT_EQ(sgemm(4, 4, 4, host.data(), 4, 4), CUBLAS_STATUS_EXECUTION_FAILED);  // a GPU would fault
  EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a.p, CUDA_R_16F, 4, b.p, CUDA_R_16F, 4,
                         &zero, c.p, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasSgemm(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, static_cast<const float*>(a.p), 4,
                        static_cast<const float*>(b.p), 4, &zero, static_cast<float*>(c.p), 4),
            CUBLAS_STATUS_NOT_INITIALIZED);
  cublasDestroy(handle);
}

}  // namespace
