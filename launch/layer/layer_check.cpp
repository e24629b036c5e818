#include "launch/layer/layer_check.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <span>
#include <sstream>
#include <utility>

#include "launch/cli/execution.hpp"

namespace ringattn {

namespace {

// fp32 against fp32 differs by summation order (GEMMs, the attention's tiles); bf16 GEMM operands
// and ring storage round to 8 bits of mantissa.
constexpr double kCheckToleranceFp32 = 1e-4, kCheckToleranceBf16 = 3e-2;

}  // namespace

double LayerCheck::max_abs_err() const {
  double e = 0.0;
  for (const Compared& t : tensors) e = std::max(e, t.max_abs_err);
  return e;
}

double LayerCheck::max_relative() const {
  double e = 0.0;
  for (const Compared& t : tensors) e = std::max(e, t.relative());
  return e;
}

std::string LayerCheck::describe() const {
  std::ostringstream s;
  s.precision(2);
  for (const Compared& t : tensors) s << t.what << " " << std::scientific << t.relative() << ", ";
  s << "largest error / largest value (tolerance " << tolerance << ")";
  return s.str();
}

LayerCheck check_layer(const LaunchContext& ctx, LoraLayer& layer, std::vector<float>& x, std::vector<float>* dy,
                       const std::vector<float>& y, const std::vector<float>& dx) {
  comm::Communicator& comm = ctx.world;
  const LayerConfig& c = layer.config();
  ContextOptions options;
  options.backend = "cpu";
  options.comm = "mpi";
  options.threads = c.threads;
  options.timeout_s = comm.timeout();
  const std::unique_ptr<Session> cpu = open_session(ctx.world, options, ctx.seam);
  LayerConfig fp32 = c;
  fp32.dtype = DType::f32;
  LoraLayer reference(*cpu, fp32, layer.spec());
  for (int p = 0; p < kProjections; ++p) {
    const ShardedProjection& from = std::as_const(layer).projection(p);
    ShardedProjection& to = reference.projection(p);
    std::copy(from.w0().begin(), from.w0().end(), to.w0().begin());
    std::copy(from.bias().begin(), from.bias().end(), to.bias().begin());
    std::copy(from.lora().begin(), from.lora().end(), to.lora().begin());
  }
  LayerCheck check;
  check.tolerance = c.dtype == DType::bf16 ? kCheckToleranceBf16 : kCheckToleranceFp32;
  auto compare = [&](const char* what, std::span<const float> got, std::span<const float> want) {
    double e[2] = {0.0, 0.0};  // largest |difference|, largest |want|
    for (size_t i = 0; i < want.size(); ++i) {
      e[0] = std::max(e[0], std::abs(double(got[i]) - double(want[i])));
      e[1] = std::max(e[1], std::abs(double(want[i])));
      if (std::isnan(got[i]) != std::isnan(want[i])) e[0] = std::numeric_limits<double>::infinity();
    }
    comm.allreduce(e, 2, DType::f64, comm::ReduceOp::max);
    check.tensors.push_back({what, e[0], e[1]});
    check.passed = check.passed && check.tensors.back().relative() <= check.tolerance;
  };
  std::vector<float> want(x.size());
  reference.forward(x.data(), want.data());  // the CPU's memory is the host's
  compare("Y", y, want);
  if (!dy) return check;
  reference.backward(x.data(), dy->data(), want.data());
  compare("dX", dx, want);
  std::vector<float> got_grads, want_grads;
  for (int p = 0; p < kProjections; ++p) {
    got_grads.insert(got_grads.end(), layer.lora_grad(p).begin(), layer.lora_grad(p).end());
    want_grads.insert(want_grads.end(), reference.lora_grad(p).begin(), reference.lora_grad(p).end());
  }
  compare("dA/dB", got_grads, want_grads);
  return check;
}

}  // namespace ringattn
