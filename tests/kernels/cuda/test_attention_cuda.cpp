// The CUDA kernels against the CPU ones (the oracle) and the fp64 reference, on the same inputs
// rounded to the element type: every mask kind and combination, GQA/MQA, batch, odd lengths,
// head dims 64 and 128 (and others on the simple path), empty rows, huge scores, merging and
// accumulating partial states, and determinism. Each case runs every kernel that applies
// (tensor cores for bf16/fp16 with D = 64/96/128/256, the simple fp32 kernels always) and every
// element type. Skips when no CUDA device is visible.
//
// Tolerances in the FlashAttention manner: per tensor, the GPU's error against fp64 may be a few
// times the error of a computation in the same precision: the larger of the CPU kernel's and a
// plain fp32 one's; for the tensor-core kernels, of a plain fp32 one that also rounds P and dS
// to the element type before their products, as those kernels do.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/dq_order.cuh"
#include "kernels/cuda/mask_32bit.cuh"
#include "kernels/reference.hpp"
#include "tests/support/gtest_or_mini.hpp"
#include "tests/support/attention_oracle.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {
namespace {

using kernels::AttentionState;
using kernels::CudaKernel;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool device_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!device_present()) GTEST_SKIP() << "no CUDA device visible"

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device allocation of `n` elements of T, filled from / read back to host vectors.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (n_) cuda_ok(cudaMalloc(&p_, n_ * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void upload(const std::vector<T>& host) {
    if (n_) cuda_ok(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) cuda_ok(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }
  T* get() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

float round_to(float x, DType t) {
  if (t == DType::bf16) return bf16_to_float(float_to_bf16(x));
  if (t == DType::f16) return __half2float(__float2half_rn(x));
  return x;
}

std::vector<float> rounded(const std::vector<float>& x, DType t) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = round_to(x[i], t);
  return y;
}

// Host bytes of x in the element type.
std::vector<uint8_t> encode(const std::vector<float>& x, DType t) {
  std::vector<uint8_t> out(x.size() * size_t(dtype_bytes(t)));
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[4 * i], &x[i], 4);
    } else {
      uint16_t bits;
      if (t == DType::bf16) {
        bits = float_to_bf16(x[i]);
      } else {
        const __half h = __float2half_rn(x[i]);
        std::memcpy(&bits, &h, 2);
      }
      std::memcpy(&out[2 * i], &bits, 2);
    }
  }
  return out;
}

// The mask with its arrays in device memory.
struct DeviceMask {
  std::vector<int64_t> docs_host;
  std::vector<uint8_t> blocks_host;
  DeviceArray<int64_t> docs;
  DeviceArray<uint8_t> blocks;
  MaskView view;

  explicit DeviceMask(const Mask& m)
      : docs_host(m.doc_offsets()), blocks_host(m.block_mask()), docs(docs_host), blocks(blocks_host), view(m.view()) {
    view.doc_offsets = m.has_documents() ? docs.get() : nullptr;
    view.block_mask = m.has_block_mask() ? blocks.get() : nullptr;
    view.row_run_ptr = nullptr, view.row_runs = nullptr, view.col_run_ptr = nullptr, view.col_runs = nullptr;
  }
};

struct DeviceProblem {
  DeviceArray<uint8_t> q, k, v, dout;
  DeviceArray<int64_t> q_pos, k_pos;
  DeviceMask mask;
  DType type;

  DeviceProblem(const Problem& p, DType t)
      : q(encode(p.q, t)),
        k(encode(p.k, t)),
        v(encode(p.v, t)),
        dout(encode(p.dout, t)),
        q_pos(p.q_pos),
        k_pos(p.k_pos),
        mask(p.mask),
        type(t) {}

  kernels::CudaQueryRows queries(const Problem& p) const { return {q.get(), type, p.rows_q(), q_pos.get()}; }
  // Keys [first, last) of the problem.
  kernels::CudaKeyValueRows keys(const Problem& p, int64_t first, int64_t last) const {
    const size_t row = size_t(p.dims.kv_heads * p.dims.head_dim * dtype_bytes(type));
    // The rows of one key chunk are not contiguous across the batch: chunked tests use batch 1.
    return {k.get() + first * row, v.get() + first * row, type, last - first, k_pos.get() + first};
  }
};

