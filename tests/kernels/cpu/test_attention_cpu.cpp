// The CPU kernels: the shared table of cases and contracts (tests/kernels/attention_cases.hpp) run
// on them as AttentionCpu.*, with the instruction set the dispatcher picks (ctest's kernels_isa_*
// entries force each narrower one), and what concerns the CPU kernels only: the instruction set
// they report, the wide backward key blocks, the rules for NaN and -inf inputs, and results that
// do not depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/attention_cpu.hpp"
#include "tests/kernels/attention_cases.hpp"
#include "tests/support/attention_oracle.hpp"

namespace ringattn::testing {
namespace {

// The CPU kernels as the shared tests see them: f32 and bf16 inputs, the selected instruction set,
// judged with its own rounding (bf16 products where it takes the bf16 dot product).
class CpuKernels final : public KernelBackend {
 public:
  std::vector<KernelVariant> variants(const kernels::AttentionDims& dims, DType dtype) const override {
    if (dtype == DType::f16 || !kernels::cpu_supports_head_dim(dims.head_dim)) return {};
    return {{dtype, kernels::cpu_isa(), kernels::cpu_same_precision(dtype)}};
  }
  void forward(const Problem& p, const KernelVariant& v, int64_t first, int64_t last, std::vector<float>& o,
               std::vector<float>& lse) const override {
    const Inputs in(p, v.dtype, first, last);
    kernels::attention_forward(p.dims, in.queries(), in.keys(), p.mask.view(),
                               kernels::AttentionState{o.data(), lse.data()}, options());
  }
  void merge(const Problem& p, std::vector<float>& o, std::vector<float>& lse, const std::vector<float>& src_o,
             const std::vector<float>& src_lse) const override {
    kernels::merge_states(p.dims, p.rows_q(), kernels::AttentionState{o.data(), lse.data()}, src_o.data(),
                          src_lse.data());
  }
  void backward(const Problem& p, const KernelVariant& v, int64_t first, int64_t last, const std::vector<float>& o,
                const std::vector<float>& lse, std::vector<float>& dq, std::vector<float>& dk,
                std::vector<float>& dv) const override {
    const Inputs in(p, v.dtype, first, last);
    std::vector<float> delta(p.lse_elems());
    kernels::attention_delta(p.dims, p.rows_q(), o.data(), in.dout.data(), v.dtype, delta.data());
    const int64_t row = p.dims.kv_heads * p.dims.head_dim;
    kernels::attention_backward(p.dims, in.queries(), in.keys(), in.dout.data(), lse.data(), delta.data(), dq.data(),
                                dk.data() + first * row, dv.data() + first * row, p.mask.view(), options());
  }
  ChunkTolerance chunk_tolerance(const KernelVariant& v) const override {
    if (v.precision == kernels::SamePrecision::fp32()) return {2e-6, 1e-5, 1e-6};
    return {2e-2, 1e-4, 1e-5};  // P rounded to bf16 relative to a maximum that depends on the chunks
  }

