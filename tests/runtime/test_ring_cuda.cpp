// The ring executor on the CUDA backend against the CPU backend, under mpirun: with the MPI
// communicator behind HostStagedCommunicator (ranks may share a GPU), and, where every rank
// has its own GPU, with the NCCL communicator; plus the NCCL communicator's own operations
// (collectives on device and host buffers, tag matching out of posting order, messages to
// oneself) and its error when a node has more ranks than GPUs. Skips without a CUDA device.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/host_staged_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/random_inputs.hpp"
#include "runtime/ring_attention.hpp"
#include "tests/support/test_util.hpp"
#if defined(RINGATTN_WITH_NCCL) && !defined(RINGATTN_CUDA_EMULATION)
#include <cuda_runtime_api.h>

#include "comm/nccl_communicator.hpp"
#define RINGATTN_TEST_NCCL 1
#endif

namespace ringattn::testing {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device visible"

struct Case {
  const char* name;
  LayoutKind layout;
  int64_t seq_len;
  Mask mask;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"causal zigzag", LayoutKind::zigzag, 300, Mask{}});
  c.back().mask.causal = true;
  c.push_back({"window contiguous", LayoutKind::contiguous, 257, Mask{}});
  c.back().mask.window_left = 40, c.back().mask.window_right = 10;
  c.push_back({"causal docs striped", LayoutKind::striped, 280, Mask{}});
  c.back().mask.causal = true;
  c.back().mask.set_documents({100, 90, 90});
  return c;
}

struct Result {
  std::vector<float> o, lse, dq, dk, dv;
};

DeviceBuffer to_backend(AttentionBackend& be, const std::vector<float>& x, DType dtype) {
  if (dtype == DType::f32) {
    DeviceBuffer b(be, x.size() * sizeof(float));
    be.upload(b.data(), x.data(), b.bytes());
    return b;
  }
  const std::vector<bf16_bits> h = to_bf16(x);
  DeviceBuffer b(be, h.size() * sizeof(bf16_bits));
  be.upload(b.data(), h.data(), b.bytes());
  return b;
}

std::vector<float> from_backend(AttentionBackend& be, const DeviceBuffer& b) {
  std::vector<float> x(b.bytes() / sizeof(float));
  be.synchronize();
  be.download(x.data(), b.data(), b.bytes());
  return x;
}

Result run_ring(comm::Communicator& comm, AttentionBackend& be, const Case& c, const kernels::AttentionDims& dims,
                DType dtype, Schedule schedule) {
  const ShardLayout layout(c.layout, c.seq_len, comm.size());
  const std::vector<int64_t> pos = layout.positions(comm.rank());
  const int64_t rows = int64_t(pos.size()), B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim;
  auto make = [&](RandomTensor t, int64_t heads) {
    std::vector<float> x(size_t(B * rows * heads * D));
    random_rows(x.data(), 7, t, B, c.seq_len, heads * D, pos.data(), rows);
    return x;
  };
  DeviceBuffer q = to_backend(be, make(RandomTensor::q, H), dtype),
               k = to_backend(be, make(RandomTensor::k, Hkv), dtype),
               v = to_backend(be, make(RandomTensor::v, Hkv), dtype),
               dout = to_backend(be, make(RandomTensor::dout, H), dtype);
  DeviceBuffer o(be, sizeof(float) * size_t(B * rows * H * D)), lse(be, sizeof(float) * size_t(B * H * rows));
  DeviceBuffer dq(be, o.bytes()), dk(be, sizeof(float) * size_t(B * rows * Hkv * D)), dv(be, dk.bytes());
  // Our kernels: the cuDNN path has its own tests (test_ring_cudnn.cpp).
  RingAttention ring(comm, be, layout, c.mask, RingOptions{dims, dtype, schedule, KernelChoice::own});
  ring.forward(q.data(), k.data(), v.data(), o.as<float>(), lse.as<float>());
  ring.backward(q.data(), k.data(), v.data(), o.as<float>(), lse.as<float>(), dout.data(), dq.as<float>(),
                dk.as<float>(), dv.as<float>());
  return {from_backend(be, o), from_backend(be, lse), from_backend(be, dq), from_backend(be, dk), from_backend(be, dv)};
}