Outputs run_gpu(const Problem& p, DType t, CudaKernel kernel, bool backward = true) {
  DeviceProblem dp(p, t);
  kernels::CudaOptions opt;
  opt.kernel = kernel;
  DeviceArray<float> o(std::vector<float>(p.q_elems(), 0.0f)), lse(std::vector<float>(p.lse_elems(), kNegInf));
  kernels::cuda_attention_forward(p.dims, dp.queries(p), dp.keys(p, 0, p.rows_k()), dp.mask.view,
                                  AttentionState{o.get(), lse.get()}, opt);
  Outputs r;
  if (backward) {
    DeviceArray<float> delta(p.lse_elems());
    kernels::cuda_attention_delta(p.dims, p.rows_q(), o.get(), dp.dout.get(), t, delta.get(), nullptr);
    DeviceArray<float> dq(std::vector<float>(p.q_elems(), 0.0f)), dk(std::vector<float>(p.k_elems(), 0.0f)),
        dv(std::vector<float>(p.k_elems(), 0.0f));
    kernels::cuda_attention_backward(p.dims, dp.queries(p), dp.keys(p, 0, p.rows_k()), dp.dout.get(), lse.get(),
                                     delta.get(), dq.get(), dk.get(), dv.get(), dp.mask.view, opt);
    cuda_ok(cudaDeviceSynchronize(), "backward");
    r.dq = dq.download(), r.dk = dk.download(), r.dv = dv.download();
  }
  cuda_ok(cudaDeviceSynchronize(), "forward");
  r.o = o.download(), r.lse = lse.download();
  return r;
}

// Plain fp32 attention, row by row. With `round` != f32, P and dS are rounded to that type
// before the products they enter (O = P V, dV = P^T dO, dQ = dS K, dK = dS^T Q), as the
// tensor-core kernels do: the same-precision baseline of their tolerance.
Outputs run_naive(const Problem& p, DType round) {
  const int64_t B = p.dims.batch, H = p.dims.heads, Hkv = p.dims.kv_heads, D = p.dims.head_dim;
  const int64_t Lq = p.rows_q(), Lk = p.rows_k(), group = H / Hkv;
  const float scale = p.dims.scale;
  const MaskView mask = p.mask.view();
  Outputs r;
  r.o.assign(p.q_elems(), 0.0f);
  r.lse.assign(p.lse_elems(), kNegInf);
  r.dq.assign(p.q_elems(), 0.0f);
  r.dk.assign(p.k_elems(), 0.0f);
  r.dv.assign(p.k_elems(), 0.0f);
  std::vector<float> s(static_cast<size_t>(Lk));
  auto qrow = [&](const std::vector<float>& x, int64_t b, int64_t i, int64_t h) {
    return &x[size_t(((b * Lq + i) * H + h) * D)];
  };
  auto krow = [&](const std::vector<float>& x, int64_t b, int64_t j, int64_t kvh) {
    return &x[size_t(((b * Lk + j) * Hkv + kvh) * D)];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Lq; ++i) {
        const int64_t kvh = h / group;
        const float* qi = qrow(p.q, b, i, h);
        float m = kNegInf;
        for (int64_t j = 0; j < Lk; ++j) {
          s[size_t(j)] = kNegInf;
          if (!visible(mask, p.q_pos[size_t(i)], p.k_pos[size_t(j)])) continue;
          const float* kj = krow(p.k, b, j, kvh);
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
          s[size_t(j)] = dot * scale;
          m = std::max(m, s[size_t(j)]);
        }
        if (m == kNegInf) continue;
        float l = 0.0f;
        float* oi = &r.o[size_t(((b * Lq + i) * H + h) * D)];
        for (int64_t j = 0; j < Lk; ++j) {
          if (s[size_t(j)] == kNegInf) continue;
          const float pr = std::exp(s[size_t(j)] - m);
          l += pr;
          const float* vj = krow(p.v, b, j, kvh);
          for (int64_t d = 0; d < D; ++d) oi[d] += round_to(pr, round) * vj[d];
        }
        for (int64_t d = 0; d < D; ++d) oi[d] /= l;
        const float lse = m + std::log(l);
        r.lse[size_t((b * H + h) * Lq + i)] = lse;

        const float* doi = qrow(p.dout, b, i, h);
        float delta = 0.0f;
        for (int64_t d = 0; d < D; ++d) delta += oi[d] * doi[d];
        float* dqi = &r.dq[size_t(((b * Lq + i) * H + h) * D)];
        for (int64_t j = 0; j < Lk; ++j) {
          if (s[size_t(j)] == kNegInf) continue;
          const float pr = std::exp(s[size_t(j)] - lse);
          const float* kj = krow(p.k, b, j, kvh);
          const float* vj = krow(p.v, b, j, kvh);
          float dp = 0.0f;
          for (int64_t d = 0; d < D; ++d) dp += doi[d] * vj[d];
          const float ds = round_to(pr * (dp - delta), round);
          const float pt = round_to(pr, round);
          float* dkj = &r.dk[size_t(((b * Lk + j) * Hkv + kvh) * D)];
          float* dvj = &r.dv[size_t(((b * Lk + j) * Hkv + kvh) * D)];
          for (int64_t d = 0; d < D; ++d) {
            dqi[d] += scale * ds * kj[d];
            dkj[d] += scale * ds * qi[d];
            dvj[d] += pt * doi[d];
          }
        }
      }
  return r;
}

