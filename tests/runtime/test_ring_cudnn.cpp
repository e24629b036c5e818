// The ring through the CUDA backend's cuDNN path (--kernel cudnn), forward and backward, under
// mpirun: every mask kind, both schedules, every layout, bf16, judged against fp64 on every row by
// the --check's rule (runtime/check.hpp) with the precision model of the path that ran. On the
// CPU emulation cuDNN's calls are its stand-in (emulation/cuda/cudnn_emulation.cpp: cuDNN's own
// keep-predicate and rounding), so this checks the planner, the graphs' tensors and offsets, the
// merges and the gradient sums end to end; on a GPU the real cuDNN. Skips without a CUDA device
// or a usable cuDNN.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comm/host_staged_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "runtime/check.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/ring_attention.hpp"
#include "tests/support/sharded_reference.hpp"

namespace ringattn::testing {
namespace {

struct Case {
  std::string name;
  LayoutKind layout;
  int64_t seq_len;
  Mask mask;
  bool all_on_cudnn;  // every step of both passes (no block mask, no lone pair)
};

std::vector<Case> cases() {
  std::vector<Case> c;
  auto add = [&](const std::string& name, LayoutKind layout, int64_t L, bool all) {
    c.push_back({name, layout, L, Mask{}, all});
    return &c.back().mask;
  };
  add("none contiguous", LayoutKind::contiguous, 203, true);
  add("causal zigzag", LayoutKind::zigzag, 240, true)->causal = true;
  add("causal striped", LayoutKind::striped, 222, true)->causal = true;
  Mask* m = add("window(40,10) contiguous", LayoutKind::contiguous, 257, true);
  m->window_left = 40, m->window_right = 10;
  m = add("causal window(48,-1) zigzag", LayoutKind::zigzag, 230, true);
  m->causal = true, m->window_left = 48;
  m = add("causal documents zigzag", LayoutKind::zigzag, 240, false);
  m->causal = true, m->set_documents({90, 1, 37, 0, 112});
  m = add("window(20,20) documents striped", LayoutKind::striped, 210, false);
  m->window_left = 20, m->window_right = 20, m->set_documents({70, 70, 70});
  // Tiles of 128: the forward on cuDNN's tile mask, the backward on our kernels. (Not causal: a
  // band beside the tiles needs cuDNN 9.21, and the stand-in is 9.19.)
  m = add("block mask contiguous", LayoutKind::contiguous, 384, false);
  std::mt19937_64 gen(5);
  std::vector<uint8_t> bits(9);
  for (uint8_t& b : bits) b = gen() % 4 != 0;
  bits[0] = bits[4] = bits[8] = 1;
  m->set_block_mask(bits, 3, 128);
  return c;
}

struct RingResult {
  PassStats forward, backward;
  CheckReport check;
};

RingResult run_case(comm::Communicator& world, comm::Communicator& device_comm, AttentionBackend& gpu, const Case& c,
                    Schedule schedule, const RingOptions& base) {
  const kernels::AttentionDims& dims = base.dims;
  const ShardLayout layout(c.layout, c.seq_len, world.size());
  const std::vector<int64_t> pos = layout.positions(world.rank());
  const int64_t rows = int64_t(pos.size()), B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim;
  const uint64_t seed = 11;
  const std::vector<float> q = seeded_rows(seed, RandomTensor::q, B, c.seq_len, H * D, pos, DType::bf16);
  const std::vector<float> k = seeded_rows(seed, RandomTensor::k, B, c.seq_len, Hkv * D, pos, DType::bf16);
  const std::vector<float> v = seeded_rows(seed, RandomTensor::v, B, c.seq_len, Hkv * D, pos, DType::bf16);
  const std::vector<float> dout = seeded_rows(seed, RandomTensor::dout, B, c.seq_len, H * D, pos, DType::bf16);
  auto put = [&](const std::vector<float>& x) {
    const std::vector<uint8_t> bytes = stored(x, DType::bf16);
    DeviceBuffer b(gpu, bytes.size());
    gpu.upload(b.data(), bytes.data(), bytes.size());
    return b;
  };
  DeviceBuffer qd = put(q), kd = put(k), vd = put(v), dd = put(dout);
  DeviceBuffer o(gpu, sizeof(float) * size_t(B * rows * H * D)), lse(gpu, sizeof(float) * size_t(B * H * rows));
  DeviceBuffer dq(gpu, o.bytes()), dk(gpu, sizeof(float) * size_t(B * rows * Hkv * D)), dv(gpu, dk.bytes());
  RingOptions options = base;
  options.schedule = schedule;
  RingResult r;
  {
    RingAttention ring(device_comm, gpu, layout, c.mask, options);
    r.forward = ring.forward(qd.data(), kd.data(), vd.data(), o.as<float>(), lse.as<float>());
    r.backward = ring.backward(qd.data(), kd.data(), vd.data(), o.as<float>(), lse.as<float>(), dd.data(),
                               dq.as<float>(), dk.as<float>(), dv.as<float>());
  }
  auto host = [&](const DeviceBuffer& b) {
    std::vector<float> x(b.bytes() / sizeof(float));
    gpu.synchronize();
    gpu.download(x.data(), b.data(), b.bytes());
    return x;
  };
  const std::vector<float> oh = host(o), lh = host(lse), dqh = host(dq), dkh = host(dk), dvh = host(dv);
  const CheckTensors t{q.data(),    k.data(),   v.data(),   oh.data(), lh.data(),
                       dout.data(), dqh.data(), dkh.data(), dvh.data()};
  r.check = check_sampled_rows(world, layout, c.mask, dims, t, true, int(c.seq_len), 3,
                               gpu.same_precision(dims, DType::bf16));
  return r;
}

class RingCudnn : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device visible";
    world_ = std::make_unique<comm::MpiCommunicator>(MPI_COMM_WORLD);
    world_->set_timeout(300);
    staged_ = std::make_unique<comm::HostStagedCommunicator>(*world_);
    gpu_ = make_cuda_backend(world_->rank() % cuda_device_count());
    if (const auto problem = gpu_->kernel_problem(KernelChoice::cudnn, dims_, DType::bf16)) GTEST_SKIP() << problem->what();
  }
  RingOptions options(KernelChoice kernel, bool deterministic = false) const {
    RingOptions o;
    o.dims = dims_, o.dtype = DType::bf16, o.kernel = kernel, o.deterministic = deterministic;
    return o;
  }
  kernels::AttentionDims dims_{2, 4, 2, 64, 0.125f};
  std::unique_ptr<comm::MpiCommunicator> world_;
  std::unique_ptr<comm::HostStagedCommunicator> staged_;
  std::unique_ptr<AttentionBackend> gpu_;
};

