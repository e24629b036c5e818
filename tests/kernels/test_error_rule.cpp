// The error rule (kernels/error_rule.hpp) and the one-process sampled check built on it
// (kernels/sampled_check.hpp): the CPU kernels pass; a one-key mask error and one perturbed
// value at 2048 keys fail.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/error_rule.hpp"
#include "kernels/sampled_check.hpp"
#include "tests/support/attention_oracle.hpp"

namespace ringattn::testing {
namespace {

TEST(ErrorRule, BoundFollowsTheSamePrecisionError) {
  kernels::TensorError e;
  e.add(1.0 + 1e-7, 1.0 + 1e-7, 1.0);
  EXPECT_TRUE(e.passed());
  EXPECT_NEAR(e.bound(), kernels::kErrorFactor * 1e-7 + kernels::kErrorFloor, 1e-12);
  e.add(2.0 + 1e-5, 2.0, 2.0);  // 100x the same-precision error
  EXPECT_FALSE(e.passed());
}

TEST(ErrorRule, NanAndMisplacedInfinityFail) {
  kernels::TensorError nan;
  nan.add(std::nan(""), 1.0, 1.0);
  EXPECT_FALSE(nan.passed());
  const double inf = std::numeric_limits<double>::infinity();
  kernels::TensorError empty_row;  // a row that sees no key: LSE -inf everywhere passes
  empty_row.add(-inf, -inf, -inf);
  EXPECT_TRUE(empty_row.passed());
  kernels::TensorError wrong_empty;
  wrong_empty.add(0.5, -inf, -inf);
  EXPECT_FALSE(wrong_empty.passed());
}


kernels::SampledErrors check(const Problem& p, const Outputs& got, const Mask& truth) {
  const MaskView mv = truth.view();
  return kernels::check_sampled_rows(
      kernels::WholeProblem{p.dims, p.rows_q(), mv, p.q.data(), p.k.data(), p.v.data(), p.dout.data()},
      kernels::KernelResults{got.o.data(), got.lse.data(), got.dq.data(), got.dk.data(), got.dv.data()},
      {0, 1, 700, 1024, 1500, 2046, 2047});
}

TEST(SampledCheck, PassesTheKernelsAndCatchesOneKeyErrors) {
  Problem p(1, 2, 1, 32, iota_positions(2048), iota_positions(2048));
  p.mask.causal = true;
  p.mask.window_left = 1500;
  const Outputs good = run_cpu_kernels(p);
  const kernels::SampledErrors ok = check(p, good, p.mask);
  EXPECT_EQ(ok.wrong_forward() + ok.wrong_backward(), 0) << "o " << ok.o.error << " / " << ok.o.bound();

  // The kernels run with the window one key wider, judged against the true mask.
  Problem wider = p;
  wider.mask.window_left = 1501;
  const kernels::SampledErrors bad = check(p, run_cpu_kernels(wider), p.mask);
  EXPECT_GT(bad.wrong_forward(), 0);
  EXPECT_GT(bad.wrong_backward(), 0);

  Outputs nudged = good;
  nudged.o[size_t(2047 * 2 * 32)] += 1e-4f;
  EXPECT_EQ(check(p, nudged, p.mask).wrong_forward(), 1);
}

}  // namespace
}  // namespace ringattn::testing