const char* kernel_name(CudaKernel k) { return k == CudaKernel::simple ? "simple" : "tensor_core"; }

// err(gpu) <= factor * max(err of the same-precision baselines) + atol.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<const std::vector<float>*>& baselines, double factor, double atol) {
  ASSERT_TRUE(what.find("lse") != std::string::npos || all_finite(got)) << what << " has NaN/Inf";
  const double err = max_abs_diff(got, ref);
  double base = 0.0;
  for (const std::vector<float>* b : baselines) base = std::max(base, max_abs_diff(*b, ref));
  EXPECT_LE(err, factor * base + atol) << what << ": GPU error " << err << " vs same-precision error " << base;
  if (std::getenv("RINGATTN_TEST_VERBOSE"))
    std::printf("  %-24s error %.3e  same-precision error %.3e  ratio %.2f\n", what.c_str(), err, base,
                base > 0 ? err / base : 0.0);
}

struct Variant {
  DType type;
  CudaKernel kernel;
};

// Every (element type, kernel) pair that applies to head dim D.
std::vector<Variant> variants(int64_t D, bool with_f32 = true) {
  std::vector<Variant> v;
  const bool tensor = D == 64 || D == 96 || D == 128 || D == 256;
  for (DType t : {DType::bf16, DType::f16}) {
    if (tensor) v.push_back({t, CudaKernel::tensor_core});
    v.push_back({t, CudaKernel::simple});
  }
  if (with_f32) v.push_back({DType::f32, CudaKernel::simple});
  return v;
}

// Runs the problem on every variant and checks it against the CPU kernel and the fp64 reference.
void check_problem(const Problem& original) {
  for (const Variant& var : variants(original.dims.head_dim)) {
    Problem p = original;
    p.q = rounded(p.q, var.type), p.k = rounded(p.k, var.type), p.v = rounded(p.v, var.type);
    p.dout = rounded(p.dout, var.type);
    const std::string tag = std::string(dtype_name(var.type)) + "/" + kernel_name(var.kernel) + " ";
    const Outputs got = run_gpu(p, var.type, var.kernel);
    const Outputs cpu = run_cpu_kernels(p);
    const Outputs naive = run_naive(p, DType::f32);
    const RefOutputs ref = run_reference(p);
    std::vector<const std::vector<float>*> o_base{&cpu.o, &naive.o}, lse_base{&cpu.lse, &naive.lse},
        dq_base{&cpu.dq, &naive.dq}, dk_base{&cpu.dk, &naive.dk}, dv_base{&cpu.dv, &naive.dv};
    Outputs rounded_naive;
    double factor = 4.0, atol = 2e-6;
    if (var.kernel == CudaKernel::tensor_core) {
      rounded_naive = run_naive(p, var.type);
      for (auto* v : {&o_base, &lse_base, &dq_base, &dk_base, &dv_base}) v->clear();
      o_base.push_back(&rounded_naive.o), lse_base.push_back(&rounded_naive.lse);
      dq_base.push_back(&rounded_naive.dq), dk_base.push_back(&rounded_naive.dk), dv_base.push_back(&rounded_naive.dv);
      factor = 5.0, atol = 1e-5;
    }
    for (float x : got.lse) ASSERT_FALSE(std::isnan(x)) << tag << "lse is NaN";
    for (size_t i = 0; i < got.lse.size(); ++i)
      ASSERT_EQ(std::isinf(got.lse[i]), std::isinf(ref.lse[i])) << tag << "empty-row status differs at lse " << i;
    // Rows that see no key: O = 0 and dQ = 0 exactly.
    const int64_t H = p.dims.heads, D = p.dims.head_dim, L = p.rows_q();
    for (int64_t b = 0; b < p.dims.batch; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i) {
          if (got.lse[size_t((b * H + h) * L + i)] != kNegInf) continue;
          for (int64_t d = 0; d < D; ++d) {
            const size_t e = size_t(((b * L + i) * H + h) * D + d);
            ASSERT_EQ(got.o[e], 0.0f) << tag << "O of an empty row";
            ASSERT_EQ(got.dq[e], 0.0f) << tag << "dQ of an empty row";
          }
        }
    expect_close(tag + "o", got.o, ref.o, o_base, factor, atol);
    expect_close(tag + "lse", got.lse, ref.lse, lse_base, factor, atol);
    expect_close(tag + "dq", got.dq, ref.dq, dq_base, factor, atol);
    expect_close(tag + "dk", got.dk, ref.dk, dk_base, factor, atol);
    expect_close(tag + "dv", got.dv, ref.dv, dv_base, factor, atol);
  }
}

std::vector<uint8_t> random_block_mask(int64_t n, uint64_t seed, double density) {
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution bit(density);
  std::vector<uint8_t> m(size_t(n * n));
  for (auto& x : m) x = bit(gen);
  return m;
}