TEST_F(RingCudnn, EveryMaskAndScheduleMatchesFp64) {
  for (const Case& c : cases())
    for (Schedule s : {Schedule::direct, Schedule::ring}) {
      const std::string what = c.name + " " + schedule_name(s) + " P=" + std::to_string(world_->size());
      const RingResult r = run_case(*world_, *staged_, *gpu_, c, s, options(KernelChoice::cudnn));
      EXPECT_TRUE(r.check.passed()) << what << ": " << r.check.describe();
      EXPECT_GT(r.forward.cudnn_steps, 0) << what;
      EXPECT_EQ(r.forward.cudnn_steps + r.forward.own_steps, r.forward.compute_steps) << what;
      if (c.all_on_cudnn) {
        EXPECT_EQ(r.forward.own_steps, 0) << what;
        EXPECT_EQ(r.backward.own_steps, 0) << what;
      }
      if (c.mask.has_block_mask()) EXPECT_EQ(r.backward.cudnn_steps, 0) << what;  // no block mask in cuDNN's backward
      if (world_->rank() == 0)
        std::printf("[ cudnn    ] %s: forward %d/%d steps on cuDNN, backward %d/%d; %s\n", what.c_str(),
                    r.forward.cudnn_steps, r.forward.compute_steps, r.backward.cudnn_steps, r.backward.compute_steps,
                    r.check.describe().c_str());
    }
}

TEST_F(RingCudnn, OwnKernelsAndTheDeterministicBackward) {
  const Case c = cases()[1];  // causal zigzag
  const RingResult own = run_case(*world_, *staged_, *gpu_, c, Schedule::direct, options(KernelChoice::own));
  EXPECT_EQ(own.forward.cudnn_steps + own.backward.cudnn_steps, 0);
  EXPECT_TRUE(own.check.passed()) << own.check.describe();
  // The stand-in (and Hopper before cuDNN 9.25) has no deterministic backward with a linear
  // workspace: the forward stays on cuDNN, the backward runs ours.
  const RingResult det = run_case(*world_, *staged_, *gpu_, c, Schedule::direct, options(KernelChoice::cudnn, true));
  EXPECT_GT(det.forward.cudnn_steps, 0);
  if (gpu_->cudnn_version() < 92500) EXPECT_EQ(det.backward.cudnn_steps, 0);
  EXPECT_TRUE(det.check.passed()) << det.check.describe();
}

TEST_F(RingCudnn, KernelChoiceIsRefusedWhereCudnnCannotRun) {
  // The problem, or "" when there is none: an ArgumentError naming kernel.
  auto problem = [](const std::optional<ArgumentError>& e) {
    EXPECT_TRUE(!e || e->argument() == "kernel");
    return e ? std::string(e->what()) : std::string();
  };
  EXPECT_NE(problem(gpu_->kernel_problem(KernelChoice::cudnn, dims_, DType::f32)).find("kernel cudnn"),
            std::string::npos);
  kernels::AttentionDims odd = dims_;
  odd.head_dim = 20;
  EXPECT_NE(problem(gpu_->kernel_problem(KernelChoice::cudnn, odd, DType::bf16)).find("head dim"), std::string::npos);
  EXPECT_EQ(problem(gpu_->kernel_problem(KernelChoice::automatic, dims_, DType::f32)), "");
  EXPECT_NE(problem(make_cpu_backend(1)->kernel_problem(KernelChoice::cudnn, dims_, DType::bf16)).find("kernel cudnn"),
            std::string::npos);
  EXPECT_GT(gpu_->cudnn_version(), 0);
  EXPECT_NE(gpu_->cudnn_status().find("cuDNN"), std::string::npos);
}

}  // namespace
}  // namespace ringattn::testing
