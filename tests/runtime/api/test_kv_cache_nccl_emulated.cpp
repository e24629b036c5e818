// ringattn::KVCache (include/ringattn/ringattn.hpp) on the emulated CUDA backend and NCCL, under
// mpirun in ringattn_nccl_emulated_tests: the bad inputs of issue 28 (a cache past its capacity, a
// sequence out of range, a position that is not the next, shapes that differ between ranks, decode
// on a cache never filled, and a head dim the CUDA decode kernel lacks) are each an ArgumentError
// naming the argument on every rank, with the cache unchanged; good calls between them run on the
// device; and the calls order with a caller's stream. (Exactness on CUDA: ringattn_inference_tests
// under RINGATTN_TEST_BACKEND=cuda.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ringattn/ringattn.hpp"

namespace ringattn::testing {
namespace {

ContextOptions cuda_nccl() {
  ContextOptions o;
  o.backend = "cuda";
  o.comm = "nccl";
  o.threads = 1;
  o.timeout_s = 60.0;
  return o;
}

// Device memory of n floats holding `value` (the emulated device memory is host memory, but the
// pointers are the device's).
struct DeviceFloats {
  float* p = nullptr;
  size_t n = 0;
  DeviceFloats(size_t count, float value) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, sizeof(float) * n), cudaSuccess);
    const std::vector<float> host(n, value);
    cudaMemcpy(p, host.data(), sizeof(float) * n, cudaMemcpyHostToDevice);
  }
  ~DeviceFloats() { cudaFree(p); }
  std::vector<float> host() const {
    std::vector<float> out(n);
    cudaMemcpy(out.data(), p, sizeof(float) * n, cudaMemcpyDeviceToHost);
    return out;
  }
};

void expect_argument_error(const std::function<void()>& call, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "no ArgumentError naming " << argument;
  } catch (const ArgumentError& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(KVCacheNcclEmulated, BadInputsNameTheirArgumentOnEveryRankAndLeaveTheCache) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  Context ctx(MPI_COMM_WORLD, cuda_nccl());
  const int64_t H = 4, Hkv = 2, D = 16;
  // A head dim the CPU kernels take but the CUDA decode kernel does not.
  expect_argument_error([&] { KVCache(ctx, CacheOptions{1, Hkv, 320, 8, 1, ElementType::float32}); }, "head_dim");

  KVCache cache(ctx, CacheOptions{2, Hkv, D, 3, 1, ElementType::float32});
  DeviceFloats q(size_t(2 * 2 * H * D), 0.5f), kv(size_t(2 * 2 * Hkv * D), 0.25f), o(q.n, 0.0f), lse(size_t(4 * H), 0.0f);
  auto decode = [&](int64_t heads, const InferenceSpec& spec) {
    cache.decode(heads, 1, spec, q.p, kv.p, kv.p, o.p, lse.p);
  };
  auto unchanged = [&](const std::function<void()>& call, const std::string& argument) {
    const std::vector<int64_t> before = cache.lengths();
    const int64_t rows = cache.rows(0);
    expect_argument_error(call, argument);
    EXPECT_EQ(cache.lengths(), before);
    EXPECT_EQ(cache.rows(0), rows);
  };
  unchanged([&] { decode(H, {}); }, "cache");  // never filled

  // Fill it: 2 tokens per sequence by pass-Q (the whole chunk on every rank).
  InferenceSpec pass_q;
  pass_q.method = PrefillMethod::pass_q;
  cache.prefill(H, pass_q, 2, q.p, kv.p, kv.p, o.p, lse.p);
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{2, 2}));
  // Every token sees the same keys and values: O is V's rows, LSE finite.
  for (float x : o.host()) EXPECT_FLOAT_EQ(x, 0.25f);
  for (float x : lse.host()) EXPECT_TRUE(std::isfinite(x));

  InferenceSpec spec;
  spec.sequences = {2};
  unchanged([&] { decode(H, spec); }, "sequences");
  spec.sequences = {1};
  spec.positions = {5};
  unchanged([&] { decode(H, spec); }, "positions");
  if (P > 1) {  // shapes that differ between the ranks: rank 1 passes twice the heads
    InferenceSpec next;
    next.sequences = {1};
    unchanged([&] { decode(rank == 1 ? 2 * H : H, next); }, "q");
  }
  spec.positions = {2};
  decode(H, spec);  // the next position is fine
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{2, 3}));
  // Past the capacity (3 rows of each sequence per rank): the call that would overflow a rank.
  InferenceSpec first;
  first.sequences = {0};
  for (int64_t length = 2; length < 3 * P; ++length) decode(H, first);
  EXPECT_EQ(cache.lengths()[0], 3 * P);
  unchanged([&] { decode(H, first); }, "capacity");
}

// With the caller's stream given to the context (as ringattn.KVCache does with torch's current
// stream), prefill and decode order their device work with it through events and give the same
// results. (That the order holds while a GPU is still running the caller's kernels needs a GPU:
// the emulation runs kernels as they are issued; launch/gpu-check.sh runs the Python cache.)
TEST(KVCacheNcclEmulated, CallsOrderWithTheCallersStream) {
  Context ctx(MPI_COMM_WORLD, cuda_nccl());
  cudaStream_t caller = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
  ctx.set_cuda_stream(caller);
  const int64_t H = 4, Hkv = 2, D = 16;
  KVCache cache(ctx, CacheOptions{1, Hkv, D, 8, 1, ElementType::float32});
  DeviceFloats q(size_t(3 * H * D), 0.5f), kv(size_t(3 * Hkv * D), 0.25f), o(q.n, 0.0f), lse(size_t(3 * H), 0.0f);
  InferenceSpec pass_q;
  pass_q.method = PrefillMethod::pass_q;
  cache.prefill(H, pass_q, 3, q.p, kv.p, kv.p, o.p, lse.p);
  ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
  for (float x : o.host()) EXPECT_FLOAT_EQ(x, 0.25f);
  cache.decode(H, 1, {}, q.p, kv.p, kv.p, o.p, lse.p);
  ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{4}));
  const std::vector<float> out = o.host();
  for (size_t i = 0; i < size_t(H * D); ++i) EXPECT_FLOAT_EQ(out[i], 0.25f);
  const std::vector<float> lse_out = lse.host();
  for (size_t h = 0; h < size_t(H); ++h) EXPECT_TRUE(std::isfinite(lse_out[h]));
  cudaStreamDestroy(caller);
}

}  // namespace
}  // namespace ringattn::testing
