#include "launch/layer_job.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <utility>

#include "comm/stopwatch.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "launch/cpu_binding.hpp"
#include "launch/execution.hpp"
#include "launch/job_control.hpp"
#include "launch/job_util.hpp"
#include "launch/layer_outputs.hpp"
#include "launch/mask_options.hpp"
#include "launch/options_util.hpp"
#include "launch/summary.hpp"
#include "runtime/errors.hpp"
#include "runtime/lora/demo.hpp"
#include "runtime/lora/layer.hpp"
#include "runtime/lora/model_config.hpp"
#include "runtime/lora/training.hpp"
#include "runtime/lora/weights.hpp"
#include "runtime/ulysses_attention.hpp"
#include "runtime/io/npy.hpp"

namespace po = boost::program_options;

namespace ringattn {
namespace {

constexpr int kDemoSteps = 60;
constexpr double kDemoLr = 2e-2;
constexpr int64_t kDemoRank = 4;

struct Options : ExecutionOptions {
  std::string weights_prefix, adapter, save_adapter, config;
  std::string x, weights, out, dy, grads, merge_out, save_lora, target, json;
  int64_t heads = 8, kv_heads = 0, lora_rank = 0;
  double lora_alpha = 0.0;
  bool lora_init = false;
  double rope_theta = 0.0;
  bool rope_interleaved = false, rope_per_document = false;
  int64_t rope_dims = 0;
  uint64_t seed = 0;
  int steps = 0;
  double lr = 1e-3;
  std::string optimizer = "adamw";
  bool demo = false, check = false;
  int64_t seq_len = 1024, batch = 1, d_model = 128;
  double demo_change = 0.5;
  MaskOptions mask;
  int ulysses = 1;
};

// One option per line, as --help lists them.
// clang-format off
po::options_description describe(Options& o) {
  po::options_description inputs("Inputs");
  inputs.add_options()
      ("x", po::value(&o.x)->value_name("FILE.npy"), "X (B, L, d_model) or (L, d_model), float32")
      ("weights", po::value(&o.weights)->value_name("FILE|DIR"),
       "FILE.safetensors, a folder with model.safetensors(.index.json) (HF names, see --weights-prefix), or a "
       "DIR of wq.npy wk.npy wv.npy wo.npy (W0, nn.Linear layout), optional biases bq.npy bk.npy bv.npy bo.npy, "
       "and lora_{q,k,v,o}_{A,B}.npy (a projection with neither LoRA file has no adapter; one file without "
       "the other is an error)")
      ("weights-prefix", po::value(&o.weights_prefix)->value_name("PREFIX"),
       "safetensors checkpoints: the HF names PREFIX{q,k,v,o}_proj.weight (.bias), "
       "e.g. model.layers.0.self_attn.")
      ("adapter", po::value(&o.adapter)->value_name("DIR"),
       "a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors), in place of --lora-rank, "
       "--lora-alpha and lora_*.npy")
      ("config", po::value(&o.config)->value_name("FILE"),
       "an HF config.json: heads, kv heads, head_dim, rope_theta (and llama3 rope scaling), attention_bias; "
       "a flag that contradicts it is an error")
      ("heads", po::value(&o.heads)->default_value(8)->value_name("H"), "query heads; head dim D = d_model / H")
      ("kv-heads", po::value(&o.kv_heads)->default_value(0)->value_name("HKV"),
       "key/value heads, dividing H (0 = H)")
      ("lora-rank", po::value(&o.lora_rank)->default_value(0)->value_name("R"),
       "rank r of the LoRA factors (0 = as in the files; the demo: 4)")
      ("lora-alpha", po::value(&o.lora_alpha)->default_value(0.0)->value_name("A"),
       "scaling alpha / r, PEFT's lora_alpha (0 = r, scaling 1)")
      ("lora-init", po::bool_switch(&o.lora_init),
       "projections without LoRA files get fresh factors of rank --lora-rank (B = 0, A from --seed)")
      ("seed", po::value(&o.seed)->default_value(0)->value_name("S"), "seed of --lora-init, the demo and BigBird masks");
  po::options_description rope("Rotary position embeddings of q and k (none without --rope-theta)");
  rope.add_options()
      ("rope-theta", po::value(&o.rope_theta)->value_name("T"),
       "base T: plane i of a head turns by position * T^(-2i/rd) (HF Llama rotate_half pairing)")
      ("rope-interleaved", po::bool_switch(&o.rope_interleaved), "GPT-J pairing: planes (2i, 2i+1)")
      ("rope-dims", po::value(&o.rope_dims)->value_name("N"), "rotate only the first N dims of each head (rd = N)")
      ("rope-per-document", po::bool_switch(&o.rope_per_document),
       "positions restart at 0 in each document of --doc-lens (packed sequences)");
  po::options_description outputs("Outputs and backward");
  outputs.add_options()
      ("out", po::value(&o.out)->value_name("FILE.npy"), "write Y (shape of X); after --steps, the trained layer's")
      ("dy", po::value(&o.dy)->value_name("FILE.npy"),
       "run backward with this dY (shape of X); with --steps, the loss is sum(Y * dY)")
      ("grads", po::value(&o.grads)->value_name("DIR"),
       "write lora_<p>_A.npy, lora_<p>_B.npy (summed over sequence and batch) and dx.npy (needs --dy)")
      ("merge-out", po::value(&o.merge_out)->value_name("DIR|FILE.safetensors"),
       "write merged weights W0 + (alpha / r) B A (after --steps, the trained ones) and the biases: "
       "wq.npy ... bq.npy ... in DIR, or the HF names under --weights-prefix in FILE.safetensors")
      ("save-adapter", po::value(&o.save_adapter)->value_name("DIR"),
       "write the LoRA factors as a PEFT adapter (adapter_config.json, adapter_model.safetensors) "
       "that peft.PeftModel.from_pretrained loads (after --steps, the trained ones)")
      ("save-lora", po::value(&o.save_lora)->value_name("DIR"),
       "write the LoRA factors lora_<p>_A.npy, lora_<p>_B.npy (after --steps, the trained ones)");
  po::options_description training("Training (updates A and B; W0 stays frozen)");
  training.add_options()
      ("steps", po::value(&o.steps)->default_value(0)->value_name("N"), "training steps (the demo: 60)")
      ("lr", po::value(&o.lr)->default_value(1e-3)->value_name("X"), "learning rate (the demo: 0.02)")
      ("optimizer", po::value(&o.optimizer)->default_value("adamw")->value_name("sgd|adamw"),
       "adamw: PyTorch's AdamW defaults, betas 0.9 0.999, eps 1e-8, weight decay 0.01")
      ("target", po::value(&o.target)->value_name("FILE.npy"),
       "train to this Y (shape of X): loss = mean squared error over all elements");
  po::options_description demo("Demo: a student's LoRA factors recover a teacher's hidden low-rank change");
  demo.add_options()
      ("demo", po::bool_switch(&o.demo), "run the demo on random sequences (no files needed)")
      ("seq-len", po::value(&o.seq_len)->default_value(1024)->value_name("L"), "demo: sequence length")
      ("batch", po::value(&o.batch)->default_value(1)->value_name("B"), "demo: batch")
      ("d-model", po::value(&o.d_model)->default_value(128)->value_name("D"), "demo: model width")
      ("demo-change", po::value(&o.demo_change)->default_value(0.5)->value_name("F"),
       "demo: norm of the teacher's change relative to W0");
  po::options_description masks("Masks (combined by intersection)");
  add_mask_options(masks, o.mask);
  po::options_description run("Execution");
  RingOptionFields fields = o.fields();  // untimed, on real links
  fields.emulate_bandwidth = fields.emulate_latency = nullptr;
  fields.iters = fields.warmup = nullptr;
  add_ring_options(run, fields);
  add_hybrid_options(run, &o.ulysses, nullptr, nullptr);
  run.add_options()
      ("check", po::bool_switch(&o.check),
       "run the pass again on the CPU backend in fp32 and compare Y (and dX and the LoRA gradients with --dy); "
       "exit 3 and write nothing when they differ")
      ("json", po::value(&o.json)->value_name("FILE"), "write a JSON summary (rank 0)");
  po::options_description all("ringattn layer options");
  all.add_options()("help,h", "show this help");
  all.add(inputs).add(rope).add(outputs).add(training).add(demo).add(masks).add(run);
  return all;
}
// clang-format on

struct LayerJob {
  Options opt;
  LayerConfig config;
  LayoutKind layout = LayoutKind::contiguous;
  OptimizerOptions optimizer;
  std::optional<NpyInfo> x_info, dy_info, target_info;
  std::optional<WeightFiles> weights;
  ExecutionChoice execution;  // backend and communicator
  bool backward = false;  // one backward pass with --dy (not training)
};

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t;
  for (int64_t v : s) t += (t.empty() ? "(" : ", ") + std::to_string(v);
  return t + ")";
}

// An input of the shape of X, or a UsageError naming the option.
NpyInfo inspect_like_x(const std::string& path, const std::string& label, const NpyInfo& x) {
  NpyInfo info = inspect_npy(path, label);
  if (info.shape != x.shape)
    throw UsageError(label + " " + path + ": shape " + shape_text(info.shape) + " but --x has " + shape_text(x.shape));
  return info;
}

// --config: the model's values, unless a flag says otherwise, which is an error when they differ.
void apply_model_config(const ModelConfig& m, const po::variables_map& vm, Options& o) {
  auto take = [&](const char* flag, auto& value, auto from_config, const char* key) {
    if (given(vm, flag) && value != from_config) {
      std::ostringstream msg;
      msg << "--" << flag << " " << value << " contradicts --config " << m.path << " (" << key << " " << from_config
          << ")";
      throw UsageError(msg.str());
    }
    value = from_config;
  };
  if (m.heads) take("heads", o.heads, *m.heads, "num_attention_heads");
  if (m.kv_heads) take("kv-heads", o.kv_heads, *m.kv_heads, "num_key_value_heads");
  take("rope-theta", o.rope_theta, m.rope.theta, "rope_theta");
  if (m.rope.dims) take("rope-dims", o.rope_dims, m.rope.dims, "partial_rotary_factor x head_dim");
}

// The config's sizes against the input's: hidden_size is d_model, head_dim is d_model / heads.
void check_model_config(const ModelConfig& m, const LayerConfig& c) {
  const std::string where = "--config " + m.path + ": ";
  if (m.hidden_size && *m.hidden_size != c.d_model)
    throw UsageError(where + "hidden_size " + std::to_string(*m.hidden_size) + " but d_model of the input is " +
                     std::to_string(c.d_model));
  if (m.head_dim && *m.head_dim != c.head_dim())
    throw UsageError(where + "head_dim " + std::to_string(*m.head_dim) + " but d_model / heads is " +
                     std::to_string(c.head_dim()) + " (the layer has D = d_model / H)");
  if (m.attention_bias && *m.attention_bias)
    for (int p = 0; p < kProjections; ++p)
      if (!c.bias[size_t(p)])
        throw UsageError(where + "attention_bias is true, but --weights has no bias for " + hf_module_name(p));
}

LayerJob resolve(const Options& given_options, const po::variables_map& vm, const LaunchContext& ctx) {
  LayerJob job;
  Options o = given_options;
  std::optional<ModelConfig> model;
  if (!o.config.empty()) {
    model = read_model_config(o.config);
    apply_model_config(*model, vm, o);
  }
  job.opt = o;
  LayerConfig& c = job.config;
  c.heads = o.heads;
  c.kv_heads = o.kv_heads ? o.kv_heads : o.heads;
  c.lora_rank = o.lora_rank;
  if (o.demo) {
    for (const char* name : {"x", "weights", "dy", "target", "out", "grads", "lora-init", "adapter", "weights-prefix"})
      if (given(vm, name))
        throw UsageError(std::string("--") + name + " has no place in --demo (its inputs are random)");
    c.batch = o.batch, c.seq_len = o.seq_len, c.d_model = o.d_model;
    if (c.lora_rank == 0) c.lora_rank = kDemoRank;
    c.lora.fill(true);
    job.opt.steps = given(vm, "steps") ? o.steps : kDemoSteps;
    job.opt.lr = given(vm, "lr") ? o.lr : kDemoLr;
    if (!(o.demo_change > 0) || !std::isfinite(o.demo_change)) throw UsageError("--demo-change must be positive");
    if (o.check) throw UsageError("--check compares a pass of --x with the CPU's; the demo's loss curve checks itself");
  } else {
    for (const char* name : {"seq-len", "batch", "d-model", "demo-change"})
      if (given(vm, name))
        throw UsageError(std::string("--") + name + " describes the demo; with --x the shapes come from the files");
    if (o.x.empty()) throw UsageError("--x is required (or run the --demo)");
    if (o.weights.empty()) throw UsageError("--weights is required with --x");
    job.x_info = inspect_npy(o.x, "--x");
    const std::vector<int64_t>& xs = job.x_info->shape;
    if (xs.size() != 2 && xs.size() != 3)
      throw UsageError("--x " + o.x + ": expected a (B, L, d_model) or (L, d_model) array, got shape " +
                       shape_text(xs));
    c.batch = xs.size() == 3 ? xs[0] : 1;
    c.seq_len = xs[xs.size() - 2];
    c.d_model = xs.back();
    c.validate(false);  // heads against d_model, before the weights' shapes are read with them
    if (!o.adapter.empty() && given(vm, "lora-alpha"))
      throw UsageError("--lora-alpha: --adapter " + o.adapter + " gives lora_alpha (adapter_config.json)");
    job.weights = inspect_weights({o.weights, o.weights_prefix, o.adapter}, c.d_model, c.heads, c.kv_heads,
                                  o.lora_rank);
    c.lora = job.weights->lora();
    c.bias = job.weights->biases();
    if (c.lora_rank == 0) c.lora_rank = job.weights->lora_rank();
    if (job.weights->from_adapter) c.lora_alpha = job.weights->adapter_alpha, c.rslora = job.weights->adapter_rslora;
    if (o.lora_init) {
      if (c.lora_rank == 0) throw UsageError("--lora-init needs --lora-rank R (the rank of the new factors)");
      c.lora.fill(true);
    }
    if (!o.dy.empty()) job.dy_info = inspect_like_x(o.dy, "--dy", *job.x_info);
    if (!o.target.empty()) job.target_info = inspect_like_x(o.target, "--target", *job.x_info);
    if (o.steps > 0 && !job.dy_info && !job.target_info)
      throw UsageError("--steps needs a loss: --target FILE (mean squared error) or --dy FILE (loss sum(Y * dY))");
    if (job.target_info && job.dy_info) throw UsageError("--target and --dy are two losses: give one");
    if (job.target_info && o.steps == 0) throw UsageError("--target is what training aims at: it needs --steps N");
    if (!o.grads.empty() && !job.dy_info) throw UsageError("--grads needs --dy (the gradient of the output)");
    if (!o.grads.empty() && o.steps > 0)
      throw UsageError(
          "--grads writes the gradients of one pass; after --steps, write the trained factors with --save-lora");
    job.backward = job.dy_info && o.steps == 0;
    if (!o.save_adapter.empty() && !c.lora[0] && !c.lora[1] && !c.lora[2] && !c.lora[3])
      throw UsageError("--save-adapter: the layer has no LoRA factors to save");
  }
  if (!(job.weights && job.weights->from_adapter)) c.lora_alpha = o.lora_alpha != 0.0 ? o.lora_alpha : double(c.lora_rank);
  c.rope.theta = o.rope_theta;
  c.rope.interleaved = o.rope_interleaved;
  c.rope.dims = o.rope_dims;
  c.rope.per_document = o.rope_per_document;
  if (model) {
    c.rope.llama3_factor = model->rope.llama3_factor;
    c.rope.llama3_low_freq_factor = model->rope.llama3_low_freq_factor;
    c.rope.llama3_high_freq_factor = model->rope.llama3_high_freq_factor;
    c.rope.llama3_original_max_positions = model->rope.llama3_original_max_positions;
    check_model_config(*model, c);
  }
  if (o.rope_per_document && o.mask.doc_lens.empty())
    throw UsageError("--rope-per-document needs documents: --doc-lens");
  bool any_lora = false;
  for (bool on : c.lora) any_lora = any_lora || on;
  if (job.opt.steps > 0 && !any_lora)
    throw UsageError("--steps: --weights " + o.weights + " has no LoRA factors to train (add lora_<p>_A/B.npy, or " +
                     "--lora-init --lora-rank R)");
  if (o.steps < 0) throw UsageError("--steps must not be negative");
  if (!(job.opt.lr > 0) || !std::isfinite(job.opt.lr)) throw UsageError("--lr must be a positive number");
  job.optimizer.kind = parse_optimizer(o.optimizer);
  job.optimizer.lr = job.opt.lr;
  check_execution_options(o);
  c.dtype = parse_dtype_option(o.dtype);
  c.schedule = parse_schedule(o.schedule);
  c.threads = o.threads ? o.threads : ctx.default_threads();
  job.layout = layout_option(o.layout, o.mask.causal);
  c.validate(false);
  job.execution = choose_execution(o.backend, o.comm, c.head_dim(), ctx);
  c.validate(job.execution.backend == "cpu" || o.check);  // (--check runs the CPU kernels too)
  check_ulysses(o.ulysses, ctx.world.size(), c.heads, c.kv_heads);
  if (c.seq_len < ctx.world.size())
    throw UsageError("sequence length " + std::to_string(c.seq_len) + " is smaller than the number of ranks " +
                     std::to_string(ctx.world.size()));
  return job;
}

// This rank's rows of an input of the shape of X, checked for NaN and Inf.
std::vector<float> read_rows(const NpyInfo& info, const std::vector<int64_t>& pos, size_t elements) {
  std::vector<float> x(elements);
  read_npy_rows(info, rows_along(info.shape, int(info.shape.size()) - 2, pos), x.data());
  for (float v : x)
    if (!std::isfinite(v)) throw UsageError(info.label + " " + info.path + ": contains NaN or Inf");
  return x;
}

bool merge_to_safetensors(const std::string& path) {
  return path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
}

double max_over_ranks(comm::Communicator& comm, double v) {
  comm.allreduce(&v, 1, comm::DataType::f64, comm::ReduceOp::max);
  return v;
}

// --check: the same pass again on the CPU backend in fp32 (a second layer over its own context,
// holding this layer's parameters), and how far apart the results are: per tensor, the largest
// difference over all ranks relative to the largest value of the CPU's result.
struct LayerCheck {
  struct Compared {
    const char* what;
    double max_abs_err, scale;
    double relative() const { return max_abs_err / std::max(scale, 1e-30); }
  };
  std::vector<Compared> tensors;
  double tolerance = 0.0;
  bool passed = true;

