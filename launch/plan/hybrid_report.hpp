// `ringattn plan --ulysses`: the hybrid's predictions at every rank count for each degree U, and
// the recommended U (the least forward + backward time).
#pragma once

#include <vector>

#include "launch/cli/json.hpp"
#include "kernels/mask/mask.hpp"
#include "launch/plan/hybrid_model.hpp"

namespace ringattn {

// `degrees` empty: every U of 1, 2, 4, 8, ... up to the largest rank count that fits.
Json print_hybrid_projection(const ClusterSpec& cluster, const Workload& w, const Mask& mask,
                             const std::vector<int>& ranks, std::vector<int> degrees);

}  // namespace ringattn
