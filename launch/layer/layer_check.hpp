// `ringattn layer --check`: the same pass again on the CPU backend in fp32 (a second layer over a
// session of its own, holding this layer's parameters), and how far apart the results are: per
// tensor, the largest difference over all ranks relative to the largest value of the CPU's result.
#pragma once

#include <string>
#include <vector>

#include "launch/cli/context.hpp"
#include "runtime/lora/layer.hpp"

namespace ringattn {

struct LayerCheck {
  struct Compared {
    const char* what;
    double max_abs_err, scale;
    double relative() const { return max_abs_err / std::max(scale, 1e-30); }
  };
  std::vector<Compared> tensors;
  double tolerance = 0.0;
  bool passed = true;

  double max_abs_err() const;
  double max_relative() const;
  std::string describe() const;  // "Y 1.2e-07, dX ..., largest error / largest value (tolerance ...)"
};

// Collective. y (and with dy, dx and the layer's LoRA gradients) are the layer's results for x.
LayerCheck check_layer(const LaunchContext& ctx, LoraLayer& layer, std::vector<float>& x, std::vector<float>* dy,
                       const std::vector<float>& y, const std::vector<float>& dx);

}  // namespace ringattn