Problem basic(int64_t L = 200, int64_t D = 64, int64_t H = 2, int64_t Hkv = 2, int64_t B = 1) {
  return Problem(B, H, Hkv, D, iota_positions(L), iota_positions(L));
}

TEST(AttentionCuda, NoMaskOddLength) {
  SKIP_WITHOUT_GPU();
  check_problem(basic());
}

TEST(AttentionCuda, Causal) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(261);
  p.mask.causal = true;
  check_problem(p);
}

TEST(AttentionCuda, SlidingWindowBothSides) {
  SKIP_WITHOUT_GPU();
  Problem p = basic();
  p.mask.window_left = 17;
  p.mask.window_right = 5;
  check_problem(p);
}

TEST(AttentionCuda, CausalSlidingWindow) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(300);
  p.mask.causal = true;
  p.mask.window_left = 70;
  check_problem(p);
}

TEST(AttentionCuda, Documents) {
  SKIP_WITHOUT_GPU();
  Problem p = basic();
  p.mask.set_documents({50, 1, 80, 69});
  check_problem(p);
}

TEST(AttentionCuda, DocumentsCausal) {
  SKIP_WITHOUT_GPU();
  Problem p = basic();
  p.mask.causal = true;
  p.mask.set_documents({64, 3, 0, 70, 63});
  check_problem(p);
}

TEST(AttentionCuda, BlockMaskFinerThanTiles) {
  SKIP_WITHOUT_GPU();
  Problem p = basic();
  const int64_t n = (200 + 15) / 16;
  p.mask.set_block_mask(random_block_mask(n, 7, 0.4), n, 16);
  check_problem(p);
}

TEST(AttentionCuda, BlockMaskCoarserThanTiles) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(300);
  const int64_t n = (300 + 127) / 128;
  p.mask.set_block_mask(random_block_mask(n, 5, 0.5), n, 128);
  check_problem(p);
}

TEST(AttentionCuda, BigBird) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(300);
  const int64_t n = (300 + 31) / 32;
  p.mask.set_block_mask(bigbird_block_mask(n, 1, 1, 2, 42), n, 32);
  check_problem(p);
}

TEST(AttentionCuda, EveryMaskAtOnce) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(280);
  p.mask.causal = true;
  p.mask.window_left = 90;
  p.mask.window_right = 0;
  p.mask.set_documents({100, 130, 50});
  const int64_t n = (280 + 19) / 20;
  p.mask.set_block_mask(random_block_mask(n, 3, 0.6), n, 20);
  check_problem(p);
}

TEST(AttentionCuda, EmptyRowsFromBlockMask) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(130);
  const int64_t n = (130 + 15) / 16;
  auto m = random_block_mask(n, 11, 0.5);
  for (int64_t c = 0; c < n; ++c) m[size_t(2 * n + c)] = 0;  // block row 2 sees nothing
  p.mask.set_block_mask(m, n, 16);
  check_problem(p);
}

TEST(AttentionCuda, GroupedQueryAttention) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(150, 64, 4, 2);
  p.mask.causal = true;
  check_problem(p);
}

TEST(AttentionCuda, MultiQueryAttention) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(150, 64, 4, 1);
  p.mask.window_left = 20;
  p.mask.window_right = 20;
  check_problem(p);
}

TEST(AttentionCuda, BatchOfTwo) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(99, 64, 2, 1, 2);
  p.mask.causal = true;
  check_problem(p);
}

TEST(AttentionCuda, HeadDim128) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(190, 128, 4, 2, 2);
  p.mask.causal = true;
  check_problem(p);
}

TEST(AttentionCuda, HeadDim128Documents) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(170, 128, 2, 2);
  p.mask.set_documents({33, 100, 37});
  check_problem(p);
}

TEST(AttentionCuda, OtherHeadDimsOnTheSimplePath) {
  SKIP_WITHOUT_GPU();
  for (int64_t D : {16, 32, 80, 96, 256}) {
    Problem p = basic(97, D, 2, 1);
    p.mask.causal = true;
    check_problem(p);
  }
}

// The tensor-core kernels at D = 96 (12 output n-tiles) and 256 (Q read from shared memory, key
// blocks of 32, dK/dV columns split over two CTAs), under a causal block mask (seeded by
// `mask_seed`) with GQA, so that full, partial and empty tiles and several query heads per K/V
// head all occur. These are the head dims whose tile shapes differ between architecture families.
void check_head_dims_96_and_256(uint64_t mask_seed) {
  for (int64_t D : {96, 256}) {
    Problem p = basic(150, D, 2, 1);
    p.mask.causal = true;
    const int64_t n = (150 + 31) / 32;
    p.mask.set_block_mask(random_block_mask(n, mask_seed, 0.7), n, 32);
    check_problem(p);
  }
}

