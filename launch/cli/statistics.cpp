#include "launch/cli/statistics.hpp"

#include <algorithm>
#include <cstddef>

namespace ringattn {

double percentile_of(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double at = std::clamp(p, 0.0, 100.0) / 100.0 * double(values.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (at - double(lo)) * (values[hi] - values[lo]);
}

double median_of(std::vector<double> values) { return percentile_of(std::move(values), 50.0); }

}  // namespace ringattn
