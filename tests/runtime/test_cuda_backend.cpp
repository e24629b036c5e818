// The CUDA backend against the CPU backend, method by method, on the same inputs. Skips when no
// CUDA device is visible (except the device query, which must work without one).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cuda/elementwise.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/random_inputs.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device visible"

TEST(CudaBackend, DeviceQueryNeverThrows) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(cuda_device_available(), n > 0);
  if (n == 0) {
    EXPECT_THROW(make_cuda_backend(0), std::exception);
  }
}

// A host vector in backend memory and back.
template <class T>
DeviceBuffer put(AttentionBackend& be, const std::vector<T>& host) {
  DeviceBuffer buf(be, host.size() * sizeof(T));
  be.upload(buf.data(), host.data(), host.size() * sizeof(T));
  return buf;
}
template <class T>
std::vector<T> get(AttentionBackend& be, const DeviceBuffer& buf) {
  std::vector<T> host(buf.bytes() / sizeof(T));
  be.synchronize();
  be.download(host.data(), buf.data(), buf.bytes());
  return host;
}

TEST(CudaBackend, MemoryOperationsMatchTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend(1);
  EXPECT_STREQ(gpu->name(), "cuda");
  EXPECT_EQ(gpu->memory(), comm::MemorySpace::device);
  const int64_t batch = 2, rows = 37, row_elems = 6;
  const std::vector<float> src = random_vector(size_t(batch * rows * row_elems), 3);
  const std::vector<RowRange> ranges = {{0, 5}, {9, 20}, {30, 37}};
  for (AttentionBackend* be : {gpu.get(), cpu.get()}) {
    DeviceBuffer s = put(*be, src);
    DeviceBuffer g(*be, sizeof(float) * size_t(batch * count_rows(ranges) * row_elems));
    be->gather_rows(g.data(), s.data(), batch, rows, sizeof(float) * row_elems, ranges);
    DeviceBuffer acc = put(*be, std::vector<float>(src.size(), 1.0f));
    be->scatter_add_rows(acc.as<float>(), g.as<float>(), batch, rows, row_elems, ranges);
    be->add(acc.as<float>(), s.as<float>(), src.size());
    DeviceBuffer f(*be, sizeof(float) * 11);
    be->fill(f.as<float>(), 11, -std::numeric_limits<float>::infinity());
    DeviceBuffer z(*be, 40);
    be->zero(z.data(), 40);
    const std::vector<float> got = get<float>(*be, acc);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t r = 0; r < rows; ++r) {
        const bool gathered = r < 5 || (r >= 9 && r < 20) || r >= 30;
        for (int64_t e = 0; e < row_elems; ++e) {
          const size_t i = size_t((b * rows + r) * row_elems + e);
          EXPECT_EQ(got[i], 1.0f + (gathered ? src[i] : 0.0f) + src[i]) << be->name() << " row " << r;
        }
      }
    for (float x : get<float>(*be, f)) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
    for (uint8_t x : get<uint8_t>(*be, z)) EXPECT_EQ(x, 0);
  }
}

// A caller's stream (as PyTorch's current stream, ringattn::Context::set_cuda_stream): the
// backend's work starts after what the caller queued on it, and the caller's later work after
// the backend's, without synchronising the host with the caller's stream.
TEST(CudaBackend, OrdersWithTheCallersStream) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  cudaStream_t caller = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
  const size_t n = size_t(1) << 18;
  DeviceBuffer x(*gpu, sizeof(float) * n), sum(*gpu, sizeof(float) * n);
  gpu->zero(sum.data(), sizeof(float) * n);
  gpu->synchronize();
  // The producer: queued fills, still running on a GPU when the backend is handed the stream.
  for (int i = 1; i <= 8; ++i) kernels::cuda_fill(x.as<float>(), n, float(i), caller);
  gpu->after_stream(caller);
  gpu->add(sum.as<float>(), x.as<float>(), n);  // reads x: must see the producer's last value
  gpu->before_stream(caller);
  kernels::cuda_fill(x.as<float>(), n, -1.0f, caller);  // the consumer: after the backend's read
  ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
  const std::vector<float> got = get<float>(*gpu, sum);
  EXPECT_EQ(std::count(got.begin(), got.end(), 8.0f), std::ptrdiff_t(n));
  for (float v : get<float>(*gpu, x)) ASSERT_EQ(v, -1.0f);
  cudaStreamDestroy(caller);
}

