// The public C++ API (include/ringattn/ringattn.hpp) on the emulated CUDA backend and NCCL
// (-DRINGATTN_CUDA_EMULATION=ON), under mpirun in ringattn_nccl_emulated_tests (ctest
// nccl_emulated_np*, label nccl_emulation): the hybrid through a Context.
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "ringattn/ringattn.hpp"
#include "tests/support/sharded_reference.hpp"

namespace ringattn::comm::testing {
namespace {

// The hybrid through the library on the emulated CUDA backend and NCCL (--ulysses 2 at P = 2 and 4):
// exact against fp64, forward and backward, and each rank holds two NCCL communicators, the
// job's and its group's, however many plans (shapes) it runs.
TEST(NcclEmulated, TheHybridHoldsTheJobsAndTheGroupsCommunicators) {
  int P = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (P % 2 != 0) GTEST_SKIP() << "--ulysses 2 needs an even number of ranks";
  ContextOptions options;
  options.backend = "cuda";
  options.comm = "nccl";
  options.threads = 1;
  options.timeout_s = 60.0;
  Context ctx(MPI_COMM_WORLD, options);
  AttentionSpec spec;
  spec.mask.causal = true;
  spec.ulysses = 2;
  for (const int64_t L : {int64_t(97), int64_t(64)}) {  // two shapes: two plans
    const Shard shard{1, ctx.rows(L, spec), 4, 2, 16, ElementType::float32};
    const kernels::AttentionDims dims{1, 4, 2, 16, 0.25f};
    const std::vector<int64_t> pos = ctx.positions(L, spec);
    auto rows = [&](RandomTensor t, int64_t heads) {
      return ringattn::testing::seeded_rows(5, t, 1, L, heads * 16, pos, DType::f32);
    };
    const std::vector<float> q = rows(RandomTensor::q, 4), k = rows(RandomTensor::k, 2), v = rows(RandomTensor::v, 2);
    const std::vector<float> d = rows(RandomTensor::dout, 4);
    // Device copies (the emulated device memory is host memory, but the pointers are the device's).
    auto device = [](const std::vector<float>& x) {
      float* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, sizeof(float) * std::max<size_t>(x.size(), 1)), cudaSuccess);
      cudaMemcpy(p, x.data(), sizeof(float) * x.size(), cudaMemcpyHostToDevice);
      return p;
    };
    float *dq_ = device(q), *dk_ = device(k), *dv_ = device(v), *dd_ = device(d);
    std::vector<float> o(q.size()), lse(size_t(4) * pos.size()), dq(q.size()), dk(k.size()), dv(v.size());
    float *o_ = device(o), *lse_ = device(lse), *gq = device(dq), *gk = device(dk), *gv = device(dv);
    ctx.forward(shard, spec, dq_, dk_, dv_, o_, lse_);
    ctx.backward(shard, spec, dq_, dk_, dv_, o_, lse_, dd_, gq, gk, gv);
    for (auto [host, dev] : {std::pair{&o, o_}, {&lse, lse_}, {&dq, gq}, {&dk, gk}, {&dv, gv}})
      cudaMemcpy(host->data(), dev, sizeof(float) * host->size(), cudaMemcpyDeviceToHost);
    Mask mask;
    mask.causal = true;
    ringattn::testing::ShardedReference(dims, mask, L, 5, DType::f32).check(pos, o, lse, dq, dk, dv);
    for (float* p : {dq_, dk_, dv_, dd_, o_, lse_, gq, gk, gv}) cudaFree(p);
    EXPECT_EQ(ncclEmulationLiveCommunicators(), 2) << "L = " << L;
  }
  EXPECT_EQ(ctx.cached_plans(), 2u);
}

}  // namespace
}  // namespace ringattn::comm::testing
