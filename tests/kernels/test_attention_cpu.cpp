// CPU attention kernels against the fp64 reference: every mask kind and combination, GQA/MQA,
// batch, odd lengths, every head dim, empty rows, huge scores, bf16 storage, and the exact merge
// of partial states. Tolerances in the FlashAttention manner: the kernel's error against fp64
// may be at most a few times the error of a plain fp32 computation of the same thing.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/support/attention_oracle.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/reference.hpp"

namespace ringattn::testing {
namespace {

using kernels::AttentionState;
using kernels::CpuOptions;
using kernels::KeyValueRows;
using kernels::QueryRows;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Plain fp32 computation: the same-precision baseline for tolerances. With `bf16_products` the
// backward rounds P and dS to bf16 before their products (the bf16 kernels' contract).
Outputs run_naive_fp32(const Problem& p, bool bf16_products = false) {
  Outputs r;
  r.o.assign(p.q_elems(), 0.0f);
  r.lse.assign(p.lse_elems(), 0.0f);
  const MaskView mask = p.mask.view();
  kernels::naive_forward_fp32(p.dims, p.q.data(), p.q_pos.data(), p.rows_q(), p.k.data(), p.v.data(),
                              p.k_pos.data(), p.rows_k(), mask, r.o.data(), r.lse.data());
  std::vector<float> delta(p.lse_elems());
  kernels::attention_delta(p.dims, p.rows_q(), r.o.data(), p.dout.data(), DType::f32, delta.data());
  r.dq.assign(p.q_elems(), 0.0f);
  r.dk.assign(p.k_elems(), 0.0f);
  r.dv.assign(p.k_elems(), 0.0f);
  kernels::naive_backward_fp32(p.dims, p.q.data(), p.q_pos.data(), p.rows_q(), p.k.data(), p.v.data(),
                               p.k_pos.data(), p.rows_k(), p.dout.data(), r.lse.data(), delta.data(), mask,
                               r.dq.data(), r.dk.data(), r.dv.data(),
                               bf16_products ? kernels::SamePrecision::bf16_products() : kernels::SamePrecision::fp32());
  return r;
}

// err(kernel) <= factor * err(fp32 naive) + atol, per tensor, as FlashAttention's tests do.
void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& naive,
                  const std::vector<double>& ref, double factor = 4.0, double atol = 2e-6) {
  ASSERT_TRUE(all_finite(got) || std::string(what) == "lse") << what << " has NaN/Inf";
  const double err = max_abs_diff(got, ref);
  const double base = max_abs_diff(naive, ref);
  EXPECT_LE(err, factor * base + atol) << what << ": kernel error " << err << " vs fp32 naive error " << base;
}

// Near-one-hot softmax (|scores| ~ 1e4) amplifies the rounding of each score (1e4 * 2^-24 ~ 1e-3
// in the exponent) into the gradients, differently for every summation order: allow more there.
constexpr double kHugeScoreFactor = 16.0;

// Whether bf16 inputs take the bf16 dot-product path, whose backward rounds P and dS to bf16.
bool bf16_products(DType dtype) { return dtype == DType::bf16 && std::string(kernels::cpu_isa()) == "avx512bf16"; }

void check_problem(const Problem& p, DType dtype = DType::f32, int threads = 2, double factor = 4.0) {
  const Outputs got = run_cpu_kernels(p, dtype, threads);
  const Outputs naive = run_naive_fp32(p, bf16_products(dtype));
  const RefOutputs ref = run_reference(p);
  for (float x : got.lse) ASSERT_FALSE(std::isnan(x));
  for (size_t i = 0; i < got.lse.size(); ++i)
    ASSERT_EQ(std::isinf(got.lse[i]), std::isinf(ref.lse[i])) << "empty-row status differs at lse index " << i;
  expect_close("o", got.o, naive.o, ref.o, factor);
  expect_close("lse", got.lse, naive.lse, ref.lse, factor);
  expect_close("dq", got.dq, naive.dq, ref.dq, factor);
  expect_close("dk", got.dk, naive.dk, ref.dk, factor);
  expect_close("dv", got.dv, naive.dv, ref.dv, factor);
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

TEST(AttentionCpu, NoMaskOddLength) { check_problem(basic()); }

TEST(AttentionCpu, ReportsItsInstructionSet) {
  const std::string isa = kernels::cpu_isa();
  EXPECT_TRUE(isa == "avx512bf16" || isa == "avx512" || isa == "avx2" || isa == "scalar") << isa;
  if (const char* forced = std::getenv("RINGATTN_ISA"); forced && *forced) {
    EXPECT_EQ(isa, forced);
    return;
  }
#if defined(__x86_64__)
  // bf16 inputs take the dot product only where it outruns the FMA (AMD); elsewhere the fp32 path.
  if (__builtin_cpu_supports("avx512bf16")) EXPECT_EQ(isa, __builtin_cpu_is("amd") ? "avx512bf16" : "avx512");
#endif
}

TEST(AttentionCpu, Causal) {
  Problem p = basic();
  p.mask.causal = true;
  check_problem(p);
}

TEST(AttentionCpu, SlidingWindowBothSides) {
  Problem p = basic();
  p.mask.window_left = 17;
  p.mask.window_right = 5;
  check_problem(p);
}

TEST(AttentionCpu, CausalSlidingWindow) {
  Problem p = basic(260);
  p.mask.causal = true;
  p.mask.window_left = 70;
  check_problem(p);
}

TEST(AttentionCpu, Documents) {
  Problem p = basic();
  p.mask.set_documents({50, 1, 80, 69});
  check_problem(p);
}

TEST(AttentionCpu, DocumentsCausal) {
  Problem p = basic();
  p.mask.causal = true;
  p.mask.set_documents({64, 3, 0, 70, 63});
  check_problem(p);
}

TEST(AttentionCpu, BlockMask) {
  Problem p = basic();
  const int64_t n = (200 + 15) / 16;
  p.mask.set_block_mask(random_block_mask(n, 7, 0.4), n, 16);
  check_problem(p);
}

TEST(AttentionCpu, BigBird) {
  Problem p = basic(300);
  const int64_t n = (300 + 31) / 32;
  p.mask.set_block_mask(bigbird_block_mask(n, 1, 1, 2, 42), n, 32);
  check_problem(p);
}

TEST(AttentionCpu, EveryMaskAtOnce) {
  Problem p = basic(280);
  p.mask.causal = true;
  p.mask.window_left = 90;
  p.mask.window_right = 0;
  p.mask.set_documents({100, 130, 50});
  const int64_t n = (280 + 19) / 20;
  p.mask.set_block_mask(random_block_mask(n, 3, 0.6), n, 20);
  check_problem(p);
}

TEST(AttentionCpu, EmptyRowsFromBlockMask) {
  Problem p = basic(130);
  const int64_t n = (130 + 15) / 16;
  auto m = random_block_mask(n, 11, 0.5);
  for (int64_t c = 0; c < n; ++c) m[size_t(2 * n + c)] = 0;  // block row 2 sees nothing
  p.mask.set_block_mask(m, n, 16);
  const Outputs got = run_cpu_kernels(p);
  for (int64_t i = 32; i < 48; ++i) {
    EXPECT_EQ(got.lse[size_t(i)], kNegInf);
    for (int64_t d = 0; d < 64; ++d) EXPECT_EQ(got.o[size_t((i * 2) * 64 + d)], 0.0f);
    for (int64_t d = 0; d < 64; ++d) EXPECT_EQ(got.dq[size_t((i * 2) * 64 + d)], 0.0f);
  }
  check_problem(p);
}

TEST(AttentionCpu, GroupedQueryAttention) {
  Problem p = basic(150, 64, 4, 2);
  p.mask.causal = true;
  check_problem(p);
}

TEST(AttentionCpu, MultiQueryAttention) {
  Problem p = basic(150, 32, 4, 1);
  p.mask.window_left = 20;
  p.mask.window_right = 20;
  check_problem(p);
}

TEST(AttentionCpu, Batch) {
  Problem p = basic(99, 64, 2, 1, 3);
  p.mask.causal = true;
  check_problem(p);
}

TEST(AttentionCpu, LengthOne) { check_problem(basic(1)); }

// Enough backward work items (batch x kv heads x key blocks >= 64) for the ISA's wider backward key
// block (128 keys on AVX-512), with a partial last block, GQA and a causal window: checked against
// fp64 (fp32 and bf16 storage), and its dK/dV still independent of the thread count.
TEST(AttentionCpu, WideBackwardKeyBlocks) {
  Problem p = basic(1030, 16, 8, 4, 2);
  p.mask.causal = true;
  p.mask.window_left = 300;
  check_problem(p);
  const Outputs one = run_cpu_kernels(p, DType::f32, 1);
  const Outputs three = run_cpu_kernels(p, DType::f32, 3);
  EXPECT_EQ(one.dk, three.dk);
  EXPECT_EQ(one.dv, three.dv);
  // bf16 storage too (the bf16 dot-product backward pairs K^T rows by the block's width)
  p.q = round_to_bf16(p.q), p.k = round_to_bf16(p.k), p.v = round_to_bf16(p.v), p.dout = round_to_bf16(p.dout);
  check_problem(p, DType::bf16);
}

class HeadDims : public ::testing::TestWithParam<int> {};
TEST_P(HeadDims, CausalGqa) {
  Problem p = basic(131, GetParam(), 2, 1);
  p.mask.causal = true;
  check_problem(p);
}
INSTANTIATE_TEST_SUITE_P(AttentionCpu, HeadDims, ::testing::Values(16, 32, 64, 80, 96, 128, 256, 512));

TEST(AttentionCpu, StripedQueriesAgainstAllKeys) {
  Problem p(1, 2, 2, 64, iota_positions(70, 2, 3), iota_positions(212));
  p.mask.causal = true;
  check_problem(p);
}

TEST(AttentionCpu, ZigzagShardAgainstMiddleKeysHasEmptyRows) {
  std::vector<int64_t> qp = iota_positions(50);
  for (int64_t i = 150; i < 200; ++i) qp.push_back(i);
  Problem p(1, 2, 2, 64, qp, iota_positions(100, 50));
  p.mask.causal = true;
  const Outputs got = run_cpu_kernels(p);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(got.lse[size_t(i)], kNegInf);  // queries before every key
  check_problem(p);
}

TEST(AttentionCpu, HugeScoresStayFinite) {
  Problem p(1, 2, 2, 64, iota_positions(160), iota_positions(160), 5, 100.0f);  // |scores| ~ 1e4
  p.mask.causal = true;
  const Outputs got = run_cpu_kernels(p);
  EXPECT_TRUE(all_finite(got.o));
  EXPECT_TRUE(all_finite(got.dq));
  EXPECT_TRUE(all_finite(got.dk));
  EXPECT_TRUE(all_finite(got.dv));
  check_problem(p, DType::f32, 2, kHugeScoreFactor);
}

// Scores that climb steeply along the keys move the forward's lazily kept running max (see
// OnlineSoftmax in attention_tiles.inl) in almost every group of key rows, so the p rows a block
// already holds are rescaled; then they fall (no moves, p underflows to 0), then jump by ~700 in
// log2 units (a move that must come before any exponential, or p would overflow).
TEST(AttentionCpu, RunningMaxMovesWithinAndAcrossBlocks) {
  for (bool causal : {false, true}) {
    Problem p = basic(300, 64, 2, 1);
    p.mask.causal = causal;
    const int64_t D = p.dims.head_dim, H = p.dims.heads;
    auto key_height = [](int64_t j) -> float {
      if (j < 120) return 4.0f * float(j);
      if (j < 205) return 480.0f - 3.0f * float(j - 120);
      if (j < 230) return 2480.0f + float(j % 7);
      return 0.0f;
    };
    for (int64_t i = 0; i < p.rows_q(); ++i)
      for (int64_t h = 0; h < H; ++h) p.q[size_t((i * H + h) * D)] = 2.0f;
    for (int64_t j = 0; j < p.rows_k(); ++j) p.k[size_t(j * D)] += key_height(j);
    check_problem(p, DType::f32, 2, kHugeScoreFactor);
  }
}

// A NaN key makes every row that sees it NaN, as in PyTorch: never a row that reads as empty
// (LSE = -inf, which a merge of partial states would drop without a word), never a row that
// silently leaves the key out. The NaN sits at each place of a group of key rows (the forward
// exponentiates groups of rows against a lazily moved maximum); causal rows before it stay finite.
TEST(AttentionCpu, ANanKeyMakesTheRowsThatSeeItNaN) {
  for (bool causal : {false, true})
    for (int64_t bad = 0; bad < 8; ++bad) {
      Problem p = basic(150, 64, 2, 1);
      p.mask.causal = causal;
      p.k[size_t(bad * p.dims.head_dim)] = std::numeric_limits<float>::quiet_NaN();
      const Outputs got = run_cpu_kernels(p);
      const int64_t L = p.rows_q(), H = p.dims.heads;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i) {
          const float lse = got.lse[size_t(h * L + i)];
          if (causal && i < bad)
            EXPECT_TRUE(std::isfinite(lse)) << "row " << i << " does not see key " << bad;
          else
            EXPECT_TRUE(std::isnan(lse)) << "causal " << causal << ", NaN key " << bad << ", row " << i << ": " << lse;
        }
    }
}

// Keys whose scores are -inf (an infinite entry in K) get weight 0, as in PyTorch, also when a
// whole group of key rows is -inf before any finite key (the forward's lazily moved maximum then
// starts from the finite stand-in for "no key yet", not from -inf: -inf - -inf would be NaN).
TEST(AttentionCpu, KeysWithMinusInfinityScoresGetNoWeight) {
  for (bool causal : {false, true}) {
    Problem p = basic(150, 64, 2, 1);
    p.mask.causal = causal;
    const int64_t D = p.dims.head_dim, H = p.dims.heads;
    for (int64_t i = 0; i < p.rows_q(); ++i)
      for (int64_t h = 0; h < H; ++h) p.q[size_t((i * H + h) * D)] = 1.0f;
    for (int64_t j = 0; j < 8; ++j) p.k[size_t(j * D)] = -std::numeric_limits<float>::infinity();
    const Outputs got = run_cpu_kernels(p);
    const RefOutputs ref = run_reference(p);
    for (size_t i = 0; i < got.lse.size(); ++i)
      ASSERT_EQ(std::isinf(got.lse[i]), std::isinf(ref.lse[i])) << "causal " << causal << ", lse " << i;
    for (size_t i = 0; i < got.o.size(); ++i)
      ASSERT_NEAR(got.o[i], ref.o[i], 1e-5) << "causal " << causal << ", o " << i;
  }
}

TEST(AttentionCpu, Bf16StorageFp32Accumulation) {
  Problem p = basic(170, 64, 4, 2);
  p.mask.causal = true;
  p.q = round_to_bf16(p.q), p.k = round_to_bf16(p.k), p.v = round_to_bf16(p.v), p.dout = round_to_bf16(p.dout);
  check_problem(p, DType::bf16);
}

// bf16 storage through every path: on CPUs with AVX512-BF16 the scores take the bf16 dot product.
TEST(AttentionCpu, Bf16EveryMaskAndHeadDim) {
  auto bf16_problem = [](Problem p) {
    p.q = round_to_bf16(p.q), p.k = round_to_bf16(p.k), p.v = round_to_bf16(p.v), p.dout = round_to_bf16(p.dout);
    return p;
  };
  for (int64_t D : {16, 32, 128, 256}) {
    Problem p = basic(97, D, 2, 1);
    p.mask.causal = true;
    check_problem(bf16_problem(p), DType::bf16);
  }
  Problem w = basic(200);
  w.mask.window_left = 17;
  w.mask.window_right = 5;
  w.mask.set_documents({50, 1, 80, 69});
  check_problem(bf16_problem(w), DType::bf16);
  Problem bm = basic(300);
  const int64_t n = (300 + 31) / 32;
  bm.mask.set_block_mask(bigbird_block_mask(n, 1, 1, 2, 42), n, 32);
  check_problem(bf16_problem(bm), DType::bf16);
  Problem striped(2, 2, 2, 64, iota_positions(70, 2, 3), iota_positions(212));
  striped.mask.causal = true;
  check_problem(bf16_problem(striped), DType::bf16);
  Problem huge(1, 2, 2, 64, iota_positions(160), iota_positions(160), 5, 100.0f);
  huge.mask.causal = true;
  check_problem(bf16_problem(huge), DType::bf16, 2, kHugeScoreFactor);
}

TEST(AttentionCpu, ThreadCountsAgree) {
  Problem p = basic(300, 64, 2, 2, 2);
  p.mask.causal = true;
  const Outputs one = run_cpu_kernels(p, DType::f32, 1);
  const Outputs three = run_cpu_kernels(p, DType::f32, 3);
  EXPECT_EQ(one.o, three.o);  // forward items are independent: bitwise equal for any thread count
  EXPECT_EQ(one.lse, three.lse);
  EXPECT_EQ(one.dk, three.dk);  // each key block's dK/dV is owned by one item
  EXPECT_EQ(one.dv, three.dv);
  EXPECT_LE(max_abs_diff(one.dq, three.dq), 1e-5);
  const Outputs again = run_cpu_kernels(p, DType::f32, 3);
  EXPECT_EQ(three.dq, again.dq);  // deterministic run to run
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

// Attends to disjoint key chunks separately and merges: equals one pass to fp32 rounding, in any order.
TEST(AttentionCpu, MergeOfPartialStatesEqualsOnePass) {
  Problem p = basic(257, 64, 4, 2);
  p.mask.causal = true;
  p.mask.window_left = 150;
  const Outputs whole = run_cpu_kernels(p, DType::f32, 2, false);
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 37}, {37, 160}, {160, 257}};
  std::vector<Outputs> parts;
  for (auto [a, b] : chunks) {
    Problem c = p;
    c.k_pos.assign(p.k_pos.begin() + a, p.k_pos.begin() + b);
    const int64_t rowk = p.dims.kv_heads * p.dims.head_dim;
    c.k.assign(p.k.begin() + a * rowk, p.k.begin() + b * rowk);
    c.v.assign(p.v.begin() + a * rowk, p.v.begin() + b * rowk);
    parts.push_back(run_cpu_kernels(c, DType::f32, 2, false));
  }
  auto merged = [&](std::vector<int> order) {
    Outputs m = parts[size_t(order[0])];
    for (size_t i = 1; i < order.size(); ++i)
      kernels::merge_states(p.dims, p.rows_q(), AttentionState{m.o.data(), m.lse.data()},
                            parts[size_t(order[i])].o.data(), parts[size_t(order[i])].lse.data());
    return m;
  };
  const Outputs a = merged({0, 1, 2}), b = merged({2, 0, 1});
  EXPECT_LE(max_abs_diff(a.o, whole.o), 2e-6);
  EXPECT_LE(max_abs_diff(a.lse, whole.lse), 2e-6);
  EXPECT_LE(max_abs_diff(a.o, b.o), 2e-6);
  EXPECT_LE(max_abs_diff(a.lse, b.lse), 2e-6);