TEST(AttentionCuda, HeadDims96And256OnTensorCores) {
  SKIP_WITHOUT_GPU();
  check_head_dims_96_and_256(11);
}

#if defined(RINGATTN_CUDA_EMULATION)
// The shapes the kernels take on sm_80 where they differ from sm_90's (forward: key blocks of 32
// at D = 96, of 16 at D = 256; backward: query tiles of 32 at D = 256), on the emulation set to 8.0.
TEST(AttentionCuda, Sm80ShapesOnTheEmulation) {
  cuda_emulation::set_compute_capability(8, 0);
  struct Restore {
    ~Restore() { cuda_emulation::set_compute_capability(9, 0); }
  } restore;
  check_head_dims_96_and_256(13);
}
#endif

TEST(AttentionCuda, OddLengths) {
  SKIP_WITHOUT_GPU();
  for (int64_t L : {1, 2, 63, 65, 129}) {
    Problem p = basic(L);
    p.mask.causal = true;
    check_problem(p);
  }
}

TEST(AttentionCuda, StripedQueriesAgainstAllKeys) {
  SKIP_WITHOUT_GPU();
  Problem p(1, 2, 2, 64, iota_positions(70, 2, 3), iota_positions(212));
  p.mask.causal = true;
  check_problem(p);
}

TEST(AttentionCuda, ZigzagShardAgainstMiddleKeysHasEmptyRows) {
  SKIP_WITHOUT_GPU();
  std::vector<int64_t> qp = iota_positions(50);
  for (int64_t i = 150; i < 200; ++i) qp.push_back(i);
  Problem p(1, 2, 2, 64, qp, iota_positions(100, 50));
  p.mask.causal = true;
  check_problem(p);
  const Outputs got = run_gpu(p, DType::f32, CudaKernel::simple);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(got.lse[size_t(i)], kNegInf);  // queries before every key
}

TEST(AttentionCuda, GatheredKeyRows) {
  SKIP_WITHOUT_GPU();
  std::vector<int64_t> kp;
  for (int64_t j = 0; j < 400; j += (j % 7 == 0 ? 5 : 1)) kp.push_back(j);
  Problem p(1, 2, 1, 64, iota_positions(120, 200), kp);
  p.mask.causal = true;
  p.mask.window_left = 150;
  check_problem(p);
}

TEST(AttentionCuda, HugeScoresStayFinite) {
  SKIP_WITHOUT_GPU();
  Problem p(1, 2, 2, 64, iota_positions(160), iota_positions(160), 5, 100.0f);  // |scores| ~ 1e4
  p.mask.causal = true;
  for (const Variant& var : variants(64)) {
    Problem r = p;
    r.q = rounded(r.q, var.type), r.k = rounded(r.k, var.type), r.v = rounded(r.v, var.type);
    r.dout = rounded(r.dout, var.type);
    const Outputs got = run_gpu(r, var.type, var.kernel);
    EXPECT_TRUE(all_finite(got.o) && all_finite(got.dq) && all_finite(got.dk) && all_finite(got.dv))
        << dtype_name(var.type) << "/" << kernel_name(var.kernel);
  }
  check_problem(p);
}

