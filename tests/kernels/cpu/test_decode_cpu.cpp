// The CPU decode kernel (kernels/cpu/decode_cpu.hpp) against the fp64 reference under the error
// rule: GQA groups packed as tile rows, several new tokens (causal among themselves), windows,
// cached rows that are one rank's share (positions with gaps), more rows than one chunk, bf16, a
// share the window leaves empty, and results that do not depend on the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/decode_cpu.hpp"
#include "kernels/error_rule.hpp"
#include "kernels/mask/mask.hpp"
#include "kernels/reference.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {
namespace {

struct DecodeCase {
  int64_t heads, kv_heads, head_dim, rows, tokens, window_left;
  DType dtype;
  int64_t stride = 3;  // cached positions 1, 4, 7, ...: one rank's share of a round-robin placement
};

struct DecodeRun {
  std::vector<float> o, lse;
};

// Runs the kernel and checks it; returns its result for comparisons between runs.
DecodeRun run_and_check(const DecodeCase& c, int threads, bool check = true) {
  const int64_t H = c.heads, Hkv = c.kv_heads, D = c.head_dim, T = c.tokens, capacity = c.rows + 7;
  kernels::AttentionDims dims{1, H, Hkv, D, 1.0f / std::sqrt(float(D))};
  // Cached rows (row-major for the reference), the last few of them the new tokens themselves.
  std::vector<int64_t> k_pos(static_cast<size_t>(c.rows));
  for (int64_t j = 0; j < c.rows; ++j) k_pos[size_t(j)] = 1 + j * c.stride;
  const int64_t first_new = k_pos.back() - (T - 1);  // the new tokens end at the last cached row
  std::vector<int64_t> q_pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) q_pos[size_t(t)] = first_new + t;
  std::vector<float> q = random_vector(size_t(T * H * D), 11), k = random_vector(size_t(c.rows * Hkv * D), 12),
                     v = random_vector(size_t(c.rows * Hkv * D), 13);
  if (c.dtype == DType::bf16) q = round_to_bf16(q), k = round_to_bf16(k), v = round_to_bf16(v);
  // The cache's head-major layout: head g's row j at (g * capacity + j) * D.
  std::vector<float> kc(size_t(Hkv * capacity * D), 0.0f), vc(kc.size(), 0.0f);
  for (int64_t j = 0; j < c.rows; ++j)
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t d = 0; d < D; ++d) {
        kc[size_t((g * capacity + j) * D + d)] = k[size_t((j * Hkv + g) * D + d)];
        vc[size_t((g * capacity + j) * D + d)] = v[size_t((j * Hkv + g) * D + d)];
      }
  std::vector<bf16_bits> qb, kb, vb;
  const void *qd = q.data(), *kd = kc.data(), *vd = vc.data();
  if (c.dtype == DType::bf16) qb = to_bf16(q), kb = to_bf16(kc), vb = to_bf16(vc), qd = qb.data(), kd = kb.data(), vd = vb.data();

  DecodeRun run{std::vector<float>(size_t(T * H * D), 7.0f), std::vector<float>(size_t(H * T), 7.0f)};
  kernels::CpuOptions options;
  options.threads = threads;
  kernels::decode_forward(dims, kernels::DecodeQueries{qd, c.dtype, T, q_pos.data()},
                          kernels::CachedKeyValues{kd, vd, c.dtype, c.rows, capacity, k_pos.data()}, c.window_left,
                          kernels::AttentionState{run.o.data(), run.lse.data()}, options);
  if (!check) return run;

  Mask mask;
  mask.causal = true;
  if (c.window_left >= 0) mask.window_left = c.window_left;
  std::vector<double> ro(run.o.size()), rlse(run.lse.size());
  double max_score = 0.0;
  kernels::reference_forward(dims, q.data(), q_pos.data(), T, k.data(), v.data(), k_pos.data(), c.rows, mask.view(),
                             ro.data(), rlse.data(), &max_score);
  std::vector<float> so(run.o.size()), slse(run.lse.size());
  kernels::naive_forward_fp32(dims, q.data(), q_pos.data(), T, k.data(), v.data(), k_pos.data(), c.rows, mask.view(),
                              so.data(), slse.data());
  kernels::TensorError eo, el;
  for (size_t i = 0; i < ro.size(); ++i) eo.add(run.o[i], so[i], ro[i]);
  for (size_t i = 0; i < rlse.size(); ++i) el.add(run.lse[i], slse[i], rlse[i]);
  EXPECT_TRUE(eo.passed()) << "O error " << eo.error << " bound " << eo.bound();
  EXPECT_TRUE(el.passed()) << "LSE error " << el.error << " bound " << el.bound();
  return run;
}

TEST(DecodeCpu, MatchesReference) {
  const DecodeCase cases[] = {
      {8, 2, 64, 5000, 1, -1, DType::f32},   // more rows than one chunk, a tail block
      {8, 2, 64, 5000, 1, -1, DType::bf16},
      {4, 4, 32, 300, 1, -1, DType::f32},    // MHA: one row per tile
      {8, 1, 128, 700, 3, -1, DType::f32},   // MQA, speculative tokens: causal among the new ones
      {8, 2, 64, 3000, 4, 1000, DType::bf16},  // a window: the first rows are skipped
      {32, 8, 128, 100, 1, 20, DType::f32},  // a window narrower than the stride between rows
      {64, 2, 16, 257, 5, -1, DType::f32},   // 160 rows per head: several row groups
  };
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "H " << c.heads << " Hkv " << c.kv_heads << " D " << c.head_dim << " rows "
                                      << c.rows << " T " << c.tokens << " window " << c.window_left << " "
                                      << dtype_name(c.dtype));
    run_and_check(c, 2);
  }
}

TEST(DecodeCpu, WindowPastEveryRowGivesAnEmptyState) {
  // The new token at the last row sees only itself; with stride 3 and window 1 no other row, and
  // with the window starting past every row of a share (its rows all before i - left) none at all.
  DecodeCase c{8, 2, 64, 50, 1, 1, DType::f32};
  const DecodeRun r = run_and_check(c, 2);
  EXPECT_TRUE(std::isfinite(r.lse[0]));
  // A share whose rows all lie outside the window: positions 1..148 seen from a query at 1000.
  const int64_t H = 4, Hkv = 2, D = 32, rows = 50;
  kernels::AttentionDims dims{1, H, Hkv, D, 0.2f};
  std::vector<float> q(size_t(H * D), 1.0f), k(size_t(Hkv * rows * D), 1.0f), v = k;
  std::vector<int64_t> k_pos = iota_positions(rows, 1, 3), q_pos{1000};
  std::vector<float> o(size_t(H * D), 5.0f), lse(size_t(H), 5.0f);
  kernels::decode_forward(dims, {q.data(), DType::f32, 1, q_pos.data()},
                          {k.data(), v.data(), DType::f32, rows, rows, k_pos.data()}, 100,
                          kernels::AttentionState{o.data(), lse.data()}, {});
  for (float x : o) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(kernels::decode_bytes_read(dims, {k.data(), v.data(), DType::f32, rows, rows, k_pos.data()}, 100,
                                       {q.data(), DType::f32, 1, q_pos.data()}),
            0u);
}

TEST(DecodeCpu, ResultsDoNotDependOnThreads) {
  const DecodeCase c{8, 2, 64, 9000, 2, -1, DType::bf16};
  const DecodeRun one = run_and_check(c, 1, false), three = run_and_check(c, 3, false);
  EXPECT_EQ(one.o, three.o);
  EXPECT_EQ(one.lse, three.lse);
}

}  // namespace
}  // namespace ringattn::testing