void expect_same(const Result& got, const Result& want, DType dtype, const std::string& what) {
  const std::vector<float>* g[] = {&got.o, &got.lse, &got.dq, &got.dk, &got.dv};
  const std::vector<float>* w[] = {&want.o, &want.lse, &want.dq, &want.dk, &want.dv};
  const char* names[] = {"o", "lse", "dq", "dk", "dv"};
  for (int t = 0; t < 5; ++t) {
    double scale = 0.0;
    for (float x : *w[t])
      if (std::isfinite(x)) scale = std::max(scale, double(std::abs(x)));
    const double tol = (dtype == DType::f32 ? 2e-5 : 2e-2) * std::max(1.0, scale);
    EXPECT_LE(max_abs_diff(*g[t], *w[t]), tol) << what << " " << names[t];
  }
}

// Every case, schedule and dtype: the CUDA backend over `device_comm` against the CPU backend over MPI.
void check_against_cpu(comm::Communicator& device_comm, comm::Communicator& host_comm, AttentionBackend& gpu,
                       const std::string& label) {
  auto cpu = make_cpu_backend(1);
  const kernels::AttentionDims dims{2, 4, 2, 64, 0.125f};
  for (const Case& c : cases())
    for (Schedule s : {Schedule::direct, Schedule::ring})
      for (DType dtype : {DType::f32, DType::bf16}) {
        const Result got = run_ring(device_comm, gpu, c, dims, dtype, s);
        const Result want = run_ring(host_comm, *cpu, c, dims, dtype, s);
        expect_same(got, want, dtype,
                    label + " " + c.name + " " + schedule_name(s) + " " + dtype_name(dtype) + " rank " +
                        std::to_string(host_comm.rank()));
      }
}

TEST(RingCuda, HostStagedMpiMatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  world.set_timeout(120);
  comm::HostStagedCommunicator staged(world);
  EXPECT_EQ(staged.memory(), comm::MemorySpace::device);
  auto gpu = make_cuda_backend(world.rank() % cuda_device_count());
  check_against_cpu(staged, world, *gpu, "host-staged mpi");
  EXPECT_GT(staged.bytes_sent() + (world.size() == 1 ? 1 : 0), 0u);
}

#if defined(RINGATTN_TEST_NCCL)

// Ranks of the tests run on one node.
bool one_gpu_per_rank() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size <= cuda_device_count();
}

TEST(NcclCommunicator, MoreRanksThanGpusIsAClearError) {
  SKIP_WITHOUT_GPU();
  if (one_gpu_per_rank()) GTEST_SKIP() << "every rank has its own GPU here";
  try {
    comm::NcclCommunicator nccl(MPI_COMM_WORLD);
    FAIL() << "expected an error: more ranks than GPUs";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.find("ranks but") != std::string::npos || m.find("another node") != std::string::npos) << m;
  }
  EXPECT_THROW(comm::gpu_for_local_rank(2, 3, 2, "node7"), std::runtime_error);
  EXPECT_EQ(comm::gpu_for_local_rank(1, 2, 2, "node7"), 1);
}

template <class T>
struct DeviceVector {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceVector(const std::vector<T>& host) : n(host.size()) {
    cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T) + 1);
    cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceVector() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