  // Accumulating chunk after chunk into one state (what the ring does) gives the same.
  Outputs acc;
  acc.o.assign(p.q_elems(), 0.0f);
  acc.lse.assign(p.lse_elems(), kNegInf);
  for (auto [s, e] : chunks) {
    const int64_t rowk = p.dims.kv_heads * p.dims.head_dim;
    QueryRows q{p.q.data(), DType::f32, p.rows_q(), p.q_pos.data()};
    KeyValueRows kv{p.k.data() + s * rowk, p.v.data() + s * rowk, DType::f32, e - s, p.k_pos.data() + s};
    CpuOptions opt;
    opt.threads = 2;
    kernels::attention_forward(p.dims, q, kv, p.mask.view(), AttentionState{acc.o.data(), acc.lse.data()}, opt);
  }
  EXPECT_LE(max_abs_diff(acc.o, whole.o), 2e-6);
  EXPECT_LE(max_abs_diff(acc.lse, whole.lse), 2e-6);
}

// Backward over key chunks: dQ sums over chunks, dK/dV are per chunk; equals one pass.
TEST(AttentionCpu, BackwardOverKeyChunksEqualsOnePass) {
  Problem p = basic(200, 64, 2, 1);
  p.mask.causal = true;
  const Outputs whole = run_cpu_kernels(p);
  std::vector<float> delta(p.lse_elems());
  kernels::attention_delta(p.dims, p.rows_q(), whole.o.data(), p.dout.data(), DType::f32, delta.data());
  std::vector<float> dq(p.q_elems(), 0.0f), dk(p.k_elems(), 0.0f), dv(p.k_elems(), 0.0f);
  const int64_t rowk = p.dims.kv_heads * p.dims.head_dim;
  for (auto [s, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 90}, {90, 200}}) {
    QueryRows q{p.q.data(), DType::f32, p.rows_q(), p.q_pos.data()};
    KeyValueRows kv{p.k.data() + s * rowk, p.v.data() + s * rowk, DType::f32, e - s, p.k_pos.data() + s};
    CpuOptions opt;
    opt.threads = 2;
    kernels::attention_backward(p.dims, q, kv, p.dout.data(), whole.lse.data(), delta.data(), dq.data(),
                                dk.data() + s * rowk, dv.data() + s * rowk, p.mask.view(), opt);
  }
  EXPECT_LE(max_abs_diff(dq, whole.dq), 1e-5);
  EXPECT_LE(max_abs_diff(dk, whole.dk), 1e-6);
  EXPECT_LE(max_abs_diff(dv, whole.dv), 1e-6);
}

}  // namespace
}  // namespace ringattn::testing
