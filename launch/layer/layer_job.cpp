// `ringattn layer`: parse, resolve, open the session and the layer, load the weights and inputs,
// train and run the passes, check, write the outputs, report. Each phase is a function below; the
// phases that involve no communication run as agreed phases (launch/cli/job_control.hpp).
#include "launch/layer/layer_job.hpp"

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "launch/cli/argument_names.hpp"
#include "launch/cli/cpu_binding.hpp"
#include "launch/cli/execution.hpp"
#include "launch/cli/job_control.hpp"
#include "launch/layer/layer_check.hpp"
#include "launch/layer/layer_options.hpp"
#include "launch/layer/layer_outputs.hpp"
#include "launch/layer/layer_report.hpp"
#include "runtime/errors.hpp"
#include "runtime/lora/demo.hpp"
#include "util/stopwatch.hpp"

namespace po = boost::program_options;

namespace ringattn {
namespace {

// The command line's names for the arguments whose values come from --x, when they do.
std::map<std::string, std::string, std::less<>> x_argument_names(const LayerOptions& o) {
  if (o.x.empty()) return {};
  const std::string x = "--x " + o.x + "'s ";
  return {{"batch", x + "batch"}, {"seq_len", x + "length"}, {"d_model", x + "d_model"}};
}

// This rank's rows of an input of the shape of X, checked for NaN and Inf.
std::vector<float> read_rows(const NpyInfo& info, const std::vector<int64_t>& pos, size_t elements) {
  std::vector<float> x(elements);
  read_npy_rows(info, rows_along(info.shape, int(info.shape.size()) - 2, pos), x.data());
  for (float v : x)
    if (!std::isfinite(v)) throw usage_error(info.label + " " + info.path + ": contains NaN or Inf");
  return x;
}

bool merge_to_safetensors(const std::string& path) {
  return path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
}

struct LayerInputs {
  std::vector<float> x, dy, target;
};

// The weights (or fresh LoRA factors) into the layer, and this rank's rows of the inputs.
LayerInputs load_layer_inputs(const LayerJob& job, LoraLayer& layer) {
  const LayerOptions& o = job.opt;
  if (job.weights) load_weights(*job.weights, layer);
  for (int p = 0; p < kProjections && o.lora_init; ++p)
    if (!job.weights->a[size_t(p)]) init_lora_factors(layer.projection(p), o.seed, lora_init_stream(p));
  LayerInputs in;
  const std::vector<int64_t>& pos = layer.positions();
  const size_t n = layer.activation_elements();
  if (job.x_info) in.x = read_rows(*job.x_info, pos, n);
  if (job.dy_info) in.dy = read_rows(*job.dy_info, pos, n);
  if (job.target_info) in.target = read_rows(*job.target_info, pos, n);
  return in;
}

// Training (printed as it goes), then the passes whose results are written, and the check. A
// failure here cannot be agreed on (a peer may be blocked in a transfer): it ends every rank.
struct LayerPasses {
  std::vector<float> y, dx;
  std::vector<std::vector<float>> merged = std::vector<std::vector<float>>(kProjections);
};

LayerPasses run_layer_passes(LaunchContext& ctx, const LayerJob& job, LoraLayer& layer, LayerInputs& in,
                             LayerResults& r) {
  comm::Communicator& comm = ctx.world;
  const LayerOptions& o = job.opt;
  AttentionBackend& backend = layer.backend();
  const size_t n = layer.activation_elements();
  MirroredFloats x_in(backend, in.x), dy_in(backend, in.dy);  // the host vectors themselves on the CPU
  x_in.upload();
  dy_in.upload();
  Stopwatch step_clock;
  auto print_step = [&](int step, double loss) {
    r.losses.push_back(loss);
    if (comm.rank() == 0) std::printf("%7d  %14.6e  %8.3f\n", step, loss, step_clock.seconds()), std::fflush(stdout);
    step_clock.restart();
  };
  LayerPasses out;
  try {
    const Stopwatch train_clock;
    if (o.demo) {
      DemoOptions d;
      d.steps = o.steps, d.optimizer = job.optimizer, d.seed = o.seed, d.teacher_change = o.demo_change;
      run_lora_demo(comm, layer, d, print_step, &r.forward, &r.backward);
    } else if (o.steps > 0) {
      LoraOptimizer optimizer(layer, job.optimizer);
      const LossKind kind = job.target_info ? LossKind::mse : LossKind::linear;
      for (int step = 1; step <= o.steps; ++step)
        print_step(step, train_step(comm, layer, optimizer, x_in.data(), kind,
                                    kind == LossKind::mse ? in.target.data() : in.dy.data(), out.y, &r.forward,
                                    &r.backward));
    }
    r.train_seconds = train_clock.seconds();
    if (!o.demo && (o.steps == 0 || !o.out.empty() || o.check)) {
      out.y.resize(n);
      MirroredFloats y_out(backend, out.y);
      r.forward = layer.forward(x_in.data(), y_out.data());
      y_out.download();
    }
    if (job.backward) {
      out.dx.resize(n);
      MirroredFloats dx_out(backend, out.dx);
      r.backward = layer.backward(x_in.data(), dy_in.data(), dx_out.data());
      dx_out.download();
    }
    if (o.check) r.check = check_layer(ctx, layer, in.x, job.backward ? &in.dy : nullptr, out.y, out.dx);
    if (!o.merge_out.empty() && !(r.check && !r.check->passed))
      for (int p = 0; p < kProjections; ++p) out.merged[size_t(p)] = layer.merged_rows(p);
  } catch (const std::exception& e) {
    fail_now(comm, e);
  }
  return out;
}

// Every output file of the job, all or nothing (collective).
void write_layer_outputs(comm::Communicator& comm, const LayerJob& job, LoraLayer& layer, LayerPasses& passes) {
  const LayerOptions& o = job.opt;
  const LayerConfig& c = layer.config();
  const std::vector<int64_t>& pos = layer.positions();
  LayerOutputs outputs(layer);
  if (!o.out.empty())
    outputs.add(o.out, "--out", job.x_info->shape,
                rows_along(job.x_info->shape, int(job.x_info->shape.size()) - 2, pos), passes.y);
  if (!o.grads.empty()) {
    outputs.add((std::filesystem::path(o.grads) / "dx.npy").string(), "--grads", job.x_info->shape,
                rows_along(job.x_info->shape, int(job.x_info->shape.size()) - 2, pos), passes.dx);
    for (int p = 0; p < kProjections; ++p)
      if (c.lora[size_t(p)]) outputs.add_factors(o.grads, "--grads", p, layer.lora_grad(p));
  }
  const bool merge_safetensors = merge_to_safetensors(o.merge_out);
  for (int p = 0; p < kProjections; ++p) {
    if (!o.save_lora.empty() && c.lora[size_t(p)])
      outputs.add_factors(o.save_lora, "--save-lora", p, layer.projection(p).lora());
    if (!o.merge_out.empty() && !merge_safetensors)
      outputs.add_merged(o.merge_out, p, std::move(passes.merged[size_t(p)]));
  }
  if (merge_safetensors) outputs.add_merged_safetensors(o.merge_out, o.weights_prefix, std::move(passes.merged));
  if (!o.save_adapter.empty()) outputs.add_adapter(o.save_adapter, o.weights_prefix);
  if (!outputs.empty())
    outputs.write(comm, {{o.grads, "--grads"},
                         {merge_safetensors ? "" : o.merge_out, "--merge-out"},
                         {o.save_lora, "--save-lora"},
                         {o.save_adapter, "--save-adapter"}});
}

}  // namespace

int run_layer(LaunchContext& ctx) {
  comm::Communicator& comm = ctx.world;
  const int rank = comm.rank();
  LayerOptions opts;
  const po::options_description desc = describe_layer_options(opts);
  const po::variables_map vm = parse_and_agree(comm, desc, ctx.args, "layer");
  if (vm.count("help")) {
    if (rank == 0)
      std::cout << "usage: ringattn layer [options]   (under mpirun -np P for P ranks)\n\n"
                   "The LoRA attention layer Y = Attn(rope(X Wq^T + bq), rope(X Wk^T + bk), X Wv^T + bv) Wo^T + bo\n"
                   "with W = W0 + (alpha / r) B A,\n"
                   "sequence-sharded activations and row-sharded parameters. Try: ringattn layer --demo --causal\n\n"
                << desc << "\n";
    return 0;
  }
  const ArgumentNames names(x_argument_names(opts));  // the shapes of --x are the file's
  LayerJob job;
  agreed_phase(comm, [&] { job = resolve_layer_job(opts, vm, ctx); });
  report_thread_binding(comm, job.config.threads, job.opt.threads > 0, ctx);
  comm.set_timeout(job.opt.timeout);

  // The session over the job's ranks runs the layer's attention and lends it the backend and the
  // transport (NCCL's setup is collective; a node short of GPUs is bad usage). The layer builds its
  // plan when made (collective).
  std::unique_ptr<Session> session;
  agreed_phase(comm, [&] { session = open_session(comm, job.context, ctx.seam); });
  std::unique_ptr<LoraLayer> layer;
  try {  // checked alike on every rank already; a failure now cannot be agreed on (a split may be in flight)
    layer = std::make_unique<LoraLayer>(*session, job.config, job.spec);
  } catch (const std::exception& e) {
    fail_now(comm, e);
  }
  agreed_phase(comm, [&] {
    if (rank == 0) dump_block_mask(job.opt.mask, layer->mask());
  });
  LayerInputs in;
  agreed_phase(comm, [&] { in = load_layer_inputs(job, *layer); });
  if (rank == 0) print_layer_header(job, *layer, comm.size());

  LayerResults r;
  LayerPasses passes = run_layer_passes(ctx, job, *layer, in, r);
  if (r.check && !r.check->passed) {
    if (rank == 0) {
      print_layer_check(*r.check);
      print_error("--check failed: the layer's results differ from the CPU's; outputs were not written");
    }
    return kExitCheckFailed;
  }
  write_layer_outputs(comm, job, *layer, passes);
  return report_layer(comm, job, *layer, r);
}

}  // namespace ringattn
