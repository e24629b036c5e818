#include "runtime/lora/demo.hpp"

#include <cmath>
#include <stdexcept>

#include "runtime/random_inputs.hpp"

namespace ringattn {

namespace {

// Generator streams of the demo's weights (random_inputs.hpp uses 1..6 for activations).
enum : uint64_t { kStreamW0 = 16, kStreamTeacherA = 20, kStreamTeacherB = 24 };

}  // namespace

std::vector<double> run_lora_demo(comm::Communicator& comm, LoraLayer& student, const DemoOptions& options,
                                  const std::function<void(int, double)>& on_step, LayerPassStats* forward_stats,
                                  LayerPassStats* backward_stats) {
  const LayerConfig& config = student.config();
  for (bool on : config.lora)
    if (!on) throw std::invalid_argument("run_lora_demo: the student needs LoRA factors on every projection");
  LoraLayer teacher(student.session(), config, student.spec());
  const float s = config.scaling();
  for (int p = 0; p < kProjections; ++p) {
    const ProjectionShape& shape = config.shape(p);
    const float w_scale = float(1.0 / std::sqrt(double(shape.in)));  // keeps activations O(1)
    // (s B A)_ij has variance s^2 r sigma^2 / in, so ||s B A|| / ||W0|| = s sqrt(r) sigma.
    const float b_scale = float(options.teacher_change / (s * std::sqrt(double(shape.rank))));
    for (LoraLayer* layer : {&teacher, &student})
      fill_normal(layer->projection(p), ProjectionPart::w0, options.seed, kStreamW0 + uint64_t(p), w_scale);
    fill_normal(teacher.projection(p), ProjectionPart::lora_a, options.seed, kStreamTeacherA + uint64_t(p), w_scale);
    fill_normal(teacher.projection(p), ProjectionPart::lora_b, options.seed, kStreamTeacherB + uint64_t(p), b_scale);
    init_lora_factors(student.projection(p), options.seed, lora_init_stream(p));
  }

  LoraOptimizer optimizer(student, options.optimizer);
  const std::vector<int64_t>& pos = student.positions();
  const size_t n = student.activation_elements();
  std::vector<float> x(n), target(n), y;
  MirroredFloats x_in(student.backend(), x), target_out(student.backend(), target);
  std::vector<double> losses;
  for (int step = 1; step <= options.steps; ++step) {
    // A fresh sequence per step, the same on any number of ranks.
    random_rows(x.data(), options.seed + uint64_t(step), RandomTensor::x, config.batch, config.seq_len, config.d_model,
                pos.data(), student.rows());
    x_in.upload();
    teacher.forward(x_in.data(), target_out.data());
    target_out.download();
    const double loss = train_step(comm, student, optimizer, x_in.data(), LossKind::mse, target.data(), y,
                                   forward_stats, backward_stats);
    losses.push_back(loss);
    if (on_step) on_step(step, loss);
  }
  return losses;
}

}  // namespace ringattn
