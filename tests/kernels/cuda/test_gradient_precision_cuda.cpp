// The CUDA kernels' precision on long sequences, as tests/kernels/test_gradient_precision.cpp holds
// the CPU kernels: every output within 2x of the error of the plain fp32 computation against fp64
// (tests/support/precision_oracle.hpp) - for the tensor-core kernels, of the one that rounds P and
// dS to bf16 as they do. The simple fp32 kernels summed dK and dV over every query row in one
// chain (dV 4.7x, dK 3.8x the plain fp32 error at L = 2048, causal, GQA). On the CPU emulation
// the sizes stay at L = 2048 (the emulated kernels take a minute or two of CPU there), the keys
// of one case in 4 parts as a ring of 4 ranks visits them; RINGATTN_PRECISION_SWEEP=full runs
// L = 4096 and D = 128 too, which a GPU makes quick. Skips when no device is visible, and in
// sanitizer builds (the kernels' memory accesses are the other tests' business).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "tests/support/gtest_or_mini.hpp"
#include "tests/support/precision_oracle.hpp"

namespace ringattn::testing {
namespace {

using kernels::CudaKernel;

constexpr double kFactor = 2.0;

bool skip_here(std::string& why) {
#if defined(__SANITIZE_ADDRESS__)
  why = "sanitizer build";
  return true;
#else
  int n = 0;
  why = "no CUDA device visible";
  return cudaGetDeviceCount(&n) != cudaSuccess || n == 0;
#endif
}

// A device copy of a host vector, and back.
template <class T>
class OnDevice {
 public:
  explicit OnDevice(const std::vector<T>& host) : n_(host.size()) {
    if (cudaMalloc(&p_, n_ * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~OnDevice() { cudaFree(p_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& x) {
  std::vector<uint8_t> b(x.size() * sizeof(T));
  std::memcpy(b.data(), x.data(), b.size());
  return b;
}

// The problem's inputs as the kernels store them: fp32, or bf16 bits.
std::vector<uint8_t> as_stored(const std::vector<float>& x, DType t) {
  return t == DType::f32 ? bytes_of(x) : bytes_of(to_bf16(x));
}

// Forward, delta and backward of the whole problem on the GPU (causal or no mask: no mask arrays),
// the keys in `chunks` consecutive parts as a ring of that many ranks visits them: the forward
// continues the partial state from part to part, the backward adds each part's gradients.
Outputs run_cuda(const Problem& p, DType t, CudaKernel kernel, int chunks) {
  const OnDevice<uint8_t> q(as_stored(p.q, t)), k(as_stored(p.k, t)), v(as_stored(p.v, t)),
      dout(as_stored(p.dout, t));
  const OnDevice<int64_t> q_pos(p.q_pos), k_pos(p.k_pos);
  MaskView mask = p.mask.view();
  mask.row_run_ptr = nullptr, mask.row_runs = nullptr, mask.col_run_ptr = nullptr, mask.col_runs = nullptr;
  const kernels::CudaQueryRows queries{q.get(), t, p.rows_q(), q_pos.get()};
  const int64_t L = p.rows_k(), kv_row = p.dims.kv_heads * p.dims.head_dim;
  const auto first = [&](int c) { return L * c / chunks; };
  const auto keys = [&](int c) {
    const int64_t bytes = first(c) * kv_row * dtype_bytes(t);
    return kernels::CudaKeyValueRows{k.get() + bytes, v.get() + bytes, t, first(c + 1) - first(c),
                                     k_pos.get() + first(c)};
  };
  kernels::CudaOptions opt;
  opt.kernel = kernel;
  const OnDevice<float> o(std::vector<float>(p.q_elems(), 0.0f)),
      lse(std::vector<float>(p.lse_elems(), -std::numeric_limits<float>::infinity())),
      delta(std::vector<float>(p.lse_elems(), 0.0f)), dq(std::vector<float>(p.q_elems(), 0.0f)),
      dk(std::vector<float>(p.k_elems(), 0.0f)), dv(std::vector<float>(p.k_elems(), 0.0f));
  for (int c = 0; c < chunks; ++c)
    kernels::cuda_attention_forward(p.dims, queries, keys(c), mask, kernels::AttentionState{o.get(), lse.get()}, opt);
  kernels::cuda_attention_delta(p.dims, p.rows_q(), o.get(), dout.get(), t, delta.get(), nullptr);
  for (int c = 0; c < chunks; ++c)
    kernels::cuda_attention_backward(p.dims, queries, keys(c), dout.get(), lse.get(), delta.get(), dq.get(),
                                     dk.get() + first(c) * kv_row, dv.get() + first(c) * kv_row, mask, opt);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("the kernels failed");
  return Outputs{o.host(), lse.host(), dq.host(), dk.host(), dv.host()};
}

void check_cuda(const PrecisionCase& c, CudaKernel kernel, int chunks = 1) {
  const Problem p = c.problem();
  const DType t = c.dtype;
  const bool tensor_cores = kernel == CudaKernel::tensor_core;
  const PrecisionOracle oracle(p, tensor_cores ? kernels::SamePrecision::bf16_products()
                                               : kernels::SamePrecision::fp32());
  const PrecisionErrors e = oracle.judge(run_cuda(p, t, kernel, chunks));
  const std::string what = std::string("cuda ") + (tensor_cores ? "tensor_core " : "simple ") + c.describe() +
                           (chunks > 1 ? " in " + std::to_string(chunks) + " key parts" : "");
  const std::string who = std::string(tensor_cores ? "cuda tensor_core" : "cuda simple") +
                          (chunks > 1 ? ", keys in " + std::to_string(chunks) + " parts" : "");
  std::printf("%s\n", table_row(who, c, e).c_str());
  std::fflush(stdout);
  EXPECT_LE(worst_ratio(e), kFactor) << what << ": " << describe_ratios(e) << " (error / plain fp32 error)";
}

bool full_sweep() {
  const char* e = std::getenv("RINGATTN_PRECISION_SWEEP");
  return e && std::strcmp(e, "full") == 0;
}

TEST(GradientPrecisionCuda, LongSequencesWithinTwiceFp32) {
  std::string why;
  if (skip_here(why)) GTEST_SKIP() << why;
  check_cuda({.L = 2048, .causal = true}, CudaKernel::simple);
  check_cuda({.L = 2048, .causal = false, .seed = 7}, CudaKernel::simple, 4);
  // (The tensor-core kernels round P and dS to bf16, which outweighs any fp32 chain: a short check.)
  check_cuda({.L = 1024, .causal = true, .dtype = DType::bf16, .seed = 5}, CudaKernel::tensor_core);
}

TEST(GradientPrecisionCuda, FullSweep) {
  std::string why;
  if (skip_here(why)) GTEST_SKIP() << why;
  if (!full_sweep()) GTEST_SKIP() << "RINGATTN_PRECISION_SWEEP=full runs it";
  for (int64_t L : {2048, 4096})
    for (bool causal : {true, false})
      for (int64_t D : {64, 128}) {
        const uint64_t seed = uint64_t(L + D + causal);
        for (int chunks : {1, 4}) {
          check_cuda({.L = L, .D = D, .causal = causal, .seed = seed}, CudaKernel::simple, chunks);
          check_cuda({.L = L, .D = D, .causal = causal, .dtype = DType::bf16, .seed = seed}, CudaKernel::simple,
                     chunks);
          check_cuda({.L = L, .D = D, .causal = causal, .dtype = DType::bf16, .seed = seed}, CudaKernel::tensor_core,
                     chunks);
        }
      }
}

}  // namespace
}  // namespace ringattn::testing
