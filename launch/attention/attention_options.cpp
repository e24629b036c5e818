#include "launch/attention/attention_options.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <tuple>

#include "kernels/cpu/attention_cpu.hpp"
#include "launch/cli/options_util.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/errors.hpp"
#include "runtime/ulysses_attention.hpp"
#include "util/format.hpp"

namespace po = boost::program_options;

namespace ringattn {

po::options_description describe_attention_options(Options& o) {
  po::options_description inputs("Inputs (files, or random inputs from the shape options)");
  inputs.add_options()
      ("q", po::value(&o.q)->value_name("FILE.npy"), "queries (B, L, H, D) or (L, H, D), float32")
      ("k", po::value(&o.k)->value_name("FILE.npy"), "keys (B, L, Hkv, D)")
      ("v", po::value(&o.v)->value_name("FILE.npy"), "values (B, L, Hkv, D)")
      ("seq-len", po::value(&o.seq_len)->default_value(8192)->value_name("L"), "random inputs: sequence length")
      ("batch", po::value(&o.batch)->default_value(1)->value_name("B"), "random inputs: batch")
      ("heads", po::value(&o.heads)->default_value(8)->value_name("H"), "random inputs: query heads")
      ("kv-heads", po::value(&o.kv_heads)->default_value(0)->value_name("HKV"),
       "random inputs: key/value heads, dividing H (0 = H)")
      ("head-dim", po::value(&o.head_dim)->default_value(128)->value_name("D"), "random inputs: head dim")
      ("seed", po::value(&o.seed)->default_value(0)->value_name("S"), "seed of random inputs, BigBird masks and --check rows")
      ("scale", po::value(&o.scale)->default_value(0.0)->value_name("S"), "softmax scale (0 = 1/sqrt(D))");
  po::options_description outputs("Outputs and backward");
  outputs.add_options()
      ("out", po::value(&o.out)->value_name("FILE.npy"), "write O (shape of Q)")
      ("lse", po::value(&o.lse)->value_name("FILE.npy"), "write LSE (B, H, L), natural log")
      ("dout", po::value(&o.dout)->value_name("FILE.npy"), "run backward with this dO (shape of Q)")
      ("backward", po::bool_switch(&o.backward), "run backward with random dO")
      ("dq", po::value(&o.dq)->value_name("FILE.npy"), "write dQ")
      ("dk", po::value(&o.dk)->value_name("FILE.npy"), "write dK")
      ("dv", po::value(&o.dv)->value_name("FILE.npy"), "write dV");
  po::options_description masks("Masks (combined by intersection)");
  add_mask_options(masks, o.mask);
  po::options_description run("Execution");
  add_ring_options(run, o.fields());
  add_hybrid_options(run, &o.ulysses, &o.emulate_intra_bandwidth, &o.emulate_intra_latency);
  add_auto_options(run, o.auto_options);
  run.add_options()
      ("check", po::bool_switch(&o.check), "compare sampled rows with an fp64 reference (exit 3 when they differ)")
      ("check-rows", po::value(&o.check_rows)->default_value(16)->value_name("N"), "rows sampled by --check")
      ("check-finite", po::bool_switch(&o.check_finite), "refuse NaN/Inf inputs (default for file inputs)")
      ("no-check-finite", po::bool_switch(&o.no_check_finite), "skip the NaN/Inf scan of file inputs")
      ("json", po::value(&o.json)->value_name("FILE"), "write a JSON summary (rank 0)")
      ("progress", po::bool_switch(&o.progress), "show steps done and time left on stderr (rank 0)");
  po::options_description all("ringattn [attention] options");
  all.add_options()("help,h", "show this help");
  all.add(inputs).add(outputs).add(masks).add(run);
  return all;
}

namespace {

// The same file named twice among the outputs, or an output that would replace an input, loses
// data: refused. Paths are compared after resolving '.', '..' and symbolic links.
void refuse_clashing_paths(const std::vector<std::pair<const char*, std::string>>& inputs,
                           const std::vector<std::pair<const char*, std::string>>& outputs) {
  auto key = [](const std::string& path) {
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
    return ec ? path : p.lexically_normal().string();
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].second.empty()) continue;
    const std::string out = key(outputs[i].second);
    for (size_t j = 0; j < i; ++j)
      if (!outputs[j].second.empty() && key(outputs[j].second) == out)
        throw usage_error(std::string("--") + outputs[i].first + " " + outputs[i].second + ": the same file as --" +
                         outputs[j].first + " " + outputs[j].second + " (one would overwrite the other)");
    for (const auto& [name, path] : inputs)
      if (!path.empty() && key(path) == out)
        throw usage_error(std::string("--") + outputs[i].first + " " + outputs[i].second + ": the same file as the input --" +
                         name + " (writing it would replace the input)");
  }
}

