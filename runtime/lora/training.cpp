#include "runtime/lora/training.hpp"

#include <cmath>

#include "runtime/errors.hpp"

namespace ringattn {

const char* optimizer_name(OptimizerKind kind) { return kind == OptimizerKind::sgd ? "sgd" : "adamw"; }

OptimizerKind parse_optimizer(const std::string& name) {
  if (name == "sgd") return OptimizerKind::sgd;
  if (name == "adamw") return OptimizerKind::adamw;
  throw ArgumentError("optimizer", "{optimizer} '" + name + "': expected sgd or adamw");
}

LoraOptimizer::LoraOptimizer(LoraLayer& layer, const OptimizerOptions& options) : layer_(layer), options_(options) {
  if (options.kind == OptimizerKind::adamw)
    for (int p = 0; p < kProjections; ++p) {
      m_[static_cast<size_t>(p)].assign(layer.projection(p).lora().size(), 0.0f);
      v_[static_cast<size_t>(p)].assign(layer.projection(p).lora().size(), 0.0f);
    }
}

size_t LoraOptimizer::state_bytes() const {
  size_t n = 0;
  for (int p = 0; p < kProjections; ++p) n += m_[static_cast<size_t>(p)].size() + v_[static_cast<size_t>(p)].size();
  return n * sizeof(float);
}

void LoraOptimizer::step() {
  ++steps_;
  const float lr = float(options_.lr);
  // PyTorch's single-tensor AdamW, in the same order of operations (fp32 tensors, bias
  // corrections computed in double as Python floats).
  const double bias1 = 1.0 - std::pow(options_.beta1, steps_);
  const float step_size = float(options_.lr / bias1);
  const float bias2_sqrt = float(std::sqrt(1.0 - std::pow(options_.beta2, steps_)));
  const float b1 = float(options_.beta1), b2 = float(options_.beta2), eps = float(options_.eps);
  const float decay = float(1.0 - options_.lr * options_.weight_decay);
  for (int p = 0; p < kProjections; ++p) {
    std::span<float> w = layer_.projection(p).lora();
    std::span<const float> g = layer_.lora_grad(p);
    if (w.empty()) continue;
    if (g.size() != w.size()) throw std::logic_error("LoraOptimizer::step without the gradients of a backward pass");
    if (options_.kind == OptimizerKind::sgd) {
      for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * g[i];
      continue;
    }
    float* m = m_[static_cast<size_t>(p)].data();
    float* v = v_[static_cast<size_t>(p)].data();
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] *= decay;
      m[i] += (g[i] - m[i]) * (1.0f - b1);  // exp_avg.lerp_(grad, 1 - beta1)
      v[i] = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
      w[i] -= step_size * m[i] / denom;
    }
  }
}

double mse_loss(comm::Communicator& comm, const float* y, const float* target, size_t n, double total_elements,
                float* dy) {
  double sum = 0.0;
  const float scale = float(2.0 / total_elements);
  for (size_t i = 0; i < n; ++i) {
    const float e = y[i] - target[i];
    sum += double(e) * double(e);
    if (dy) dy[i] = scale * e;
  }
  comm.allreduce(&sum, 1, DType::f64, comm::ReduceOp::sum);
  return sum / total_elements;
}

double linear_loss(comm::Communicator& comm, const float* y, const float* g, size_t n) {
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += double(y[i]) * double(g[i]);
  comm.allreduce(&sum, 1, DType::f64, comm::ReduceOp::sum);
  return sum;
}

double train_step(comm::Communicator& comm, LoraLayer& layer, LoraOptimizer& optimizer, const float* x, LossKind loss,
                  const float* reference, std::vector<float>& y, LayerPassStats* forward_stats,
                  LayerPassStats* backward_stats) {
  const size_t n = layer.activation_elements();
  y.resize(n);
  MirroredFloats y_out(layer.backend(), y);
  const LayerPassStats f = layer.forward(x, y_out.data());
  y_out.download();
  double value = 0.0;
  std::vector<float> dy;
  if (loss == LossKind::mse) {
    const LayerConfig& c = layer.config();
    dy.resize(n);
    value = mse_loss(comm, y.data(), reference, n, double(c.batch * c.seq_len * c.d_model), dy.data());
  } else {
    value = linear_loss(comm, y.data(), reference, n);
    dy.assign(reference, reference + n);
  }
  MirroredFloats dy_in(layer.backend(), dy);
  dy_in.upload();
  const LayerPassStats b = layer.backward(x, dy_in.data(), nullptr);
  optimizer.step();
  if (forward_stats) *forward_stats = f;
  if (backward_stats) *backward_stats = b;
  return value;
}

}  // namespace ringattn
