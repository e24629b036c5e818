// Ring attention under mpirun against the fp64 reference: every layout x schedule x mask kind
// (and combinations) x uneven length x GQA x batch 2, forward (O, LSE) and backward (dQ, dK, dV),
// fp32 and bf16. Each rank checks its own rows. Registered at 1, 2, 3 and 4 ranks (and 8 for
// the exactness test).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/reference.hpp"
#include "runtime/backend.hpp"
#include "runtime/random_inputs.hpp"
#include "runtime/ring_attention.hpp"
#include "tests/support/mask_variants.hpp"
#include "tests/support/sharded_reference.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {
namespace {


struct Case {
  LayoutKind layout;
  Schedule schedule;
  int mask;
  int64_t L = 131, B = 2, H = 4, Hkv = 2, D = 32;
  DType dtype = DType::f32;
};

std::string describe(const Case& c, const Mask& m) {
  return std::string(layout_name(c.layout)) + "/" + schedule_name(c.schedule) + "/" + m.describe() + "/" +
         dtype_name(c.dtype) + " L=" + std::to_string(c.L);
}

// Runs the ring on `comm` and returns this rank's max errors against fp64, checking each against
// FlashAttention-style tolerances (a few times the error of plain fp32 arithmetic).
ShardedReference::Errors run_and_check(comm::Communicator& comm, const Case& c) {
  const int P = comm.size(), rank = comm.rank();
  const ShardLayout layout(c.layout, c.L, P);
  const Mask mask = mask_variant(c.mask, c.L);
  SCOPED_TRACE(describe(c, mask) + " P=" + std::to_string(P) + " rank " + std::to_string(rank));
  const kernels::AttentionDims dims{c.B, c.H, c.Hkv, c.D, 1.0f / std::sqrt(float(c.D))};
  const std::vector<int64_t> pos = layout.positions(rank);
  const int64_t rows = int64_t(pos.size());
  const uint64_t seed = 17;
  auto q = seeded_rows(seed, RandomTensor::q, c.B, c.L, c.H * c.D, pos, c.dtype);
  auto k = seeded_rows(seed, RandomTensor::k, c.B, c.L, c.Hkv * c.D, pos, c.dtype);
  auto v = seeded_rows(seed, RandomTensor::v, c.B, c.L, c.Hkv * c.D, pos, c.dtype);
  auto dout = seeded_rows(seed, RandomTensor::dout, c.B, c.L, c.H * c.D, pos, c.dtype);
  auto qs = stored(q, c.dtype), ks = stored(k, c.dtype), vs = stored(v, c.dtype), ds = stored(dout, c.dtype);

  auto backend = make_cpu_backend(1);
  RingAttention ring(comm, *backend, layout, mask, RingOptions{dims, c.dtype, c.schedule});
  std::vector<float> o(q.size()), lse(size_t(c.B * c.H * rows)), dq(q.size()), dk(k.size()), dv(v.size());
  ring.forward(qs.data(), ks.data(), vs.data(), o.data(), lse.data());
  ring.backward(qs.data(), ks.data(), vs.data(), o.data(), lse.data(), ds.data(), dq.data(), dk.data(), dv.data());
  return ShardedReference(dims, mask, c.L, seed, c.dtype).check(pos, o, lse, dq, dk, dv);
}

class RingAttentionMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
    comm->set_timeout(60.0);
  }
  std::unique_ptr<comm::Communicator> comm;
};

TEST_F(RingAttentionMpi, EveryLayoutScheduleAndMaskMatchesFp64) {
  for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
    for (Schedule schedule : {Schedule::direct, Schedule::ring})
      for (int m = 0; m < kMaskVariants; ++m) run_and_check(*comm, Case{layout, schedule, m});
}

TEST_F(RingAttentionMpi, Bf16StorageAndTransfer) {
  for (Schedule schedule : {Schedule::direct, Schedule::ring}) {
    Case c{LayoutKind::zigzag, schedule, 1};
    c.dtype = DType::bf16;
    run_and_check(*comm, c);
  }
}

TEST_F(RingAttentionMpi, ShortSequenceOneRowPerRankAndMqa) {
  Case c{LayoutKind::striped, Schedule::direct, 1};
  c.L = comm->size();  // one position per rank
  c.Hkv = 1;
  run_and_check(*comm, c);
  c.layout = LayoutKind::contiguous;
  c.schedule = Schedule::ring;
  run_and_check(*comm, c);
}