// An output that cannot be created is refused now, not after the job has run for hours.
void refuse_unwritable_outputs(const std::vector<std::pair<const char*, std::string>>& outputs) {
  namespace fs = std::filesystem;
  for (const auto& [name, path] : outputs) {
    if (path.empty()) continue;
    const std::string where = std::string("--") + name + " " + path + ": ";
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw usage_error(where + "is a directory");
    const fs::path parent = fs::path(path).parent_path();
    const std::string folder = parent.empty() ? "." : parent.string();
    if (!fs::is_directory(folder, ec)) throw usage_error(where + "the folder " + folder + " does not exist");
    if (::access(folder.c_str(), W_OK | X_OK) != 0)
      throw usage_error(where + "cannot write in the folder " + folder + " (" + std::strerror(errno) + ")");
  }
}

// Options that would have no effect in this job are refused with the reason, never ignored.
void refuse_unused_options(const Options& o, const po::variables_map& vm, bool files, bool backward) {
  auto refuse = [&](const char* name, const std::string& why) {
    if (given(vm, name)) throw usage_error(std::string("--") + name + " " + why);
  };
  if (files && !(backward && o.dout.empty()) && !o.check && o.mask.bigbird.empty())
    refuse("seed", "has no effect here: it seeds random inputs, random dO (--backward), --bigbird masks and the "
                   "rows --check samples, and this job has none of them");
  if (!o.check) refuse("check-rows", "has no effect without --check");
  if (!files) refuse("no-check-finite", "has no effect: random inputs are not scanned (it applies to --q/--k/--v/--dout files)");
  if (o.mask.block_mask.empty() && o.mask.bigbird.empty())
    refuse("mask-block", "has no effect without a block mask (--block-mask or --bigbird)");
}

}  // namespace

std::vector<int64_t> as_bshd(const NpyInfo& info) {
  if (info.shape.size() == 4) return info.shape;
  if (info.shape.size() == 3) return {1, info.shape[0], info.shape[1], info.shape[2]};
  throw usage_error(info.label + " " + info.path + ": expected a (B, L, H, D) or (L, H, D) array, got " +
                   std::to_string(info.shape.size()) + " dimensions");
}

kernels::AttentionDims Job::dims() const {
  return kernels::AttentionDims{shard.batch, shard.heads, shard.kv_heads, shard.head_dim,
                                api::softmax_scale(spec, shard.head_dim)};
}

std::map<std::string, std::string, std::less<>> file_argument_names(const Options& o) {
  if (o.q.empty() || o.k.empty()) return {};
  const std::string q = "--q " + o.q + "'s ", k = "--k " + o.k + "'s ";
  return {{"batch", q + "batch"}, {"seq_len", q + "length"}, {"heads", q + "heads"}, {"head_dim", q + "head dim"},
          {"kv_heads", k + "heads"}};
}

