// launch/cli/statistics.hpp: the median and percentiles every measurement reports.
#include "launch/cli/statistics.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace ringattn {
namespace {

TEST(Statistics, MedianAndPercentileAsNumpy) {
  EXPECT_DOUBLE_EQ(median_of({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median_of({4.0, 1.0, 2.0, 3.0}), 2.5);
  std::vector<double> v;
  for (int i = 1; i <= 20; ++i) v.push_back(i);
  EXPECT_NEAR(percentile_of(v, 95), 19.05, 1e-12);  // numpy.percentile(range(1, 21), 95)
  EXPECT_DOUBLE_EQ(percentile_of(v, 100), 20.0);
  EXPECT_DOUBLE_EQ(percentile_of({7.0}, 95), 7.0);
  EXPECT_DOUBLE_EQ(percentile_of({}, 50), 0.0);
}

}  // namespace
}  // namespace ringattn
