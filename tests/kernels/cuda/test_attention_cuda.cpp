// The CUDA kernels: the shared table of cases and contracts (tests/kernels/attention_cases.hpp) run
// on them as AttentionCuda.*, every kernel that applies (tensor cores for bf16/fp16 where
// cuda_tensor_cores_apply says so, the simple kernels always) with every element type, each judged
// with its own rounding (P and dS rounded to the input type on the tensor cores); and what
// concerns the CUDA kernels only: their shapes on sm_80 (on the emulation), the determinism of the
// backward and the order of its dQ additions, the 32-bit mask arithmetic and the kernel choice.
// On a GPU, or on the emulation (-DRINGATTN_CUDA_EMULATION=ON, or the emulated.* tests of every
// build); the device tests skip when no CUDA device is visible.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/dq_order.cuh"
#include "kernels/cuda/mask_32bit.cuh"
#include "tests/kernels/attention_cases.hpp"
#include "tests/support/gtest_or_mini.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {
namespace {

using kernels::AttentionState;
using kernels::CudaKernel;

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

// The CUDA kernels as the shared tests see them: every (element type, kernel) pair that applies.
class CudaKernels final : public KernelBackend {
 public:
  std::string unavailable() const override { return device_present() ? "" : "no CUDA device visible"; }
  std::vector<KernelVariant> variants(const kernels::AttentionDims& dims, DType dtype) const override {
    if (!kernels::cuda_supports_head_dim(dims.head_dim)) return {};
    alignas(16) static const uint8_t aligned[16] = {};
    std::vector<KernelVariant> v;
    if (kernels::cuda_tensor_cores_apply(dims, dtype, aligned, aligned, aligned)) {  // P and dS in the input type
      using kernels::SamePrecision;
      v.push_back({dtype, "tensor_core",
                   dtype == DType::bf16 ? SamePrecision::bf16_products() : SamePrecision::fp16_products()});
    }
    v.push_back({dtype, "simple", kernels::SamePrecision::fp32()});
    return v;
  }
  void forward(const Problem& p, const KernelVariant& v, int64_t first, int64_t last, std::vector<float>& o,
               std::vector<float>& lse) const override {
    const DeviceProblem dp(p, v.dtype);
    DeviceArray<float> o_d(o), lse_d(lse);
    kernels::cuda_attention_forward(p.dims, dp.queries(p), dp.keys(p, first, last), dp.mask.view,
                                    AttentionState{o_d.get(), lse_d.get()}, options(v));
    cuda_ok(cudaDeviceSynchronize(), "forward");
    o = o_d.download(), lse = lse_d.download();
  }
  void merge(const Problem& p, std::vector<float>& o, std::vector<float>& lse, const std::vector<float>& src_o,
             const std::vector<float>& src_lse) const override {
    DeviceArray<float> o_d(o), lse_d(lse), src_o_d(src_o), src_lse_d(src_lse);
    kernels::cuda_merge_states(p.dims, p.rows_q(), AttentionState{o_d.get(), lse_d.get()}, src_o_d.get(),
                               src_lse_d.get(), nullptr);
    cuda_ok(cudaDeviceSynchronize(), "merge");
    o = o_d.download(), lse = lse_d.download();
  }
  void backward(const Problem& p, const KernelVariant& v, int64_t first, int64_t last, const std::vector<float>& o,
                const std::vector<float>& lse, std::vector<float>& dq, std::vector<float>& dk,
                std::vector<float>& dv) const override {
    const DeviceProblem dp(p, v.dtype);
    DeviceArray<float> o_d(o), lse_d(lse), delta(p.lse_elems()), dq_d(dq), dk_d(dk), dv_d(dv);
    kernels::cuda_attention_delta(p.dims, p.rows_q(), o_d.get(), dp.dout.get(), v.dtype, delta.get(), nullptr);
    const int64_t row = p.dims.kv_heads * p.dims.head_dim;
    kernels::cuda_attention_backward(p.dims, dp.queries(p), dp.keys(p, first, last), dp.dout.get(), lse_d.get(),
                                     delta.get(), dq_d.get(), dk_d.get() + first * row, dv_d.get() + first * row,
                                     dp.mask.view, options(v));
    cuda_ok(cudaDeviceSynchronize(), "backward");
    dq = dq_d.download(), dk = dk_d.download(), dv = dv_d.download();
  }
  ChunkTolerance chunk_tolerance(const KernelVariant& v) const override {
    // The tensor-core kernels round P relative to the running maximum, which depends on where the
    // key blocks start: chunked and whole passes then differ at the element type's rounding level.
    const double forward = v.kernel == "simple" ? 1e-5 : v.dtype == DType::bf16 ? 2e-2 : 4e-3;
    return {forward, 1e-4, 1e-5};
  }