namespace {

// The shape from the input files, each restated shape flag checked against it.
void shape_from_files(Job& job, const Options& o, const po::variables_map& vm) {
  job.q_info = inspect_npy(o.q, "--q");
  job.k_info = inspect_npy(o.k, "--k");
  job.v_info = inspect_npy(o.v, "--v");
  const auto qs = as_bshd(*job.q_info), ks = as_bshd(*job.k_info), vs = as_bshd(*job.v_info);
  if (ks != vs)
    throw usage_error("--k " + o.k + " has shape " + format_shape(job.k_info->shape) + " but --v " + o.v + " has " +
                      format_shape(job.v_info->shape));
  if (ks[0] != qs[0] || ks[1] != qs[1] || ks[3] != qs[3])
    throw usage_error("--q " + o.q + " has shape " + format_shape(job.q_info->shape) + " but --k " + o.k + " has " +
                      format_shape(job.k_info->shape) + ": batch, length and head dim must agree");
  job.shard = Shard{qs[0], 0, qs[2], ks[2], qs[3], ElementType::float32};
  job.seq_len = qs[1];
  // A shape flag may restate the files (scripts often do), never differ.
  const std::tuple<const char*, int64_t, int64_t> from_files[] = {
      {"batch", o.batch, qs[0]}, {"seq-len", o.seq_len, qs[1]}, {"heads", o.heads, qs[2]},
      {"kv-heads", o.kv_heads ? o.kv_heads : qs[2], ks[2]}, {"head-dim", o.head_dim, qs[3]}};
  for (const auto& [name, flag, value] : from_files)
    if (given(vm, name) && flag != value)
      throw usage_error(std::string("--") + name + " " + std::to_string(flag) + " disagrees with the input files (--q " +
                        o.q + " " + format_shape(job.q_info->shape) + ", --k " + o.k + " " +
                        format_shape(job.k_info->shape) + "), which give " + std::to_string(value));
  if (!o.dout.empty()) {
    job.dout_info = inspect_npy(o.dout, "--dout");
    if (as_bshd(*job.dout_info) != qs)
      throw usage_error("--dout " + o.dout + " has shape " + format_shape(job.dout_info->shape) + " but --q " + o.q +
                        " has " + format_shape(job.q_info->shape));
  }
}

// The shape of random inputs.
void shape_from_flags(Job& job, const Options& o) {
  if (o.kv_heads < 0) throw usage_error("--kv-heads " + std::to_string(o.kv_heads) + " must be positive (or 0 for --heads)");
  job.shard = Shard{o.batch, 0, o.heads, o.kv_heads ? o.kv_heads : o.heads, o.head_dim, ElementType::float32};
  job.seq_len = o.seq_len;
  // The largest tensor's byte count must fit in 64 bits (files were checked when inspected).
  int64_t bytes = 4;
  for (int64_t d : {o.batch, o.seq_len, std::max(o.heads, job.shard.kv_heads), o.head_dim})
    if (d > 0 && __builtin_mul_overflow(bytes, d, &bytes))
      throw usage_error("--batch " + std::to_string(o.batch) + " --seq-len " + std::to_string(o.seq_len) + " --heads " +
                        std::to_string(o.heads) + " --head-dim " + std::to_string(o.head_dim) +
                        ": the tensors are too large to address");
}

}  // namespace