TEST_F(RingAttentionMpi, DeterministicRunToRun) {
  const int P = comm->size();
  const ShardLayout layout(LayoutKind::zigzag, 200, P);
  Mask mask;
  mask.causal = true;
  const kernels::AttentionDims dims{1, 2, 2, 32, 0.2f};
  const auto pos = layout.positions(comm->rank());
  const int64_t rows = int64_t(pos.size());
  auto q = seeded_rows(1, RandomTensor::q, 1, 200, 64, pos, DType::f32);
  auto k = seeded_rows(1, RandomTensor::k, 1, 200, 64, pos, DType::f32);
  auto v = seeded_rows(1, RandomTensor::v, 1, 200, 64, pos, DType::f32);
  auto d = seeded_rows(1, RandomTensor::dout, 1, 200, 64, pos, DType::f32);
  auto backend = make_cpu_backend(2);
  RingAttention ring(*comm, *backend, layout, mask, RingOptions{dims, DType::f32, Schedule::direct});
  std::vector<float> o1(q.size()), l1(size_t(2 * rows)), dq1(q.size()), dk1(k.size()), dv1(v.size());
  std::vector<float> o2 = o1, l2 = l1, dq2 = dq1, dk2 = dk1, dv2 = dv1;
  ring.forward(q.data(), k.data(), v.data(), o1.data(), l1.data());
  ring.backward(q.data(), k.data(), v.data(), o1.data(), l1.data(), d.data(), dq1.data(), dk1.data(), dv1.data());
  ring.forward(q.data(), k.data(), v.data(), o2.data(), l2.data());
  ring.backward(q.data(), k.data(), v.data(), o2.data(), l2.data(), d.data(), dq2.data(), dk2.data(), dv2.data());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(dq1, dq2);
  EXPECT_EQ(dk1, dk2);
  EXPECT_EQ(dv1, dv2);
}

