// Training the LoRA factors of a LoraLayer: losses over the whole sharded sequence, and SGD /
// AdamW updates of the slices each rank owns (optimizer state sharded the same way, ZeRO-style).
//
// AdamW is PyTorch's torch.optim.AdamW with its defaults (betas 0.9 / 0.999, eps 1e-8,
// weight_decay 0.01, no amsgrad): decoupled weight decay p *= 1 - lr wd, then
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). Weight decay applies to A and B.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/lora/layer.hpp"

namespace ringattn {

enum class OptimizerKind { sgd, adamw };
const char* optimizer_name(OptimizerKind kind);
OptimizerKind parse_optimizer(const std::string& name);  // throws ArgumentError naming optimizer

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;  // AdamW only
};

class LoraOptimizer {
 public:
  LoraOptimizer(LoraLayer& layer, const OptimizerOptions& options);
  // Updates every owned slice from layer.lora_grad() (after a backward pass).
  void step();
  int steps() const { return steps_; }
  size_t state_bytes() const;  // this rank's AdamW moments

 private:
  LoraLayer& layer_;
  OptimizerOptions options_;
  int steps_ = 0;
  std::array<std::vector<float>, kProjections> m_, v_;
};

// Losses over the whole sequence (every rank's rows, summed by an allreduce), each with the
// gradient dy it feeds to backward:
//   mse     mean over all B * L * d_model elements of (y - target)^2 (PyTorch MSELoss, mean),
//           dy = 2 (y - target) / (B L d_model);  `total_elements` is B * L * d_model;
//   linear  sum(y * g) for a given g (the --dy of a run): dy = g.
double mse_loss(comm::Communicator& comm, const float* y, const float* target, size_t n, double total_elements,
                float* dy);
double linear_loss(comm::Communicator& comm, const float* y, const float* g, size_t n);

enum class LossKind { mse, linear };

// One training step: forward, the loss against `reference` (the target for mse, g for linear; host
// memory), backward without dX, optimizer update. x is in the layer's memory (layer.backend()).
// Returns the loss before the update; y (host) receives the layer's output before the update.
double train_step(comm::Communicator& comm, LoraLayer& layer, LoraOptimizer& optimizer, const float* x, LossKind loss,
                  const float* reference, std::vector<float>& y, LayerPassStats* forward_stats = nullptr,
                  LayerPassStats* backward_stats = nullptr);

}  // namespace ringattn
