// `ringattn layer --demo`: LoRA recovers a hidden low-rank change.
//
// A teacher layer has weights W0 + dW for each of q, k, v, o, where dW = s B_t A_t is a random
// change of rank r (its Frobenius norm `teacher_change` times that of W0, in expectation). A
// student starts from the same frozen W0 with fresh LoRA factors (A random, B = 0, as PEFT
// initialises them, so the student starts as W0 alone) and trains them on random sequences:
// at every step a new X (B, L, d_model) is drawn, the teacher's output is the target, and the
// loss is the MSE between the two outputs over the whole sequence.
//
// Every weight and input element is drawn from a counter-based generator indexed by its global
// coordinates (random_inputs.hpp), so the teacher, the student's start and the data are the same
// for any number of ranks and any layout: the loss curve is P-independent up to fp32 rounding.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/lora/layer.hpp"
#include "runtime/lora/training.hpp"

namespace ringattn {

struct DemoOptions {
  int steps = 60;
  OptimizerOptions optimizer;
  uint64_t seed = 0;
  double teacher_change = 0.5;  // ||dW||_F / ||W0||_F of the hidden change
};

// Initialises `student` (which must carry LoRA factors on every projection) as described above,
// builds the teacher beside it, and trains the student for options.steps steps. Returns the loss
// of every step (before its update); on_step(step, loss) is called after each, on every rank.
// The stats, when given, receive those of the student's passes in the last step.
std::vector<double> run_lora_demo(comm::Communicator& comm, LoraLayer& student, const DemoOptions& options,
                                  const std::function<void(int, double)>& on_step = {},
                                  LayerPassStats* forward_stats = nullptr, LayerPassStats* backward_stats = nullptr);

}  // namespace ringattn