// Counts the backend allocations; everything else goes to the CPU backend.
class CountingBackend final : public AttentionBackend {
 public:
  explicit CountingBackend(std::unique_ptr<AttentionBackend> inner) : inner_(std::move(inner)) {}
  int allocations = 0;
  const char* name() const override { return inner_->name(); }
  comm::MemorySpace memory() const override { return inner_->memory(); }
  void* allocate(size_t bytes) override {
    ++allocations;
    return inner_->allocate(bytes);
  }
  void release(void* p) override { inner_->release(p); }
  void zero(void* p, size_t bytes) override { inner_->zero(p, bytes); }
  void fill(float* p, size_t n, float value) override { inner_->fill(p, n, value); }
  void upload(void* dst, const void* src, size_t bytes) override { inner_->upload(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { inner_->download(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { inner_->copy(dst, src, bytes); }
  void accumulate(float* dst, const float* src, size_t n) override { inner_->accumulate(dst, src, n); }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t height) override {
    inner_->copy_2d(dst, dst_pitch, src, src_pitch, width, height);
  }
  StepKernel forward(const kernels::AttentionDims& dims, const kernels::QueryRows& q, const kernels::KeyValueRows& kv,
                     const MaskView& mask, const kernels::AttentionState& state,
                     const std::function<void()>& progress) override {
    return inner_->forward(dims, q, kv, mask, state, progress);
  }
  void delta(const kernels::AttentionDims& dims, int64_t rows, const float* o, const void* dout, DType dtype,
             float* delta) override {
    inner_->delta(dims, rows, o, dout, dtype, delta);
  }
  StepKernel backward(const kernels::AttentionDims& dims, const kernels::QueryRows& q, const kernels::KeyValueRows& kv,
                      const void* dout, const float* lse, const float* delta, float* dq, float* dk, float* dv,
                      const MaskView& mask, const std::function<void()>& progress) override {
    return inner_->backward(dims, q, kv, dout, lse, delta, dq, dk, dv, mask, progress);
  }
  void synchronize() override { inner_->synchronize(); }
  kernels::SamePrecision same_precision(const kernels::AttentionDims& dims, DType dtype) const override {
    return inner_->same_precision(dims, dtype);
  }

 private:
  std::unique_ptr<AttentionBackend> inner_;
};

// The ring's buffers belong to the RingAttention: passes after the first backward allocate no
// backend memory (on a GPU, cudaMalloc/cudaFree would synchronise the device while transfers
// are in flight). Every rank posts the same number of communicator steps per pass (steps match
// by posting order), and a rank's exposed wait is never more than its pass.
TEST_F(RingAttentionMpi, PassesAllocateNothingAndPostMatchingSteps) {
  for (Schedule schedule : {Schedule::direct, Schedule::ring}) {
    SCOPED_TRACE(schedule_name(schedule));
    const int P = comm->size();
    const ShardLayout layout(LayoutKind::zigzag, 150, P);
    Mask mask;
    mask.causal = true;
    const kernels::AttentionDims dims{1, 2, 1, 16, 0.25f};
    const auto pos = layout.positions(comm->rank());
    const int64_t rows = int64_t(pos.size());
    auto q = seeded_rows(3, RandomTensor::q, 1, 150, 32, pos, DType::f32);
    auto k = seeded_rows(3, RandomTensor::k, 1, 150, 16, pos, DType::f32);
    auto v = seeded_rows(3, RandomTensor::v, 1, 150, 16, pos, DType::f32);
    auto d = seeded_rows(3, RandomTensor::dout, 1, 150, 32, pos, DType::f32);
    CountingBackend backend(make_cpu_backend(1));
    RingAttention ring(*comm, backend, layout, mask, RingOptions{dims, DType::f32, schedule});
    std::vector<float> o(q.size()), l(size_t(2 * rows)), dq(q.size()), dk(k.size()), dv(v.size());
    ring.forward(q.data(), k.data(), v.data(), o.data(), l.data());
    ring.backward(q.data(), k.data(), v.data(), o.data(), l.data(), d.data(), dq.data(), dk.data(), dv.data());
    const int after_first = backend.allocations;
    const int64_t steps_before = comm->steps_posted();
    PassStats f = ring.forward(q.data(), k.data(), v.data(), o.data(), l.data());
    PassStats b =
        ring.backward(q.data(), k.data(), v.data(), o.data(), l.data(), d.data(), dq.data(), dk.data(), dv.data());
    EXPECT_EQ(backend.allocations, after_first) << "a pass allocated backend memory";
    EXPECT_LE(f.wait_seconds, f.seconds);
    EXPECT_LE(b.wait_seconds, b.seconds);
    int64_t steps[2] = {comm->steps_posted() - steps_before, 0};
    steps[1] = -steps[0];
    comm->allreduce(steps, 2, DType::i64, comm::ReduceOp::max);
    EXPECT_EQ(steps[0], -steps[1]) << "ranks posted different numbers of steps";
    // forward: K/V steps 1..P-1; backward: K/V and gradient steps 1..P-1.
    EXPECT_EQ(steps[0], 3 * int64_t(P - 1));
  }
}

// Splitting the sequence over more ranks must not make the result less exact: the error against
// fp64 at P ranks stays within rounding of the error of one rank doing all the work.
TEST_F(RingAttentionMpi, ErrorDoesNotGrowWithRanks) {
  Case c{LayoutKind::zigzag, Schedule::direct, 1};
  c.L = 523;
  c.B = 1;
  const ShardedReference::Errors at_p = run_and_check(*comm, c);
  std::unique_ptr<comm::Communicator> alone = comm->split(comm->rank() == 0 ? 0 : -1, 0);
  double worst[5] = {at_p.o, at_p.lse, at_p.dq, at_p.dk, at_p.dv};
  comm->allreduce(worst, 5, DType::f64, comm::ReduceOp::max);
  if (alone) {
    const ShardedReference::Errors at_1 = run_and_check(*alone, c);
    const double one[5] = {at_1.o, at_1.lse, at_1.dq, at_1.dk, at_1.dv};
    const char* names[5] = {"o", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i)
      EXPECT_LE(worst[i], 2.0 * one[i] + 1e-6) << names[i] << ": P=" << comm->size() << " error " << worst[i]
                                               << " vs P=1 error " << one[i];
  }
  comm->barrier();
}

}  // namespace
}  // namespace ringattn::testing
