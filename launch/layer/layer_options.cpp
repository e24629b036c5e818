#include "launch/layer/layer_options.hpp"

#include <cmath>
#include <sstream>

#include "launch/cli/execution.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/errors.hpp"
#include "runtime/lora/model_config.hpp"
#include "util/format.hpp"

namespace po = boost::program_options;

namespace ringattn {

// One option per line, as --help lists them.
// clang-format off
po::options_description describe_layer_options(LayerOptions& o) {
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


namespace {

// An input of the shape of X, or a ArgumentError naming the option.
NpyInfo inspect_like_x(const std::string& path, const std::string& label, const NpyInfo& x) {
  NpyInfo info = inspect_npy(path, label);
  if (info.shape != x.shape)
    throw usage_error(label + " " + path + ": shape " + format_shape(info.shape) + " but --x has " + format_shape(x.shape));
  return info;
}

// --config: the model's values, unless a flag says otherwise, which is an error when they differ.
void apply_model_config(const ModelConfig& m, const po::variables_map& vm, LayerOptions& o) {
  auto take = [&](const char* flag, auto& value, auto from_config, const char* key) {
    if (given(vm, flag) && value != from_config) {
      std::ostringstream msg;
      msg << "--" << flag << " " << value << " contradicts --config " << m.path << " (" << key << " " << from_config
          << ")";
      throw usage_error(msg.str());
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
    throw usage_error(where + "hidden_size " + std::to_string(*m.hidden_size) + " but d_model of the input is " +
                     std::to_string(c.d_model));
  if (m.head_dim && *m.head_dim != c.head_dim())
    throw usage_error(where + "head_dim " + std::to_string(*m.head_dim) + " but d_model / heads is " +
                     std::to_string(c.head_dim()) + " (the layer has D = d_model / H)");
  if (m.attention_bias && *m.attention_bias)
    for (int p = 0; p < kProjections; ++p)
      if (!c.bias[size_t(p)])
        throw usage_error(where + "attention_bias is true, but --weights has no bias for " + hf_module_name(p));
}

}  // namespace

LayerJob resolve_layer_job(const LayerOptions& given_options, const po::variables_map& vm, const LaunchContext& ctx) {
  LayerJob job;
  LayerOptions o = given_options;
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
        throw usage_error(std::string("--") + name + " has no place in --demo (its inputs are random)");
    c.batch = o.batch, c.seq_len = o.seq_len, c.d_model = o.d_model;
    if (c.lora_rank == 0) c.lora_rank = kDemoRank;
    c.lora.fill(true);
    job.opt.steps = given(vm, "steps") ? o.steps : kDemoSteps;
    job.opt.lr = given(vm, "lr") ? o.lr : kDemoLr;
    if (!(o.demo_change > 0) || !std::isfinite(o.demo_change)) throw usage_error("--demo-change must be positive");
    if (o.check) throw usage_error("--check compares a pass of --x with the CPU's; the demo's loss curve checks itself");
  } else {
    for (const char* name : {"seq-len", "batch", "d-model", "demo-change"})
      if (given(vm, name))
        throw usage_error(std::string("--") + name + " describes the demo; with --x the shapes come from the files");
    if (o.x.empty()) throw usage_error("--x is required (or run the --demo)");
    if (o.weights.empty()) throw usage_error("--weights is required with --x");
    job.x_info = inspect_npy(o.x, "--x");
    const std::vector<int64_t>& xs = job.x_info->shape;
    if (xs.size() != 2 && xs.size() != 3)
      throw usage_error("--x " + o.x + ": expected a (B, L, d_model) or (L, d_model) array, got shape " +
                       format_shape(xs));
    c.batch = xs.size() == 3 ? xs[0] : 1;
    c.seq_len = xs[xs.size() - 2];
    c.d_model = xs.back();
    c.validate(false);  // heads against d_model, before the weights' shapes are read with them
    if (!o.adapter.empty() && given(vm, "lora-alpha"))
      throw usage_error("--lora-alpha: --adapter " + o.adapter + " gives lora_alpha (adapter_config.json)");
    job.weights = inspect_weights({o.weights, o.weights_prefix, o.adapter}, c.d_model, c.heads, c.kv_heads,
                                  o.lora_rank);
    c.lora = job.weights->lora();
    c.bias = job.weights->biases();
    if (c.lora_rank == 0) c.lora_rank = job.weights->lora_rank();
    if (job.weights->from_adapter) c.lora_alpha = job.weights->adapter_alpha, c.rslora = job.weights->adapter_rslora;
    if (o.lora_init) {
      if (c.lora_rank == 0) throw usage_error("--lora-init needs --lora-rank R (the rank of the new factors)");
      c.lora.fill(true);
    }
    if (!o.dy.empty()) job.dy_info = inspect_like_x(o.dy, "--dy", *job.x_info);
    if (!o.target.empty()) job.target_info = inspect_like_x(o.target, "--target", *job.x_info);
    if (o.steps > 0 && !job.dy_info && !job.target_info)
      throw usage_error("--steps needs a loss: --target FILE (mean squared error) or --dy FILE (loss sum(Y * dY))");
    if (job.target_info && job.dy_info) throw usage_error("--target and --dy are two losses: give one");
    if (job.target_info && o.steps == 0) throw usage_error("--target is what training aims at: it needs --steps N");
    if (!o.grads.empty() && !job.dy_info) throw usage_error("--grads needs --dy (the gradient of the output)");
    if (!o.grads.empty() && o.steps > 0)
      throw usage_error(
          "--grads writes the gradients of one pass; after --steps, write the trained factors with --save-lora");
    job.backward = job.dy_info && o.steps == 0;
    if (!o.save_adapter.empty() && !c.lora[0] && !c.lora[1] && !c.lora[2] && !c.lora[3])
      throw usage_error("--save-adapter: the layer has no LoRA factors to save");
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
  c.rope.validate(c.head_dim(), !o.mask.doc_lens.empty());
  bool any_lora = false;
  for (bool on : c.lora) any_lora = any_lora || on;
  if (job.opt.steps > 0 && !any_lora)
    throw usage_error("--steps: --weights " + o.weights + " has no LoRA factors to train (add lora_<p>_A/B.npy, or " +
                     "--lora-init --lora-rank R)");
  if (o.steps < 0) throw usage_error("--steps must not be negative");
  if (!(job.opt.lr > 0) || !std::isfinite(job.opt.lr)) throw usage_error("--lr must be a positive number");
  job.optimizer.kind = parse_optimizer(o.optimizer);
  job.optimizer.lr = job.opt.lr;
  check_execution_options(o);
  c.dtype = parse_dtype_option(o.dtype);
  c.threads = o.threads ? o.threads : ctx.default_threads();
  const ExecutionChoice execution = choose_execution(o.backend, o.comm, ctx);
  job.context = context_options(execution, o, c.threads);
  job.spec.mask = mask_spec(o.mask, c.seq_len, o.seed);
  job.spec.layout = layout_spec(o.layout);
  job.spec.schedule = schedule_spec(o.schedule);
  job.spec.ulysses = o.ulysses;
  job.spec.kernel = kernel_spec(o.kernel);
  job.spec.deterministic = o.deterministic;
  c.validate(execution.backend == "cpu" || o.check);  // (--check runs the CPU kernels too)
  // The library's judgement of the attention the layer runs, before any data moves.
  const Shard shard{c.batch, 1, c.heads, c.kv_heads, c.head_dim(), api::element_type_of(c.dtype)};
  for (auto bad : {api::check_options(job.context), api::check_shard(shard, execution.backend == "cuda"),
                   api::check_spec(job.spec), api::check_call(shard, job.spec, c.seq_len, ctx.world.size())})
    if (bad) throw *bad;
  return job;
}

}  // namespace ringattn