// Accumulating key chunk after key chunk into one state (what the ring does), and merging
// states computed separately, both equal one pass; backward over key chunks likewise.
TEST(AttentionCuda, ChunkedForwardAndBackwardEqualOnePass) {
  SKIP_WITHOUT_GPU();
  Problem original = basic(257, 64, 4, 2);
  original.mask.causal = true;
  original.mask.window_left = 150;
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 37}, {37, 160}, {160, 257}};
  for (const Variant& var : variants(64)) {
    Problem p = original;
    p.q = rounded(p.q, var.type), p.k = rounded(p.k, var.type), p.v = rounded(p.v, var.type);
    p.dout = rounded(p.dout, var.type);
    const std::string tag = std::string(dtype_name(var.type)) + "/" + kernel_name(var.kernel) + " ";
    const Outputs whole = run_gpu(p, var.type, var.kernel);
    DeviceProblem dp(p, var.type);
    kernels::CudaOptions opt;
    opt.kernel = var.kernel;
    // The tensor-core kernels round P relative to the running maximum, which depends on where the
    // key blocks start: chunked and whole passes then differ at the element type's rounding level.
    const double tol = var.kernel == CudaKernel::simple ? 1e-5 : var.type == DType::bf16 ? 2e-2 : 4e-3;

    DeviceArray<float> o(std::vector<float>(p.q_elems(), 0.0f)), lse(std::vector<float>(p.lse_elems(), kNegInf));
    for (auto [s, e] : chunks)
      kernels::cuda_attention_forward(p.dims, dp.queries(p), dp.keys(p, s, e), dp.mask.view,
                                      AttentionState{o.get(), lse.get()}, opt);
    cuda_ok(cudaDeviceSynchronize(), "chunked forward");
    EXPECT_LE(max_abs_diff(o.download(), whole.o), tol) << tag << "accumulated O";
    EXPECT_LE(max_abs_diff(lse.download(), whole.lse), tol) << tag << "accumulated LSE";

    // Separate states merged in another order.
    DeviceArray<float> o2(std::vector<float>(p.q_elems(), 0.0f)), lse2(std::vector<float>(p.lse_elems(), kNegInf));
    DeviceArray<float> part_o(p.q_elems()), part_lse(p.lse_elems());
    for (int c : {2, 0, 1}) {
      part_o.upload(std::vector<float>(p.q_elems(), 0.0f));
      part_lse.upload(std::vector<float>(p.lse_elems(), kNegInf));
      kernels::cuda_attention_forward(p.dims, dp.queries(p),
                                      dp.keys(p, chunks[size_t(c)].first, chunks[size_t(c)].second), dp.mask.view,
                                      AttentionState{part_o.get(), part_lse.get()}, opt);
      kernels::cuda_merge_states(p.dims, p.rows_q(), AttentionState{o2.get(), lse2.get()}, part_o.get(), part_lse.get(),
                                 nullptr);
    }
    cuda_ok(cudaDeviceSynchronize(), "merged forward");
    EXPECT_LE(max_abs_diff(o2.download(), whole.o), tol) << tag << "merged O";
    EXPECT_LE(max_abs_diff(lse2.download(), whole.lse), tol) << tag << "merged LSE";

    // Backward over the chunks, with the whole pass's O and LSE.
    DeviceArray<float> wo(whole.o), wlse(whole.lse), delta(p.lse_elems());
    kernels::cuda_attention_delta(p.dims, p.rows_q(), wo.get(), dp.dout.get(), var.type, delta.get(), nullptr);
    DeviceArray<float> dq(std::vector<float>(p.q_elems(), 0.0f)), dk(std::vector<float>(p.k_elems(), 0.0f)),
        dv(std::vector<float>(p.k_elems(), 0.0f));
    const int64_t rowk = p.dims.kv_heads * p.dims.head_dim;
    for (auto [s, e] : chunks)
      kernels::cuda_attention_backward(p.dims, dp.queries(p), dp.keys(p, s, e), dp.dout.get(), wlse.get(), delta.get(),
                                       dq.get(), dk.get() + s * rowk, dv.get() + s * rowk, dp.mask.view, opt);
    cuda_ok(cudaDeviceSynchronize(), "chunked backward");
    EXPECT_LE(max_abs_diff(dq.download(), whole.dq), 1e-4) << tag << "dQ summed over chunks";
    EXPECT_LE(max_abs_diff(dk.download(), whole.dk), 1e-5) << tag << "dK per chunk";
    EXPECT_LE(max_abs_diff(dv.download(), whole.dv), 1e-5) << tag << "dV per chunk";
  }
}

// A state that already holds a result over other keys is continued, not overwritten: O and LSE
// of rows the new keys hide stay bit for bit.
TEST(AttentionCuda, StateOfRowsThatSeeNoNewKeyIsUntouched) {
  SKIP_WITHOUT_GPU();
  Problem p(1, 2, 2, 64, iota_positions(100), iota_positions(60, 40));
  p.mask.causal = true;  // queries 0..39 see none of the keys 40..99
  for (const Variant& var : variants(64)) {
    DeviceProblem dp(p, var.type);
    kernels::CudaOptions opt;
    opt.kernel = var.kernel;
    std::vector<float> o_in = random_vector(p.q_elems(), 9), lse_in = random_vector(p.lse_elems(), 10);
    DeviceArray<float> o(o_in), lse(lse_in);
    kernels::cuda_attention_forward(p.dims, dp.queries(p), dp.keys(p, 0, p.rows_k()), dp.mask.view,
                                    AttentionState{o.get(), lse.get()}, opt);
    cuda_ok(cudaDeviceSynchronize(), "forward");
    const std::vector<float> o_out = o.download(), lse_out = lse.download();
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 40; ++i) {
        EXPECT_EQ(lse_out[size_t(h * 100 + i)], lse_in[size_t(h * 100 + i)]);
        for (int64_t d = 0; d < 64; ++d) {
          const size_t e = size_t((i * 2 + h) * 64 + d);
          ASSERT_EQ(o_out[e], o_in[e]) << dtype_name(var.type) << "/" << kernel_name(var.kernel);
        }
      }
  }
}