 private:
  static kernels::CudaOptions options(const KernelVariant& v) {
    kernels::CudaOptions opt;
    opt.kernel = v.kernel == "simple" ? CudaKernel::simple : CudaKernel::tensor_core;
    return opt;
  }
};

const std::shared_ptr<const CudaKernels> cuda = std::make_shared<CudaKernels>();
[[maybe_unused]] const bool registered = (register_attention_tests("AttentionCuda", cuda), true);

#if defined(RINGATTN_CUDA_EMULATION)
// The shapes the kernels take on sm_80 where they differ from sm_90's (forward: key blocks of 32
// at D = 96, of 16 at D = 256; backward: query tiles of 32 at D = 256), on the emulation set to 8.0.
TEST(AttentionCuda, Sm80ShapesOnTheEmulation) {
  cuda_emulation::set_compute_capability(8, 0);
  struct Restore {
    ~Restore() { cuda_emulation::set_compute_capability(9, 0); }
  } restore;
  for (const Problem& p : head_dims_96_and_256(13)) check_problem(*cuda, p);
}
#endif

// A state that already holds a result over other keys is continued, not overwritten: O and LSE
// of rows the new keys hide stay bit for bit. (The CPU kernels' vector paths move such an LSE by
// an ulp where the row shares a query tile with rows that see keys.)
TEST(AttentionCuda, StateOfRowsThatSeeNoNewKeyIsUntouched) {
  SKIP_WITHOUT_GPU();
  Problem p(1, 2, 2, 64, iota_positions(100), iota_positions(60, 40));
  p.mask.causal = true;  // queries 0..39 see none of the keys 40..99
  for (DType t : all_dtypes())
    for (const KernelVariant& var : cuda->variants(p.dims, t)) {
      const std::vector<float> o_in = random_vector(p.q_elems(), 9), lse_in = random_vector(p.lse_elems(), 10);
      std::vector<float> o_out = o_in, lse_out = lse_in;
      cuda->forward(p, var, 0, p.rows_k(), o_out, lse_out);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 40; ++i) {
          EXPECT_EQ(lse_out[size_t(h * 100 + i)], lse_in[size_t(h * 100 + i)]);
          for (int64_t d = 0; d < 64; ++d) {
            const size_t e = size_t((i * 2 + h) * 64 + d);
            ASSERT_EQ(o_out[e], o_in[e]) << var.tag();
          }
        }
    }
}

// The 16-bit variants (bf16 and fp16, tensor cores and simple kernels).
std::vector<KernelVariant> half_variants(const kernels::AttentionDims& dims) {
  std::vector<KernelVariant> v = cuda->variants(dims, DType::bf16), f16 = cuda->variants(dims, DType::f16);
  v.insert(v.end(), f16.begin(), f16.end());
  return v;
}

// Two runs give the same bits (on a GPU, CTAs run in a different order each time; the
// tensor-core backward adds to dQ in a fixed order of key blocks all the same).
TEST(AttentionCuda, BackwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  Problem p = basic(300, 128, 4, 2, 2);
  p.mask.causal = true;
  for (const KernelVariant& var : half_variants(p.dims)) {
    const Problem r = rounded(p, var.dtype);
    const Outputs a = run_kernels(*cuda, r, var), b = run_kernels(*cuda, r, var);
    EXPECT_TRUE(a.o == b.o) << var.tag();
    EXPECT_TRUE(a.dq == b.dq) << var.tag();
    EXPECT_TRUE(a.dk == b.dk) << var.tag();
    EXPECT_TRUE(a.dv == b.dv) << var.tag();
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
    p = rounded(p, t);
    const KernelVariant tc = cuda->variants(p.dims, t).front();
    ASSERT_EQ(tc.kernel, std::string("tensor_core")) << "D = " << D;
    const Outputs whole = run_kernels(*cuda, p, tc);
    std::vector<float> dq(p.q_elems(), 0.0f), dk(p.k_elems(), 0.0f), dv(p.k_elems(), 0.0f);
    for (int64_t s = 0; s < p.rows_k(); s += 128)
      cuda->backward(p, tc, s, std::min<int64_t>(s + 128, p.rows_k()), whole.o, whole.lse, dq, dk, dv);
    EXPECT_TRUE(dq == whole.dq) << "D = " << D;
    EXPECT_TRUE(dk == whole.dk) << "D = " << D;
    EXPECT_TRUE(dv == whole.dv) << "D = " << D;
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
