// The CPU decode kernel (kernels/cpu/decode_cpu.hpp) against the fp64 reference under the error
// rule: GQA groups packed as tile rows, several new tokens (causal among themselves), windows,
// cached rows that are one rank's share (positions with gaps), more rows than one chunk, bf16, a
// share the window leaves empty, prefill chunks (the forward kernel), and results that do not depend on the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/decode_cpu.hpp"
#include "tests/support/decode_problem.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {
namespace {

// Runs the kernel and checks it; returns its result for comparisons between runs.
DecodeRun run_and_check(const DecodeCase& c, int threads, bool check = true) {
  const DecodeProblem pr(c, c.rows + 7, 11);
  const int64_t H = c.heads, D = c.head_dim, T = c.tokens;
  std::vector<bf16_bits> qb, kb, vb;
  const void *qd = pr.q.data(), *kd = pr.k_cache.data(), *vd = pr.v_cache.data();
  if (c.dtype == DType::bf16)
    qb = to_bf16(pr.q), kb = to_bf16(pr.k_cache), vb = to_bf16(pr.v_cache), qd = qb.data(), kd = kb.data(),
    vd = vb.data();

  DecodeRun run{std::vector<float>(size_t(T * H * D), 7.0f), std::vector<float>(size_t(H * T), 7.0f)};
  kernels::CpuOptions options;
  options.threads = threads;
  kernels::decode_forward(pr.dims, kernels::DecodeQueries{qd, c.dtype, T, pr.q_pos.data()},
                          kernels::CachedKeyValues{kd, vd, c.dtype, c.rows, pr.capacity, pr.k_pos.data()},
                          c.window_left, kernels::AttentionState{run.o.data(), run.lse.data()}, options);
  if (check) pr.expect_exact(run.o, run.lse, "", kernels::decode_same_precision(T, c.dtype));
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
      // Prefill chunks (pass-Q): tokens that fill the query tiles run through the forward kernel,
      // the others through the decode kernel's row groups.
      {8, 2, 64, 3000, 64, -1, DType::f32},
      {8, 2, 64, 3000, 120, -1, DType::bf16},
      {8, 2, 64, 3000, 100, -1, DType::bf16},  // two tiles 78% full: the decode kernel
      {8, 2, 64, 3000, 60, 500, DType::bf16},  // a window: the forward kernel's mask
      {8, 2, 64, 3000, 40, 500, DType::f32},   // the same on the decode kernel
      {4, 1, 32, 10, 57, 8, DType::f32},       // more new tokens than cached rows
      {4, 1, 32, 10, 33, 8, DType::f32},
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
  const DecodeCase chunk{8, 2, 64, 3000, 64, -1, DType::bf16};  // through the forward kernel
  const DecodeRun chunk_one = run_and_check(chunk, 1, false), chunk_three = run_and_check(chunk, 3, false);
  EXPECT_EQ(chunk_one.o, chunk_three.o);
  EXPECT_EQ(chunk_one.lse, chunk_three.lse);
}

TEST(DecodeCpu, ForwardKernelTakesCallsThatFillItsQueryTiles) {
  const int64_t tile = kernels::cpu_query_tile(), fill = tile * 7 / 8;
  for (int64_t t : {int64_t{1}, int64_t{4}, fill - 1, tile + 1, 2 * fill - 1})
    EXPECT_FALSE(kernels::decode_runs_forward_kernel(t)) << t << " tokens, tiles of " << tile;
  for (int64_t t : {fill, tile, 2 * fill, 2 * tile, 8 * tile + 1, 40 * tile + 3})
    EXPECT_TRUE(kernels::decode_runs_forward_kernel(t)) << t << " tokens, tiles of " << tile;
}

}  // namespace
}  // namespace ringattn::testing