// forward, delta and backward of both backends on a shard against gathered keys, fp32 and bf16.
TEST(CudaBackend, KernelsMatchTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend(2);
  const kernels::AttentionDims dims{2, 4, 2, 64, 0.125f};
  std::vector<int64_t> qpos = iota_positions(90, 100), kpos;
  for (int64_t j = 0; j < 190; j += (j % 5 == 0 ? 3 : 1)) kpos.push_back(j);
  Mask mask;
  mask.causal = true;
  mask.set_documents({70, 60, 60});
  const MaskView view = mask.view();
  const int64_t nq = dims.batch * int64_t(qpos.size()) * dims.heads * dims.head_dim;
  const int64_t nk = dims.batch * int64_t(kpos.size()) * dims.kv_heads * dims.head_dim;
  const int64_t nl = dims.batch * dims.heads * int64_t(qpos.size());
  for (DType dtype : {DType::f32, DType::bf16}) {
    std::vector<float> q = random_vector(size_t(nq), 1), k = random_vector(size_t(nk), 2),
                       v = random_vector(size_t(nk), 3), dout = random_vector(size_t(nq), 4);
    std::vector<std::vector<float>> results[2];
    int which = 0;
    for (AttentionBackend* be : {gpu.get(), cpu.get()}) {
      auto store = [&](const std::vector<float>& x) {
        if (dtype == DType::f32) return put(*be, x);
        return put(*be, to_bf16(x));
      };
      DeviceBuffer dq_in = store(q), dk_in = store(k), dv_in = store(v), ddo = store(dout);
      DeviceBuffer o(*be, sizeof(float) * size_t(nq)), lse(*be, sizeof(float) * size_t(nl));
      be->zero(o.data(), o.bytes());
      be->fill(lse.as<float>(), size_t(nl), -std::numeric_limits<float>::infinity());
      const kernels::QueryRows qr{dq_in.data(), dtype, int64_t(qpos.size()), qpos.data()};
      const kernels::KeyValueRows kv{dk_in.data(), dv_in.data(), dtype, int64_t(kpos.size()), kpos.data()};
      be->forward(dims, qr, kv, view, kernels::AttentionState{o.as<float>(), lse.as<float>()}, {});
      DeviceBuffer delta(*be, sizeof(float) * size_t(nl));
      be->delta(dims, int64_t(qpos.size()), o.as<float>(), ddo.data(), dtype, delta.as<float>());
      DeviceBuffer dq(*be, sizeof(float) * size_t(nq)), dk(*be, sizeof(float) * size_t(nk)),
          dv(*be, sizeof(float) * size_t(nk));
      for (DeviceBuffer* b : {&dq, &dk, &dv}) be->zero(b->data(), b->bytes());
      be->backward(dims, qr, kv, ddo.data(), lse.as<float>(), delta.as<float>(), dq.as<float>(), dk.as<float>(),
                   dv.as<float>(), view, {});
      results[which++] = {get<float>(*be, o), get<float>(*be, lse), get<float>(*be, dq), get<float>(*be, dk),
                          get<float>(*be, dv)};
    }
    const char* names[] = {"o", "lse", "dq", "dk", "dv"};
    for (int t = 0; t < 5; ++t) {
      double scale = 0.0;
      for (float x : results[1][size_t(t)])
        if (std::isfinite(x)) scale = std::max(scale, double(std::abs(x)));
      // fp32: both in fp32; bf16: the GPU rounds P and dS to bf16 (FlashAttention-2 style).
      const double tol = (dtype == DType::f32 ? 2e-5 : 2e-2) * std::max(1.0, scale);
      EXPECT_LE(max_abs_diff(results[0][size_t(t)], results[1][size_t(t)]), tol)
          << dtype_name(dtype) << " " << names[t];
    }
  }
}

}  // namespace
}  // namespace ringattn::testing