  double max_abs_err() const {
    double e = 0.0;
    for (const Compared& t : tensors) e = std::max(e, t.max_abs_err);
    return e;
  }
  double max_relative() const {
    double e = 0.0;
    for (const Compared& t : tensors) e = std::max(e, t.relative());
    return e;
  }
  std::string describe() const {
    std::ostringstream s;
    s.precision(2);
    for (const Compared& t : tensors) s << t.what << " " << std::scientific << t.relative() << ", ";
    s << "largest error / largest value (tolerance " << tolerance << ")";
    return s.str();
  }
};

// fp32 against fp32 differs by summation order (GEMMs, the attention's tiles); bf16 GEMM operands
// and ring storage round to 8 bits of mantissa.
constexpr double kCheckToleranceFp32 = 1e-4, kCheckToleranceBf16 = 3e-2;

LayerCheck check_layer(const LaunchContext& ctx, LoraLayer& layer, const LayerConfig& c, const ShardLayout& layout,
                       const Mask& mask, std::vector<float>& x, std::vector<float>* dy, const std::vector<float>& y,
                       const std::vector<float>& dx) {
  comm::Communicator& comm = ctx.world;
  ContextOptions options;
  options.backend = "cpu";
  options.comm = "mpi";
  options.threads = c.threads;
  options.timeout_s = comm.timeout();
  const std::unique_ptr<Context> cpu = open_context(ctx.world, options);
  LayerConfig fp32 = c;
  fp32.dtype = DType::f32;
  LoraLayer reference(*cpu, fp32, layout, mask);
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
    comm.allreduce(e, 2, comm::DataType::f64, comm::ReduceOp::max);
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

}  // namespace

int run_layer(LaunchContext& ctx) {
  comm::Communicator& comm = ctx.world;
  const int P = comm.size(), rank = comm.rank();
  Options opts;
  const po::options_description desc = describe(opts);
  LayerJob job;
  // Parse, agree, then validate: each its own agreed phase.
  const po::variables_map vm = parse_and_agree(comm, desc, ctx.args, "layer");
  const bool help = vm.count("help") > 0;
  if (!help) agreed_phase(comm, [&] { job = resolve(opts, vm, ctx); });
  if (help) {
    if (rank == 0)
      std::cout << "usage: ringattn layer [options]   (under mpirun -np P for P ranks)\n\n"
                   "The LoRA attention layer Y = Attn(rope(X Wq^T + bq), rope(X Wk^T + bk), X Wv^T + bv) Wo^T + bo\n"
                   "with W = W0 + (alpha / r) B A,\n"
                   "sequence-sharded activations and row-sharded parameters. Try: ringattn layer --demo --causal\n\n"
                << desc << "\n";
    return 0;
  }
  report_thread_binding(comm, job.config.threads, job.opt.threads > 0, ctx);
  const Options& o = job.opt;
  const LayerConfig& c = job.config;
  std::optional<ShardLayout> layout_storage;
  Mask mask;
  agreed_phase(comm, [&] {
    // The rows the context gives: with --ulysses U > 1 (collective) its groups are U ranks of a node
    // where the nodes allow, as the library's hybrid places them.
    layout_storage.emplace(hybrid_layout(comm, job.layout, c.seq_len, o.ulysses));
    mask = build_mask(o.mask, c.seq_len, o.seed);
    if (rank == 0) dump_block_mask(o.mask, mask);
  });
  const ShardLayout& layout = *layout_storage;
  comm.set_timeout(o.timeout);
  // Where the layer computes: the library's context over the job's ranks runs its attention and
  // lends it the backend and the communicator (NCCL setup is collective; a node short of GPUs is
  // a usage error).
  std::unique_ptr<Context> api;
  agreed_phase(comm, [&] { api = open_context(ctx.world, context_options(job.execution, o, c.threads)); });
  std::unique_ptr<LoraLayer> layer;
  try {
    layer = std::make_unique<LoraLayer>(*api, c, layout, mask);
  } catch (const std::exception& e) {
    fail_now(comm, e);
  }
  AttentionBackend& backend = layer->backend();
  const std::vector<int64_t>& pos = layer->positions();
  const size_t n = layer->activation_elements();
  std::vector<float> x, dy, target;
  agreed_phase(comm, [&] {
    if (job.weights) load_weights(*job.weights, *layer);
    for (int p = 0; p < kProjections && o.lora_init; ++p)
      if (!job.weights->a[size_t(p)]) init_lora_factors(layer->projection(p), o.seed, lora_init_stream(p));
    if (job.x_info) x = read_rows(*job.x_info, pos, n);
    if (job.dy_info) dy = read_rows(*job.dy_info, pos, n);
    if (job.target_info) target = read_rows(*job.target_info, pos, n);
  });
  // The inputs in the backend's memory (the host vectors themselves on the CPU).
  MirroredFloats x_in(backend, x), dy_in(backend, dy);
  x_in.upload();
  dy_in.upload();

  // Training (printed as it goes), then the passes whose results are written.
  const bool demo = o.demo;
  std::vector<double> losses;
  double train_seconds = 0.0;
  comm::Stopwatch step_clock;
  auto print_step = [&](int step, double loss) {
    losses.push_back(loss);
    if (rank == 0) std::printf("%7d  %14.6e  %8.3f\n", step, loss, step_clock.seconds()), std::fflush(stdout);
    step_clock.restart();
  };
  if (rank == 0) {
    std::printf("ringattn layer  %d rank%s x %d thread%s  backend %s (%s)  comm %s\n", P, P > 1 ? "s" : "", c.threads,
                c.threads > 1 ? "s" : "", backend.name(),
                job.execution.backend == "cpu" ? kernels::cpu_isa() : "device", job.execution.comm.c_str());
    std::printf("  shape     batch %lld  seq_len %lld  d_model %lld  heads %lld (kv %lld)  head_dim %lld  %s\n",
                (long long)c.batch, (long long)c.seq_len, (long long)c.d_model, (long long)c.heads,
                (long long)c.kv_heads, (long long)c.head_dim(), dtype_name(c.dtype));
    std::string on;
    for (int p = 0; p < kProjections; ++p)
      if (c.lora[size_t(p)]) on += std::string(on.empty() ? "" : ",") + projection_name(p);
    std::printf("  lora      r %lld  alpha %g (scaling %g)  on %s\n", (long long)c.lora_rank, c.lora_alpha,
                double(c.scaling()), on.empty() ? "none" : on.c_str());
    std::printf("  mask      %s   layout %s   schedule %s\n", mask.describe().c_str(), layout_name(job.layout),
                schedule_name(c.schedule));
    std::string biased;
    for (int p = 0; p < kProjections; ++p)
      if (c.bias[size_t(p)]) biased += std::string(biased.empty() ? "" : ",") + projection_name(p);
    if (c.rope.enabled())
      std::printf("  rope      theta %g  %s  dims %lld of %lld%s\n", c.rope.theta,
                  c.rope.interleaved ? "interleaved (GPT-J)" : "rotate_half (Llama)",
                  (long long)c.rope.rotary_dims(c.head_dim()), (long long)c.head_dim(),
                  c.rope.per_document ? "  positions per document" : "");
    if (!biased.empty()) std::printf("  bias      on %s\n", biased.c_str());
    if (o.steps > 0) {
      std::printf("# training: %d steps, %s lr %g%s, loss %s\n", o.steps, optimizer_name(job.optimizer.kind), o.lr,
                  job.optimizer.kind == OptimizerKind::adamw ? " (betas 0.9,0.999 eps 1e-8 weight_decay 0.01)" : "",
                  demo              ? "MSE against the teacher's output"
                  : job.target_info ? "MSE against --target"
                                    : "sum(Y * dY)");
      if (demo)
        std::printf(
            "# demo: the student starts at W0 (B = 0) and learns the teacher's hidden rank-%lld change "
            "(%g of |W0|) on fresh random sequences\n",
            (long long)c.lora_rank, o.demo_change);
      std::printf("#  step            loss   seconds\n");
    }
    std::fflush(stdout);
  }
  std::vector<float> y, dx;
  LayerPassStats fwd, bwd;
  std::vector<std::vector<float>> merged(kProjections);
  std::optional<LayerCheck> check;
  try {
    const comm::Stopwatch train_clock;
    if (demo) {
      DemoOptions d;
      d.steps = o.steps, d.optimizer = job.optimizer, d.seed = o.seed, d.teacher_change = o.demo_change;
      run_lora_demo(comm, *layer, d, print_step, &fwd, &bwd);
    } else if (o.steps > 0) {
      LoraOptimizer optimizer(*layer, job.optimizer);
      const LossKind kind = job.target_info ? LossKind::mse : LossKind::linear;
      for (int step = 1; step <= o.steps; ++step)
        print_step(step, train_step(comm, *layer, optimizer, x_in.data(), kind,
                                    kind == LossKind::mse ? target.data() : dy.data(), y, &fwd, &bwd));
    }
    train_seconds = train_clock.seconds();
    if (!demo && (o.steps == 0 || !o.out.empty() || o.check)) {
      y.resize(n);
      MirroredFloats y_out(backend, y);
      fwd = layer->forward(x_in.data(), y_out.data());
      y_out.download();
    }
    if (job.backward) {
      dx.resize(n);
      MirroredFloats dx_out(backend, dx);
      bwd = layer->backward(x_in.data(), dy_in.data(), dx_out.data());
      dx_out.download();
    }
    if (o.check) check = check_layer(ctx, *layer, c, layout, mask, x, job.backward ? &dy : nullptr, y, dx);
    if (!o.merge_out.empty() && !(check && !check->passed))
      for (int p = 0; p < kProjections; ++p) merged[size_t(p)] = layer->merged_rows(p);
  } catch (const std::exception& e) {
    fail_now(comm, e);  // a peer may be blocked in a transfer: end every rank now
  }
  auto print_check = [&] {
    std::printf("  check     %s against the CPU backend in fp32: %s\n", check->passed ? "passed" : "FAILED",
                check->describe().c_str());
    std::fflush(stdout);
  };
  if (check && !check->passed) {
    if (rank == 0) {
      print_check();
      print_error("--check failed: the layer's results differ from the CPU's; outputs were not written");
    }
    return kExitCheckFailed;
  }

  LayerOutputs outputs(*layer);
  if (!o.out.empty())
    outputs.add(o.out, "--out", job.x_info->shape,
                rows_along(job.x_info->shape, int(job.x_info->shape.size()) - 2, pos), y);
  if (!o.grads.empty()) {
    outputs.add((std::filesystem::path(o.grads) / "dx.npy").string(), "--grads", job.x_info->shape,
                rows_along(job.x_info->shape, int(job.x_info->shape.size()) - 2, pos), dx);
    for (int p = 0; p < kProjections; ++p)
      if (c.lora[size_t(p)]) outputs.add_factors(o.grads, "--grads", p, layer->lora_grad(p));
  }
  const bool merge_safetensors = merge_to_safetensors(o.merge_out);
  for (int p = 0; p < kProjections; ++p) {
    if (!o.save_lora.empty() && c.lora[size_t(p)])
      outputs.add_factors(o.save_lora, "--save-lora", p, layer->projection(p).lora());
    if (!o.merge_out.empty() && !merge_safetensors) outputs.add_merged(o.merge_out, p, std::move(merged[size_t(p)]));
  }
  if (merge_safetensors) outputs.add_merged_safetensors(o.merge_out, o.weights_prefix, std::move(merged));
  if (!o.save_adapter.empty()) outputs.add_adapter(o.save_adapter, o.weights_prefix);
  if (!outputs.empty())
    outputs.write(comm, {{o.grads, "--grads"},
                         {merge_safetensors ? "" : o.merge_out, "--merge-out"},
                         {o.save_lora, "--save-lora"},
                         {o.save_adapter, "--save-adapter"}});

  // Summary: times are the slowest rank's, memory the largest.
  const double fwd_s = max_over_ranks(comm, fwd.seconds), bwd_s = max_over_ranks(comm, bwd.seconds);
  const double gather_wait = max_over_ranks(comm, fwd.gather_wait_seconds + bwd.gather_wait_seconds);
  const double shard = max_over_ranks(comm, double(layer->shard_bytes()));
  const double gathered = max_over_ranks(comm, double(layer->peak_gathered_bytes()));
  const double rss = max_over_ranks(comm, double(peak_rss_bytes()));
  int64_t pairs = count_visible_pairs(mask.view(), layout.runs(rank), c.seq_len);
  comm.allreduce(&pairs, 1, comm::DataType::i64, comm::ReduceOp::sum);
  const double flops = 4.0 * double(c.batch * c.heads * c.head_dim()) * double(pairs);
  double proj_flops = layer->projection_flops_forward();
  comm.allreduce(&proj_flops, 1, comm::DataType::f64, comm::ReduceOp::sum);
  const bool ran_backward = job.backward || o.steps > 0;
  // The attention's K/V traffic (forward) and the share of the forward spent waiting for data
  // (K/V or parameters), averaged over ranks.
  uint64_t kv_sent = fwd.attention.bytes_sent, kv_needed = fwd.attention.bytes_needed;
  comm.allreduce(&kv_sent, 1, comm::DataType::i64, comm::ReduceOp::sum);
  comm.allreduce(&kv_needed, 1, comm::DataType::i64, comm::ReduceOp::sum);
  double exposed = fwd.seconds > 0 ? (fwd.attention.wait_seconds + fwd.gather_wait_seconds) / fwd.seconds : 0.0;
  comm.allreduce(&exposed, 1, comm::DataType::f64, comm::ReduceOp::sum);
  if (rank != 0) return kExitOk;

  if (!losses.empty())
    std::printf("  loss      %.4e -> %.4e (%.1fx lower) in %d steps, %.2f s\n", losses.front(), losses.back(),
                losses.front() / std::max(losses.back(), 1e-300), int(losses.size()), train_seconds);
  if (fwd_s > 0)
    std::printf("  forward   %.4f s  (attention %.4f, projections %.4f, exposed gathers %.4f)\n", fwd_s,
                fwd.attention_seconds, fwd.projection_seconds, fwd.gather_wait_seconds);
  if (ran_backward && bwd_s > 0)
    std::printf("  backward  %.4f s  (attention %.4f, projections %.4f, exposed gathers %.4f, reduce %.4f)\n", bwd_s,
                bwd.attention_seconds, bwd.projection_seconds, bwd.gather_wait_seconds, bwd.reduce_seconds);
  std::printf("  params    %s in all; per rank %s held, at most %s gathered\n",
              human_bytes(double(layer->full_parameter_bytes())).c_str(), human_bytes(shard).c_str(),
              human_bytes(gathered).c_str());
  std::printf("  memory    peak %s per rank (max)\n", human_bytes(rss).c_str());
  if (check) print_check();
  std::fflush(stdout);
  if (o.json.empty()) return kExitOk;
  RunSummary summary;
  summary.ranks = P, summary.batch = c.batch, summary.seq_len = c.seq_len, summary.heads = c.heads;
  summary.kv_heads = c.kv_heads, summary.head_dim = c.head_dim(), summary.mask = mask.describe();
  summary.layout = layout_name(job.layout), summary.schedule = schedule_name(c.schedule);
  summary.dtype = dtype_name(c.dtype), summary.backend = backend.name(), summary.comm = job.execution.comm;
  summary.threads = c.threads, summary.forward_s = fwd_s, summary.flops_forward = flops;
  if (ran_backward) summary.backward_s = bwd_s;
  summary.gflops_per_rank = rate_per_rank(flops + proj_flops, fwd_s, P);  // the whole layer's work
  summary.comm_bytes_sent = kv_sent, summary.comm_bytes_needed = kv_needed;
  summary.exposed_comm_fraction = exposed / P, summary.peak_rss_bytes = uint64_t(rss);
  summary.nodes = ctx.nodes;
  if (check) summary.max_abs_err = check->max_abs_err();
  Json j = summary_json(summary);  // then what only the layer reports
  j["d_model"] = c.d_model;
  j["lora_rank"] = c.lora_rank;
  j["lora_alpha"] = c.lora_alpha;
  j["projection_flops_forward"] = proj_flops;
  j["gather_wait_s"] = gather_wait;
  j["parameter_bytes"] = double(layer->full_parameter_bytes());
  j["parameter_bytes_per_rank"] = shard;
  j["peak_gathered_bytes"] = gathered;
  if (check) {
    j["check_passed"] = check->passed;
    j["check_max_relative_err"] = check->max_relative();
  }
  if (!losses.empty()) {
    j["steps"] = int(losses.size());
    j["optimizer"] = optimizer_name(job.optimizer.kind);
    j["lr"] = o.lr;
    Json l = Json::array();
    for (double v : losses) l.push_back(v);
    j["losses"] = l;
  }
  try {
    write_text_file(o.json, "--json", j.dump() + "\n");
  } catch (const std::exception& e) {
    print_error(e.what());
    return exit_code_of(e);
  }
  return kExitOk;
}

}  // namespace ringattn
