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
        throw UsageError(std::string("--") + outputs[i].first + " " + outputs[i].second + ": the same file as --" +
                         outputs[j].first + " " + outputs[j].second + " (one would overwrite the other)");
    for (const auto& [name, path] : inputs)
      if (!path.empty() && key(path) == out)
        throw UsageError(std::string("--") + outputs[i].first + " " + outputs[i].second + ": the same file as the input --" +
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
    if (fs::is_directory(path, ec)) throw UsageError(where + "is a directory");
    const fs::path parent = fs::path(path).parent_path();
    const std::string folder = parent.empty() ? "." : parent.string();
    if (!fs::is_directory(folder, ec)) throw UsageError(where + "the folder " + folder + " does not exist");
    if (::access(folder.c_str(), W_OK | X_OK) != 0)
      throw UsageError(where + "cannot write in the folder " + folder + " (" + std::strerror(errno) + ")");
  }
}

// Options that would have no effect in this job are refused with the reason, never ignored.
void refuse_unused_options(const Options& o, const po::variables_map& vm, bool files, bool backward) {
  auto refuse = [&](const char* name, const std::string& why) {
    if (given(vm, name)) throw UsageError(std::string("--") + name + " " + why);
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
  throw UsageError(info.label + " " + info.path + ": expected a (B, L, H, D) or (L, H, D) array, got " +
                   std::to_string(info.shape.size()) + " dimensions");
}

Job resolve_attention_job(const Options& o, const po::variables_map& vm, const LaunchContext& ctx) {
  Job job;
  job.opt = o;
  const int P = ctx.world.size();
  job.files = !o.q.empty() || !o.k.empty() || !o.v.empty();
  if (job.files && (o.q.empty() || o.k.empty() || o.v.empty()))
    throw UsageError("--q, --k and --v go together: give all three files, or none for random inputs");
  if (!o.dout.empty() && o.backward)
    throw UsageError("--dout and --backward both ask for a backward pass: --dout FILE uses that dO, --backward a random one; give one");
  int64_t B = o.batch, L = o.seq_len, H = o.heads, Hkv = o.kv_heads ? o.kv_heads : o.heads, D = o.head_dim;
  if (job.files) {
    job.q_info = inspect_npy(o.q, "--q");
    job.k_info = inspect_npy(o.k, "--k");
    job.v_info = inspect_npy(o.v, "--v");
    const auto qs = as_bshd(*job.q_info), ks = as_bshd(*job.k_info), vs = as_bshd(*job.v_info);
    B = qs[0], L = qs[1], H = qs[2], D = qs[3], Hkv = ks[2];
    if (ks != vs)
      throw UsageError("--k " + o.k + " has shape " + format_shape(job.k_info->shape) + " but --v " + o.v + " has " +
                       format_shape(job.v_info->shape));
    if (ks[0] != B || ks[1] != L || ks[3] != D)
      throw UsageError("--q " + o.q + " has shape " + format_shape(job.q_info->shape) + " but --k " + o.k + " has " +
                       format_shape(job.k_info->shape) + ": batch, length and head dim must agree");
    if (B < 1 || L < 1 || H < 1 || Hkv < 1 || D < 1)
      throw UsageError("--q " + o.q + " has shape " + format_shape(job.q_info->shape) + " and --k " + o.k + " " +
                       format_shape(job.k_info->shape) + ": every dimension must be positive");
    // The shapes come from the files; a shape flag may restate them (scripts often do), never differ.
    const std::tuple<const char*, int64_t, int64_t> from_files[] = {
        {"batch", o.batch, B}, {"seq-len", o.seq_len, L}, {"heads", o.heads, H},
        {"kv-heads", o.kv_heads ? o.kv_heads : H, Hkv}, {"head-dim", o.head_dim, D}};
    for (const auto& [name, flag, value] : from_files) {
      if (!given(vm, name)) continue;
      if (flag != value)
        throw UsageError(std::string("--") + name + " " + std::to_string(flag) + " disagrees with the input files (--q " +
                         o.q + " " + format_shape(job.q_info->shape) + ", --k " + o.k + " " +
                         format_shape(job.k_info->shape) + "), which give " + std::to_string(value));
    }
  } else {
    const std::pair<const char*, int64_t> dims[] = {
        {"batch", B}, {"seq-len", L}, {"heads", H}, {"kv-heads", o.kv_heads}, {"head-dim", D}};
    for (const auto& [name, value] : dims)
      if (value < (std::string_view(name) == "kv-heads" ? 0 : 1))
        throw UsageError(std::string("--") + name + " " + std::to_string(value) + ": must be positive" +
                         (std::string_view(name) == "kv-heads" ? " (or 0 for --heads)" : ""));
    // The largest tensor's byte count must fit in 64 bits (files were checked when inspected).
    int64_t bytes = 4;
    for (int64_t d : {B, L, std::max(H, Hkv), D})
      if (__builtin_mul_overflow(bytes, d, &bytes))
        throw UsageError("--batch " + std::to_string(B) + " --seq-len " + std::to_string(L) + " --heads " +
                         std::to_string(H) + " --head-dim " + std::to_string(D) + ": the tensors are too large to address");
  }
  if (H % Hkv != 0)
    throw UsageError("heads " + std::to_string(H) + " is not a multiple of kv-heads " + std::to_string(Hkv) +
                     (job.files ? " (from --q " + o.q + " and --k " + o.k + ")" : std::string()) +
                     ": grouped-query attention needs Hkv to divide H");
  if (o.backend != "cuda" && !kernels::cpu_supports_head_dim(D))
    throw UsageError("head dim " + std::to_string(D) + (job.files ? " (from --q " + o.q + ")" : std::string(" (--head-dim)")) +
                     " is not supported: use a multiple of 16 up to 512");
  if (L < P)
    throw UsageError("sequence length " + std::to_string(L) + (job.files ? " (from --q " + o.q + ")" : std::string(" (--seq-len)")) +
                     " is smaller than the number of ranks " + std::to_string(P) + ": every rank needs at least one row");
  if (!o.dout.empty()) {
    if (!job.files) throw UsageError("--dout needs --q/--k/--v files (use --backward for random dO)");
    job.dout_info = inspect_npy(o.dout, "--dout");
    if (as_bshd(*job.dout_info) != as_bshd(*job.q_info))
      throw UsageError("--dout " + o.dout + " has shape " + format_shape(job.dout_info->shape) + " but --q " + o.q + " has " +
                       format_shape(job.q_info->shape));
  }
  job.backward = o.backward || !o.dout.empty();
  if (!job.backward && (!o.dq.empty() || !o.dk.empty() || !o.dv.empty()))
    throw UsageError("--dq/--dk/--dv are gradients: they need --backward or --dout");
  check_execution_options(o);
  if (o.check_rows < 1) throw UsageError("--check-rows " + std::to_string(o.check_rows) + ": must be at least 1");
  if (!(o.scale >= 0) || !std::isfinite(o.scale)) throw UsageError("--scale must be a positive number (or 0 for 1/sqrt(D))");
  if (o.scale > 0 && !api::scale_fits_fp32(o.scale))
    throw UsageError(std::string("--scale must lie within ") + api::kScaleRange);
  if (!(o.emulate_intra_bandwidth >= 0) || !std::isfinite(o.emulate_intra_bandwidth))
    throw UsageError("--emulate-intra-bandwidth must be a positive number of GB/s (0 = off)");
  if (!(o.emulate_intra_latency >= 0) || !std::isfinite(o.emulate_intra_latency))
    throw UsageError("--emulate-intra-latency must be a positive number of microseconds (0 = off)");
  check_ulysses(o.ulysses, P, H, Hkv);
  if (o.ulysses == 1 && (o.emulate_intra_bandwidth > 0 || o.emulate_intra_latency > 0))
    throw UsageError("--emulate-intra-bandwidth/--emulate-intra-latency emulate the link inside --ulysses groups: "
                     "they need --ulysses 2 or more");
  if (o.check_finite && o.no_check_finite) throw UsageError("--check-finite and --no-check-finite contradict");
  refuse_unused_options(o, vm, job.files, job.backward);
  refuse_unwritable_outputs({{"out", o.out}, {"lse", o.lse}, {"dq", o.dq}, {"dk", o.dk}, {"dv", o.dv},
                             {"json", o.json}, {"dump-block-mask", o.mask.dump_block_mask}});
  refuse_clashing_paths({{"q", o.q}, {"k", o.k}, {"v", o.v}, {"dout", o.dout}, {"doc-lens", o.mask.doc_lens},
                         {"block-mask", o.mask.block_mask}},
                        {{"out", o.out}, {"lse", o.lse}, {"dq", o.dq}, {"dk", o.dk}, {"dv", o.dv}, {"json", o.json},
                         {"dump-block-mask", o.mask.dump_block_mask}});
  job.dtype = parse_dtype_option(o.dtype);
  job.execution = choose_execution(o.backend, o.comm, D, ctx);
  if (job.execution.backend == "cpu" && !kernels::cpu_supports_head_dim(D))
    throw UsageError("head dim " + std::to_string(D) + " is not supported by the CPU backend: use a multiple of 16 up to 512");
  job.layout = layout_option(o.layout, o.mask.causal);
  job.schedule = parse_schedule(o.schedule);
  job.threads = o.threads ? o.threads : ctx.default_threads();
  job.seq_len = L;
  job.dims = kernels::AttentionDims{B, H, Hkv, D, o.scale > 0 ? float(o.scale) : 1.0f / std::sqrt(float(D))};
  return job;
}

// What every rank must agree on beyond its options: what it read from the files (a file that
// differs between nodes would make the ranks compute different problems).
std::string resolved_lines(const Job& job, const Mask& mask) {
  std::string s = "shape=(B, L, H, Hkv, D) = " +
                  format_shape({job.dims.batch, job.seq_len, job.dims.heads, job.dims.kv_heads, job.dims.head_dim}) + "\n";
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
  s += "backend=" + job.execution.backend + " comm=" + job.execution.comm + "\n";
  return s;
}

}  // namespace ringattn