// Two runs give the same bits (on a GPU, CTAs run in a different order each time; the
// tensor-core backward adds to dQ in a fixed order of key blocks all the same).
TEST(AttentionCuda, BackwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(300, 128, 4, 2, 2);
  p.mask.causal = true;
  for (const Variant& var : variants(128, false)) {
    const Outputs a = run_gpu(p, var.type, var.kernel), b = run_gpu(p, var.type, var.kernel);
    const std::string tag = std::string(dtype_name(var.type)) + "/" + kernel_name(var.kernel);
    EXPECT_TRUE(a.o == b.o) << tag;
    EXPECT_TRUE(a.dq == b.dq) << tag;
    EXPECT_TRUE(a.dk == b.dk) << tag;
    EXPECT_TRUE(a.dv == b.dv) << tag;
  }
}

// What makes the tensor-core backward deterministic, checked bit for bit: dQ receives each key
// block's part in ascending key block order, starting from what it holds (the ring's contract:
// dQ accumulates over ring steps). So one call over all keys equals calls over consecutive
// chunks of keys, in order, whose boundaries fall on key block boundaries (128 keys: a whole
// number of blocks); dK and dV of each chunk are its own. Every tensor-core head dim (D = 256:
// two CTAs per key block, each adding half of dQ's columns), GQA, documents and a block mask (so
// that some tiles skip some key blocks: the order then follows the blocks that visit them).
TEST(AttentionCuda, BackwardAddsKeyBlocksInOrder) {
  SKIP_WITHOUT_GPU();
  for (int64_t D : {64, 96, 128, 256}) {
    Problem p(1, 4, 2, D, iota_positions(200), iota_positions(300));
    p.mask.set_documents({40, 190, 70});
    const int64_t n = (300 + 31) / 32;
    p.mask.set_block_mask(random_block_mask(n, 21, 0.6), n, 32);
    const DType t = D == 96 ? DType::f16 : DType::bf16;
    p.q = rounded(p.q, t), p.k = rounded(p.k, t), p.v = rounded(p.v, t), p.dout = rounded(p.dout, t);
    const Outputs whole = run_gpu(p, t, CudaKernel::tensor_core);
    DeviceProblem dp(p, t);
    kernels::CudaOptions opt;
    opt.kernel = CudaKernel::tensor_core;
    DeviceArray<float> lse(whole.lse), o(whole.o), delta(p.lse_elems());
    kernels::cuda_attention_delta(p.dims, p.rows_q(), o.get(), dp.dout.get(), t, delta.get(), nullptr);
    DeviceArray<float> dq(std::vector<float>(p.q_elems(), 0.0f)), dk(std::vector<float>(p.k_elems(), 0.0f)),
        dv(std::vector<float>(p.k_elems(), 0.0f));
    const int64_t rowk = p.dims.kv_heads * D;
    for (int64_t s = 0; s < p.rows_k(); s += 128) {
      const int64_t e = std::min<int64_t>(s + 128, p.rows_k());
      kernels::cuda_attention_backward(p.dims, dp.queries(p), dp.keys(p, s, e), dp.dout.get(), lse.get(), delta.get(),
                                       dq.get(), dk.get() + s * rowk, dv.get() + s * rowk, dp.mask.view, opt);
    }
    cuda_ok(cudaDeviceSynchronize(), "chunked backward");
    EXPECT_TRUE(dq.download() == whole.dq) << "D = " << D;
    EXPECT_TRUE(dk.download() == whole.dk) << "D = " << D;
    EXPECT_TRUE(dv.download() == whole.dv) << "D = " << D;
  }
}

