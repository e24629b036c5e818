// What `ringattn plan` prints and writes: the projection table (every layout and schedule at
// every rank count, with a recommendation) and the calibration against measured points.
#pragma once

#include <string>
#include <vector>

#include "launch/cli/json.hpp"
#include "launch/plan/calibration.hpp"
#include "launch/plan/cluster_model.hpp"

namespace ringattn {

// ranks_per_node of a machine whose ranks all share one node (a calibrated machine).
inline constexpr int kOneNode = 1 << 30;

// Prints the projection; returns it as JSON (one entry per prediction, and the recommendations).
Json print_projection(const ClusterSpec& cluster, const Workload& w, const Mask& mask, const std::vector<int>& ranks,
                      const std::vector<LayoutKind>& layouts, const std::vector<Schedule>& schedules);

// Prints the fitted parameters and every point's measured against predicted times; true when
// every error is within the tolerance.
// same_run: the points were predicted with their own runs' rates (compare_same_run), not cal's.
bool print_calibration(const Calibration& cal, int threads, const std::vector<Comparison>& rows,
                       const std::vector<std::string>& skipped, double tolerance, bool same_run = false);
Json calibration_json(const Calibration& cal, const std::vector<Comparison>& rows, double tolerance);

}  // namespace ringattn