 private:
  // The problem's Q, dO and keys [first, last) in the variant's element type.
  struct Inputs {
    const Problem& p;
    DType dtype;
    int64_t first, last;
    std::vector<uint8_t> q, k, v, dout;
    Inputs(const Problem& problem, DType t, int64_t f, int64_t l)
        : p(problem), dtype(t), first(f), last(l), q(encode(p.q, t)), k(encode(p.k, t)), v(encode(p.v, t)),
          dout(encode(p.dout, t)) {}
    kernels::QueryRows queries() const { return {q.data(), dtype, p.rows_q(), p.q_pos.data()}; }
    kernels::KeyValueRows keys() const {
      const size_t row = size_t(p.dims.kv_heads * p.dims.head_dim * dtype_bytes(dtype));
      return {k.data() + first * row, v.data() + first * row, dtype, last - first, p.k_pos.data() + first};
    }
  };
  static kernels::CpuOptions options() {
    kernels::CpuOptions opt;
    opt.threads = 2;
    return opt;
  }
};

const std::shared_ptr<const CpuKernels> cpu = std::make_shared<CpuKernels>();
[[maybe_unused]] const bool registered = (register_attention_tests("AttentionCpu", cpu), true);

TEST(AttentionCpu, ReportsItsInstructionSet) {
  const std::string isa = kernels::cpu_isa();
  EXPECT_TRUE(isa == "amx" || isa == "avx512bf16" || isa == "avx512" || isa == "avx2" || isa == "scalar") << isa;
  // On AMX only bf16 inputs take the tiles, and are judged with P and dS rounded to bf16.
  EXPECT_EQ(std::string(kernels::cpu_path(DType::f32)), isa == "amx" ? "avx512" : isa);
  EXPECT_EQ(std::string(kernels::cpu_path(DType::bf16)), isa);
  if (isa == "amx") EXPECT_TRUE(kernels::cpu_same_precision(DType::bf16) == kernels::SamePrecision::bf16_products());
  EXPECT_TRUE(kernels::cpu_same_precision(DType::f32) == kernels::SamePrecision::fp32());
  if (const char* forced = std::getenv("RINGATTN_ISA"); forced && *forced) {
    EXPECT_EQ(isa, forced);
    return;
  }
#if defined(__x86_64__)
  // bf16 inputs take the dot product only where it outruns the FMA (AMD), elsewhere the fp32 path;
  // amx only when asked for (RINGATTN_ISA=amx, kernels_isa_amx: dispatch.cpp says why).
  if (!__builtin_cpu_supports("avx512bf16")) return;
  EXPECT_EQ(isa, __builtin_cpu_is("amd") ? "avx512bf16" : "avx512");
#endif
}

// Enough backward work items (batch x kv heads x key blocks >= 64) for the ISA's wider backward key
// block (128 keys on AVX-512), with a partial last block, GQA and a causal window: checked against
// fp64 (fp32 and bf16 storage), and its dK/dV still independent of the thread count.
TEST(AttentionCpu, WideBackwardKeyBlocks) {
  Problem p = basic(1030, 16, 8, 4, 2);
  p.mask.causal = true;
  p.mask.window_left = 300;
  check_problem(*cpu, p, {DType::f32});
  const Outputs one = run_cpu_kernels(p, DType::f32, 1);
  const Outputs three = run_cpu_kernels(p, DType::f32, 3);
  EXPECT_EQ(one.dk, three.dk);
  EXPECT_EQ(one.dv, three.dv);
  // bf16 storage too (the bf16 dot-product backward pairs K^T rows by the block's width)
  check_problem(*cpu, p, {DType::bf16});
}

// A NaN key makes every row that sees it NaN, as in PyTorch: never a row that reads as empty
// (LSE = -inf, which a merge of partial states would drop without a word), never a row that
// silently leaves the key out. The NaN sits at each place of a group of key rows (the forward
// exponentiates groups of rows against a lazily moved maximum); causal rows before it stay finite.
// fp32 and bf16 inputs (the bf16 products: the dot product, or the AMX tiles).
TEST(AttentionCpu, ANanKeyMakesTheRowsThatSeeItNaN) {
  for (DType dtype : {DType::f32, DType::bf16})
  for (bool causal : {false, true})
    for (int64_t bad = 0; bad < 8; ++bad) {
      Problem p = basic(150, 64, 2, 1);
      p.mask.causal = causal;
      p.k[size_t(bad * p.dims.head_dim)] = std::numeric_limits<float>::quiet_NaN();
      const Outputs got = run_cpu_kernels(p, dtype);
      const int64_t L = p.rows_q(), H = p.dims.heads;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i) {
          const float lse = got.lse[size_t(h * L + i)];
          if (causal && i < bad)
            EXPECT_TRUE(std::isfinite(lse)) << "row " << i << " does not see key " << bad;
          else
            EXPECT_TRUE(std::isnan(lse)) << dtype_name(dtype) << ", causal " << causal << ", NaN key " << bad
                                         << ", row " << i << ": " << lse;
        }
    }
}

// Keys whose scores are -inf (an infinite entry in K) get weight 0, as in PyTorch, also when a
// whole group of key rows is -inf before any finite key (the forward's lazily moved maximum then
// starts from the finite stand-in for "no key yet", not from -inf: -inf - -inf would be NaN).
// bf16 inputs too, against the reference on the same bf16-rounded values.
TEST(AttentionCpu, KeysWithMinusInfinityScoresGetNoWeight) {
  for (DType dtype : {DType::f32, DType::bf16})
  for (bool causal : {false, true}) {
    Problem p = basic(150, 64, 2, 1);
    p.mask.causal = causal;
    const int64_t D = p.dims.head_dim, H = p.dims.heads;
    for (int64_t i = 0; i < p.rows_q(); ++i)
      for (int64_t h = 0; h < H; ++h) p.q[size_t((i * H + h) * D)] = 1.0f;
    for (int64_t j = 0; j < 8; ++j) p.k[size_t(j * D)] = -std::numeric_limits<float>::infinity();
    if (dtype == DType::bf16)
      for (std::vector<float>* x : {&p.q, &p.k, &p.v})
        for (float& e : *x) e = bf16_to_float(float_to_bf16(e));
    const Outputs got = run_cpu_kernels(p, dtype);
    const RefOutputs ref = run_reference(p);
    // (bf16 kernels round P to bf16: 2^-9 of |V| per weight)
    const double tolerance = dtype == DType::f32 ? 1e-5 : 1e-2;
    for (size_t i = 0; i < got.lse.size(); ++i)
      ASSERT_EQ(std::isinf(got.lse[i]), std::isinf(ref.lse[i])) << dtype_name(dtype) << ", causal " << causal << ", lse " << i;
    for (size_t i = 0; i < got.o.size(); ++i)
      ASSERT_NEAR(got.o[i], ref.o[i], tolerance) << dtype_name(dtype) << ", causal " << causal << ", o " << i;
  }
}

TEST(AttentionCpu, ThreadCountsAgree) {
  Problem p = basic(300, 64, 2, 2, 2);
  p.mask.causal = true;
  for (DType dtype : {DType::f32, DType::bf16}) {
  SCOPED_TRACE(dtype_name(dtype));
  const Outputs one = run_cpu_kernels(p, dtype, 1);
  const Outputs three = run_cpu_kernels(p, dtype, 3);
  EXPECT_EQ(one.o, three.o);  // forward items are independent: bitwise equal for any thread count
  EXPECT_EQ(one.lse, three.lse);
  EXPECT_EQ(one.dk, three.dk);  // each key block's dK/dV is owned by one item
  EXPECT_EQ(one.dv, three.dv);
  EXPECT_LE(max_abs_diff(one.dq, three.dq), 1e-5);
  const Outputs again = run_cpu_kernels(p, dtype, 3);
  EXPECT_EQ(three.dq, again.dq);  // deterministic run to run
  }
}

// Called from a caller's own parallel region (nested parallelism off), a call asking for 3 threads
// gets 1: the dQ reduction must then skip the threads that never ran, and results equal one thread's.
TEST(AttentionCpu, FewerThreadsThanAskedGiveTheSameResult) {
  Problem p = basic(300, 64, 2, 2, 2);
  p.mask.causal = true;
  const Outputs one = run_cpu_kernels(p, DType::f32, 1);
  std::vector<Outputs> nested(2);
  omp_set_max_active_levels(1);
#pragma omp parallel num_threads(2)
  nested[static_cast<size_t>(omp_get_thread_num())] = run_cpu_kernels(p, DType::f32, 3);
  for (const Outputs& n : nested) {
    EXPECT_EQ(n.o, one.o);
    EXPECT_EQ(n.dq, one.dq);
    EXPECT_EQ(n.dk, one.dk);
    EXPECT_EQ(n.dv, one.dv);
  }
}

}  // namespace
}  // namespace ringattn::testing