// The order of the dQ additions (kernels/cuda/dq_order.cuh) against tile_plan.hpp, on random row
// positions (gaps, as sharded and gathered rows have) and masks: a key block's CTA visits a
// query tile exactly when the tile is in query_tiles_for_keys and not classified empty, and the
// previous visitor of a tile is the last earlier key block that visits it (host code).
TEST(AttentionCuda, DqOrderMatchesTilePlan) {
  std::mt19937_64 gen(5);
  auto positions = [&](int64_t n) {
    std::vector<int64_t> pos;
    for (int64_t x = int64_t(gen() % 5); int64_t(pos.size()) < n; x += 1 + int64_t(gen() % 4 == 0 ? gen() % 9 : 0))
      pos.push_back(x);
    return pos;
  };
  const std::vector<int64_t> docs{0, 90, 91, 300, 333, 2000};
  for (int round = 0; round < 60; ++round) {
    const int64_t q_rows = 100 + int64_t(gen() % 200), k_rows = 100 + int64_t(gen() % 300);
    const std::vector<int64_t> qp = positions(q_rows), kp = positions(k_rows);
    const int64_t span = std::max(qp.back(), kp.back()) + 1;
    const int64_t block = 8 + int64_t(gen() % 60), nb = (span + block - 1) / block;
    const std::vector<uint8_t> blocks = random_block_mask(nb, gen(), 0.3 + 0.1 * (round % 6));
    MaskView m;
    m.causal = round % 2 == 0;
    if (round % 3 == 0) m.window_left = int64_t(gen() % 120), m.window_right = int64_t(gen() % 3) - 1;
    if (round % 5 < 2) m.doc_offsets = docs.data(), m.num_docs = int64_t(docs.size()) - 1;
    if (round % 4 != 0) m.block_mask = blocks.data(), m.block_count = nb, m.mask_block = block;
    const int rows = round % 2 ? 32 : 64, keys = round % 3 ? 64 : 128;
    const int64_t q_tiles = kernels::tile_count(q_rows, rows), k_blocks = kernels::tile_count(k_rows, keys);
    for (int64_t qt = 0; qt < q_tiles; ++qt) {
      const kernels::RowSpan q = kernels::row_span(qp.data(), q_rows, rows, qt);
      int last = -1;
      for (int kb = 0; kb < int(k_blocks); ++kb) {
        const kernels::RowSpan k = kernels::row_span(kp.data(), k_rows, keys, kb);
        const kernels::TileRange r = kernels::query_tiles_for_keys(m, k, qp.data(), q_rows, rows);
        const bool visits =
            qt >= r.first && qt < r.last && kernels::gpu::classify_tile_32(m, q, k) != TileKind::empty;
        ASSERT_EQ(kernels::gpu::tile_visits(m, qp.data(), q, k), visits) << round << " " << qt << " " << kb;
        if (!visits) continue;
        ASSERT_EQ(kernels::gpu::previous_visitor(m, qp.data(), q, kp.data(), k_rows, keys, kb), last)
            << round << " " << qt << " " << kb;
        last = kb;
      }
    }
  }
}

// The tensor-core kernels' 32-bit mask arithmetic (kernels/cuda/mask_32bit.cuh) decides exactly as
// tile_plan.hpp does, on random spans under block masks with every other condition (host code:
// no GPU needed).
TEST(AttentionCuda, Mask32BitMatchesTilePlan) {
  std::mt19937_64 gen(99);
  const std::vector<int64_t> docs{0, 70, 71, 200, 333, 400};
  for (int round = 0; round < 40; ++round) {
    const int64_t block = 1 + int64_t(gen() % 40), positions = 400, n = (positions + block - 1) / block;
    const std::vector<uint8_t> blocks = random_block_mask(n, gen(), 0.6);
    MaskView m;
    m.causal = round % 2 == 0;
    if (round % 3 == 0) m.window_left = int64_t(gen() % 100), m.window_right = int64_t(gen() % 3) - 1;
    if (round % 5 == 0) m.doc_offsets = docs.data(), m.num_docs = int64_t(docs.size()) - 1;
    m.block_mask = blocks.data(), m.block_count = n, m.mask_block = block;
    for (int t = 0; t < 200; ++t) {
      kernels::RowSpan q, k;
      q.pmin = int64_t(gen() % positions), q.pmax = q.pmin + int64_t(gen() % (positions - q.pmin));
      k.pmin = int64_t(gen() % positions), k.pmax = k.pmin + int64_t(gen() % (positions - k.pmin));
      q.count = k.count = 1;
      ASSERT_EQ(int(kernels::gpu::classify_tile_32(m, q, k)), int(kernels::classify_tile(m, q, k))) << round;
      const kernels::RowMask a = kernels::gpu::row_mask_32(m, q.pmin), b = kernels::row_mask(m, q.pmin);
      ASSERT_EQ(a.block_row, b.block_row);
      ASSERT_EQ(kernels::gpu::row_sees_32(m, a, k.pmin), kernels::row_sees(m, b, k.pmin)) << round;
    }
  }
}

TEST(AttentionCuda, KernelChoice) {
  kernels::AttentionDims dims{1, 2, 2, 128, 0.1f};
  alignas(16) static uint8_t buf[64];
  kernels::CudaOptions opt;
  EXPECT_TRUE(kernels::cuda_tensor_cores_apply(dims, DType::bf16, buf, buf, buf));
  EXPECT_FALSE(kernels::cuda_tensor_cores_apply(dims, DType::f32, buf, buf, buf));
  EXPECT_FALSE(kernels::cuda_tensor_cores_apply(dims, DType::f16, buf + 2, buf, buf));
  dims.head_dim = 96;
  EXPECT_TRUE(kernels::cuda_tensor_cores_apply(dims, DType::bf16, buf, buf, buf));
  dims.head_dim = 80;
  EXPECT_FALSE(kernels::cuda_tensor_cores_apply(dims, DType::bf16, buf, buf, buf));
  EXPECT_EQ(std::string(kernels::cuda_kernel_name(dims, DType::bf16, buf, buf, buf, opt)), "simple");
  EXPECT_TRUE(kernels::cuda_supports_head_dim(256));
  EXPECT_FALSE(kernels::cuda_supports_head_dim(512));
}

}  // namespace
}  // namespace ringattn::testing
