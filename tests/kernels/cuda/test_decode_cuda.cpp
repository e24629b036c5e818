// The CUDA decode kernel (kernels/cuda/decode_cuda.hpp) against the fp64 reference under the error
// rule, as the CPU decode kernel's test does: GQA groups packed as tile rows (MHA, MQA, several
// row groups), speculative tokens (causal among themselves), windows, cached rows that are one
// rank's share (positions with gaps), one split and many (the merge kernel), fp32 and bf16, a
// share the window leaves empty (O = 0, LSE = -inf), and the same bits as the call repeated.
// On a GPU, or on the emulation (the emulated.* tests); skips when no CUDA device is visible.
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/decode_cuda.hpp"
#include "tests/support/decode_problem.hpp"
#include "tests/support/gtest_or_mini.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {
namespace {

bool device_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device memory holding a host vector's bytes.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes, const void* host = nullptr) : bytes_(bytes) {
    if (bytes_) cuda_ok(cudaMalloc(&p_, bytes_), "cudaMalloc");
    if (host && bytes_) cuda_ok(cudaMemcpy(p_, host, bytes_, cudaMemcpyHostToDevice), "upload");
  }
  template <class T>
  explicit DeviceBytes(const std::vector<T>& host) : DeviceBytes(host.size() * sizeof(T), host.data()) {}
  ~DeviceBytes() {
    if (p_) cudaFree(p_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    if (bytes_) cuda_ok(cudaMemcpy(host.data(), p_, bytes_, cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

std::string describe(const DecodeCase& c) {
  return "H " + std::to_string(c.heads) + " Hkv " + std::to_string(c.kv_heads) + " D " + std::to_string(c.head_dim) +
         " rows " + std::to_string(c.rows) + " T " + std::to_string(c.tokens) + " window " +
         std::to_string(c.window_left) + " " + dtype_name(c.dtype);
}

// Runs the kernel (twice: the second must repeat the first's bits) and checks it against fp64.
DecodeRun run_and_check(const DecodeCase& c) {
  const DecodeProblem pr(c, c.rows + 5, 21);
  const int64_t H = c.heads, D = c.head_dim, T = c.tokens;
  const bool b16 = c.dtype == DType::bf16;
  const DeviceBytes dq = b16 ? DeviceBytes(to_bf16(pr.q)) : DeviceBytes(pr.q);
  const DeviceBytes dk = b16 ? DeviceBytes(to_bf16(pr.k_cache)) : DeviceBytes(pr.k_cache);
  const DeviceBytes dv = b16 ? DeviceBytes(to_bf16(pr.v_cache)) : DeviceBytes(pr.v_cache);
  const DeviceBytes dpos(pr.k_pos);
  DeviceBytes o(size_t(T * H * D) * sizeof(float)), lse(size_t(H * T) * sizeof(float));
  const size_t ws_bytes = kernels::cuda_decode_workspace_bytes(D);
  DeviceBytes workspace(ws_bytes);

  // The rows a query sees, as the runtime finds them on the host (here: all of them, or the window's).
  int64_t first = 0;
  while (c.window_left >= 0 && first < c.rows && pr.k_pos[size_t(first)] < pr.q_pos[0] - c.window_left) ++first;
  const kernels::CudaDecodeQueries queries{dq.as<void>(), c.dtype, T, pr.q_pos[0]};
  const kernels::CudaCachedRows rows{dk.as<void>(), dv.as<void>(), c.dtype, pr.capacity, dpos.as<int64_t>(), first,
                                     c.rows};
  DecodeRun run;
  for (int repeat = 0; repeat < 2; ++repeat) {
    kernels::cuda_decode_forward(pr.dims, queries, rows, c.window_left,
                                 kernels::AttentionState{o.as<float>(), lse.as<float>()}, workspace.as<void>(),
                                 ws_bytes, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "decode");
    DecodeRun again{o.download<float>(), lse.download<float>()};
    if (repeat == 0) {
      run = again;
    } else {
      EXPECT_TRUE(again.o == run.o && again.lse == run.lse) << describe(c) << ": a second call differs";
    }
  }
  pr.expect_exact(run.o, run.lse, describe(c));
  return run;
}

TEST(DecodeCuda, MatchesReference) {
  if (!device_present()) GTEST_SKIP() << "no CUDA device visible";
  // Small sizes: the emulation runs every thread of every block on one core.
  const DecodeCase cases[] = {
      {8, 2, 64, 1500, 1, -1, DType::f32},      // 5 splits merged; a tail tile
      {8, 2, 64, 1500, 1, -1, DType::bf16},
      {4, 4, 32, 200, 1, -1, DType::f32},       // MHA: one row per tile, one split
      {8, 1, 128, 300, 3, -1, DType::f32},      // MQA, speculative tokens: causal among the new ones
      {8, 2, 64, 3000, 4, 2400, DType::bf16},   // a window: the first rows are not read; 3 splits
      {4, 4, 32, 2000, 600, 100, DType::f32, 1},  // 38 row groups; splits and tiles a group cannot see
      {16, 4, 32, 100, 1, 20, DType::f32},      // a window narrower than the stride between rows
      {32, 2, 16, 600, 2, -1, DType::f32},      // 32 rows per head: two row groups, 2 splits
      {2, 1, 256, 90, 1, -1, DType::bf16},      // the largest head dim
  };
  for (const DecodeCase& c : cases) run_and_check(c);
}

TEST(DecodeCuda, SplitsFollowTheShapesOnly) {
  const kernels::AttentionDims dims{1, 8, 2, 64, 0.125f};
  EXPECT_EQ(kernels::cuda_decode_splits(dims, 1, 0), 0);
  EXPECT_EQ(kernels::cuda_decode_splits(dims, 1, 300), 1);
  EXPECT_EQ(kernels::cuda_decode_splits(dims, 1, 1500), 5);
  EXPECT_EQ(kernels::cuda_decode_splits(dims, 1, 1 << 20), 128);     // at most 128 splits
  EXPECT_EQ(kernels::cuda_decode_splits(dims, 1000, 1 << 20), 1);    // 8000 query rows fill the GPU alone
  EXPECT_LE(kernels::cuda_decode_splits(dims, 40, 1 << 20) * 8 * 40, 4096);  // the workspace bounds splits x rows
}

TEST(DecodeCuda, ShareOutsideTheWindowGivesAnEmptyState) {
  if (!device_present()) GTEST_SKIP() << "no CUDA device visible";
  // A share whose rows all lie outside the window: positions 1..148 seen from a query at 1000;
  // the runtime finds no visible row and the kernel writes O = 0, LSE = -inf without reading.
  const int64_t H = 4, Hkv = 2, D = 32, rows = 50;
  const kernels::AttentionDims dims{1, H, Hkv, D, 0.2f};
  const std::vector<float> q(size_t(H * D), 1.0f), kv(size_t(Hkv * rows * D), 1.0f);
  const DeviceBytes dq(q), dk(kv), dpos(iota_positions(rows, 1, 3));
  DeviceBytes o(std::vector<float>(size_t(H * D), 5.0f)), lse(std::vector<float>(size_t(H), 5.0f));
  kernels::cuda_decode_forward(dims, {dq.as<void>(), DType::f32, 1, 1000},
                               {dk.as<void>(), dk.as<void>(), DType::f32, rows, dpos.as<int64_t>(), 0, 0}, 100,
                               kernels::AttentionState{o.as<float>(), lse.as<float>()}, nullptr, 0, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "decode");
  for (float x : o.download<float>()) EXPECT_EQ(x, 0.0f);
  for (float x : lse.download<float>()) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  // Rows passed in but none visible to the query (all after it): the same, through the kernel.
  kernels::cuda_decode_forward(dims, {dq.as<void>(), DType::f32, 1, 0},
                               {dk.as<void>(), dk.as<void>(), DType::f32, rows, dpos.as<int64_t>(), 0, rows}, -1,
                               kernels::AttentionState{o.as<float>(), lse.as<float>()}, nullptr, 0, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "decode");
  for (float x : o.download<float>()) EXPECT_EQ(x, 0.0f);
  for (float x : lse.download<float>()) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST(DecodeCuda, RefusesWhatItCannotRun) {
  const kernels::AttentionDims bad_dim{1, 4, 2, 320, 0.1f}, bad_heads{1, 6, 4, 64, 0.1f};
  EXPECT_FALSE(kernels::cuda_decode_supports_head_dim(320));
  EXPECT_FALSE(kernels::cuda_decode_supports_head_dim(24));
  EXPECT_TRUE(kernels::cuda_decode_supports_head_dim(128));
  const kernels::AttentionState none{nullptr, nullptr};
  for (const kernels::AttentionDims& dims : {bad_dim, bad_heads}) {
    bool refused = false;
    try {
      kernels::cuda_decode_forward(dims, {}, {}, -1, none, nullptr, 0, nullptr);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    EXPECT_TRUE(refused) << "H " << dims.heads << " Hkv " << dims.kv_heads << " D " << dims.head_dim;
  }
}

}  // namespace
}  // namespace ringattn::testing