TEST(NcclCommunicator, CollectivesOnDeviceAndHostMemory) {
  SKIP_WITHOUT_GPU();
  if (!one_gpu_per_rank()) GTEST_SKIP() << "more ranks than GPUs";
  comm::NcclCommunicator nccl(MPI_COMM_WORLD);
  nccl.set_timeout(60);
  const int P = nccl.size(), r = nccl.rank();
  // allreduce, on the device and on the host
  DeviceVector<float> d(std::vector<float>{float(r + 1), -float(r)});
  nccl.allreduce(d.p, 2, DType::f32, comm::ReduceOp::sum);
  EXPECT_EQ(d.host()[0], float(P * (P + 1) / 2));
  double h = r;
  nccl.allreduce(&h, 1, DType::f64, comm::ReduceOp::max);
  EXPECT_EQ(h, double(P - 1));
  // broadcast
  std::string text = r == 0 ? "from rank zero" : "..............";
  nccl.broadcast(text.data(), text.size(), 0);
  EXPECT_EQ(text, "from rank zero");
  // allgather and allgatherv (uneven)
  std::vector<int32_t> all(static_cast<size_t>(P));
  const int32_t mine = 10 * r;
  nccl.allgather(&mine, all.data(), sizeof mine);
  for (int i = 0; i < P; ++i) EXPECT_EQ(all[size_t(i)], 10 * i);
  std::vector<size_t> counts(static_cast<size_t>(P));
  for (int i = 0; i < P; ++i) counts[size_t(i)] = size_t(i + 1);
  std::vector<uint8_t> part(size_t(r + 1), uint8_t(r)), gathered(size_t(P * (P + 1) / 2));
  nccl.allgatherv(part.data(), gathered.data(), counts);
  size_t at = 0;
  for (int i = 0; i < P; ++i)
    for (int j = 0; j <= i; ++j) EXPECT_EQ(gathered[at++], uint8_t(i));
  // reduce_scatter, equal and uneven counts
  for (bool uneven : {false, true}) {
    std::vector<size_t> c(static_cast<size_t>(P), 3);
    if (uneven)
      for (int i = 0; i < P; ++i) c[size_t(i)] = size_t(i + 1);
    size_t total = 0;
    for (size_t x : c) total += x;
    std::vector<int64_t> send(total, int64_t(r + 1)), recv(c[size_t(r)], 0);
    nccl.reduce_scatter(send.data(), recv.data(), c, DType::i64, comm::ReduceOp::sum);
    for (int64_t x : recv) EXPECT_EQ(x, int64_t(P * (P + 1) / 2));
  }
  nccl.barrier();
}

TEST(NcclCommunicator, TagsMatchOutOfPostingOrderAndMessagesToOneself) {
  SKIP_WITHOUT_GPU();
  if (!one_gpu_per_rank()) GTEST_SKIP() << "more ranks than GPUs";
  comm::NcclCommunicator nccl(MPI_COMM_WORLD);
  nccl.set_timeout(60);
  const int P = nccl.size(), r = nccl.rank();
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  const size_t n = 1 << 20;
  auto payload = [&](int from, int tag) {
    std::vector<uint8_t> x(n + size_t(tag));
    for (size_t i = 0; i < x.size(); ++i) x[i] = uint8_t((i * 131 + size_t(from) * 17 + size_t(tag) * 7) & 0xff);
    return x;
  };
  // Two messages to the next rank, tags 1 then 2; the previous rank's receives are posted 2 then 1.
  DeviceVector<uint8_t> out1(payload(r, 1)), out2(payload(r, 2));
  DeviceVector<uint8_t> in1(std::vector<uint8_t>(n + 1)), in2(std::vector<uint8_t>(n + 2));
  comm::Request recv2 = nccl.irecv(in2.p, n + 2, prev, 2);
  comm::Request send1 = nccl.isend(out1.p, n + 1, next, 1);
  comm::Request send2 = nccl.isend(out2.p, n + 2, next, 2);
  nccl.wait(recv2, "tag 2");  // needs tag 1 received early into a temporary
  comm::Request recv1 = nccl.irecv(in1.p, n + 1, prev, 1);
  nccl.wait(recv1, "tag 1");
  nccl.wait(send1, "send 1");
  nccl.wait(send2, "send 2");
  EXPECT_TRUE(in1.host() == payload(prev, 1));
  EXPECT_TRUE(in2.host() == payload(prev, 2));
  // To oneself, receive before and after the send, and host buffers.
  std::vector<uint8_t> self_in(n + 3);
  const std::vector<uint8_t> self_out = payload(r, 3);
  comm::Request a = nccl.irecv(self_in.data(), n + 3, r, 3);
  comm::Request b = nccl.isend(self_out.data(), n + 3, r, 3);
  nccl.wait(a, "self receive");
  nccl.wait(b, "self send");
  EXPECT_TRUE(self_in == self_out);
  EXPECT_GE(nccl.bytes_sent(), uint64_t(3 * n));
}

TEST(RingCuda, NcclMatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  if (!one_gpu_per_rank()) GTEST_SKIP() << "more ranks than GPUs";
  comm::NcclCommunicator nccl(MPI_COMM_WORLD);
  nccl.set_timeout(120);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  auto gpu = make_cuda_backend(nccl.device());
  check_against_cpu(nccl, world, *gpu, "nccl");
}

#endif  // RINGATTN_TEST_NCCL

}  // namespace
}  // namespace ringattn::testing
