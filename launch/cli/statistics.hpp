// The statistics every measurement reports (the job, `bench`, `bench --kernel`, the GPU benchmark,
// the planner's simulator): one definition, so that "median" means the same in every table.
// (The GPU benchmark, built without the launch library, can compile statistics.cpp in.)
#pragma once

#include <vector>

namespace ringattn {

// The p-th percentile (0..100), linear between order statistics (numpy's default); 0 for none.
double percentile_of(std::vector<double> values, double p);

// The middle value (the mean of the two middle ones for an even count); 0 for none.
double median_of(std::vector<double> values);

}  // namespace ringattn