Job resolve_attention_job(const Options& o, const po::variables_map& vm, const LaunchContext& ctx) {
  Job job;
  job.opt = o;
  job.files = !o.q.empty() || !o.k.empty() || !o.v.empty();
  if (job.files && (o.q.empty() || o.k.empty() || o.v.empty()))
    throw usage_error("--q, --k and --v go together: give all three files, or none for random inputs");
  if (!o.dout.empty() && o.backward)
    throw usage_error("--dout and --backward both ask for a backward pass: --dout FILE uses that dO, --backward a "
                      "random one; give one");
  if (!o.dout.empty() && !job.files) throw usage_error("--dout needs --q/--k/--v files (use --backward for random dO)");
  if (job.files)
    shape_from_files(job, o, vm);
  else
    shape_from_flags(job, o);
  job.backward = o.backward || !o.dout.empty();
  if (!job.backward && (!o.dq.empty() || !o.dk.empty() || !o.dv.empty()))
    throw usage_error("--dq/--dk/--dv are gradients: they need --backward or --dout");
  check_execution_options(o);
  if (o.check_rows < 1) throw usage_error("--check-rows " + std::to_string(o.check_rows) + ": must be at least 1");
  if (o.ulysses == 1 && (o.emulate_intra_bandwidth > 0 || o.emulate_intra_latency > 0))
    throw usage_error("--emulate-intra-bandwidth/--emulate-intra-latency emulate the link inside --ulysses groups: "
                      "they need --ulysses 2 or more");
  if (o.check_finite && o.no_check_finite) throw usage_error("--check-finite and --no-check-finite contradict");
  refuse_unused_options(o, vm, job.files, job.backward);
  refuse_unwritable_outputs({{"out", o.out}, {"lse", o.lse}, {"dq", o.dq}, {"dk", o.dk}, {"dv", o.dv},
                             {"json", o.json}, {"dump-block-mask", o.mask.dump_block_mask}});
  refuse_clashing_paths({{"q", o.q}, {"k", o.k}, {"v", o.v}, {"dout", o.dout}, {"doc-lens", o.mask.doc_lens},
                         {"block-mask", o.mask.block_mask}},
                        {{"out", o.out}, {"lse", o.lse}, {"dq", o.dq}, {"dk", o.dk}, {"dv", o.dv}, {"json", o.json},
                         {"dump-block-mask", o.mask.dump_block_mask}});
  job.shard.dtype = api::element_type_of(parse_dtype_option(o.dtype));
  const ExecutionChoice execution = choose_execution(o.backend, o.comm, ctx);
  job.context = context_options(execution, o, o.threads ? o.threads : ctx.default_threads(),
                                o.emulate_intra_bandwidth, o.emulate_intra_latency);
  job.spec.mask = mask_spec(o.mask, job.seq_len, o.seed);
  job.spec.layout = layout_spec(o.layout);
  job.spec.schedule = schedule_spec(o.schedule);
  job.spec.softmax_scale = o.scale;
  job.spec.ulysses = o.ulysses;
  job.spec.kernel = kernel_spec(o.kernel);
  job.spec.deterministic = o.deterministic;
  // The library's judgement of every value it takes, before any data moves.
  for (auto bad : {api::check_options(job.context), api::check_shard(job.shard, execution.backend == "cuda"),
                   api::check_spec(job.spec)})
    if (bad) throw *bad;
  if (auto bad = api::check_call(job.shard, job.spec, job.seq_len, ctx.world.size())) throw *bad;
  job.auto_settings = resolve_auto_options(o.auto_options, vm);
  if (o.auto_options.enabled) {
    AutoFixed& fixed = job.auto_settings.fixed;
    if (given(vm, "layout")) fixed.layout = layout_option(o.layout, o.mask.causal);
    if (given(vm, "schedule")) fixed.schedule = parse_schedule(o.schedule);
    if (given(vm, "ulysses")) fixed.ulysses = o.ulysses;
  }
  return job;
}

// What every rank must agree on beyond its options: what it read from the files (a file that
// differs between nodes would make the ranks compute different problems).
std::string resolved_lines(const Job& job, const Mask& mask) {
  std::string s = "shape=(B, L, H, Hkv, D) = " +
                  format_shape({job.shard.batch, job.seq_len, job.shard.heads, job.shard.kv_heads, job.shard.head_dim}) +
                  "\n";
  for (const auto* info : {&job.q_info, &job.k_info, &job.v_info, &job.dout_info})
    if (*info) s += (*info)->label + " " + (*info)->path + "=" + (*info)->descr + " " + format_shape((*info)->shape) + "\n";
  // FNV-1a of the mask's data: documents and block mask, as read on this rank.
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  mix(mask.doc_offsets().data(), mask.doc_offsets().size() * sizeof(int64_t));
  mix(mask.block_mask().data(), mask.block_mask().size());
  s += "mask=" + mask.describe() + " (digest " + std::to_string(h) + ")\n";
  s += "backend=" + job.context.backend + " comm=" + job.context.comm + "\n";
  return s;
}

}  // namespace ringattn
