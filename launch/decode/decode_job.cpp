// `ringattn decode`: options, the cache, prefill (or the random fill), the timed decode steps,
// the check, the report.
#include "launch/decode/decode_job.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/decode_cpu.hpp"
#include "launch/cli/argument_names.hpp"
#include "launch/cli/cpu_binding.hpp"
#include "launch/cli/execution.hpp"
#include "launch/cli/job_control.hpp"
#include "launch/cli/json.hpp"
#include "launch/cli/options_util.hpp"
#include "launch/cli/statistics.hpp"
#include "launch/cli/summary.hpp"
#include "launch/decode/decode_inputs.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/errors.hpp"
#include "runtime/inference/decode.hpp"
#include "runtime/inference/prefill.hpp"
#include "runtime/session.hpp"
#include "util/format.hpp"
#include "util/stopwatch.hpp"

namespace po = boost::program_options;

namespace ringattn {
namespace {

struct DecodeOptions {
  int64_t seq_len = 4096, batch = 1, heads = 8, kv_heads = 0, head_dim = 128;
  std::string dtype = "fp32", window = "-1,0", prefill_method = "auto", json, q, k, v, backend, comm;
  int64_t new_tokens = 16, tokens_per_step = 1, prefill_chunk = 0, interleave = 1, capacity = 0;
  uint64_t seed = 0;
  int threads = 0;
  double timeout = 300.0;
  bool check = false;
  int check_steps = 2;
};

po::options_description describe(DecodeOptions& o) {
  po::options_description d("ringattn decode options");
  d.add_options()
      ("help,h", "show this help")
      ("q", po::value(&o.q)->value_name("FILE.npy"), "the prompt's queries (B, L, H, D) or (L, H, D), with --k and --v")
      ("k", po::value(&o.k)->value_name("FILE.npy"), "the prompt's keys (B, L, Hkv, D) or (L, Hkv, D)")
      ("v", po::value(&o.v)->value_name("FILE.npy"), "the prompt's values (shape of --k)")
      ("seq-len", po::value(&o.seq_len)->default_value(o.seq_len)->value_name("L"), "prompt tokens per sequence (random prompt)")
      ("batch", po::value(&o.batch)->default_value(o.batch)->value_name("B"), "sequences")
      ("heads", po::value(&o.heads)->default_value(o.heads)->value_name("H"), "query heads")
      ("kv-heads", po::value(&o.kv_heads)->default_value(o.kv_heads)->value_name("HKV"), "key/value heads (0: --heads)")
      ("head-dim", po::value(&o.head_dim)->default_value(o.head_dim)->value_name("D"), "head dim")
      ("dtype", po::value(&o.dtype)->default_value(o.dtype)->value_name("fp32|bf16"), "element type of q, k, v and the cache")
      ("window", po::value(&o.window)->default_value(o.window)->value_name("LEFT,RIGHT"),
       "causal sliding window: keys i - LEFT .. i (-1: unbounded; RIGHT must be -1 or 0, attention is causal)")
      ("new-tokens", po::value(&o.new_tokens)->default_value(o.new_tokens)->value_name("N"), "decode steps")
      ("tokens-per-step", po::value(&o.tokens_per_step)->default_value(o.tokens_per_step)->value_name("T"),
       "new tokens per sequence per step (more than 1: speculative decoding's drafts)")
      ("prefill-chunk", po::value(&o.prefill_chunk)->default_value(o.prefill_chunk)->value_name("N"),
       "prefill in chunks of N tokens (chunked prefill; 0: the whole prompt at once)")
      ("prefill-method", po::value(&o.prefill_method)->default_value(o.prefill_method)->value_name("M"),
       "auto|pass-kv|pass-q|none (none: the cache filled with random K/V, no prefill attention: a decode benchmark)")
      ("interleave", po::value(&o.interleave)->default_value(o.interleave)->value_name("N"),
       "decode's new tokens go round-robin over the ranks in units of N tokens")
      ("capacity", po::value(&o.capacity)->default_value(o.capacity)->value_name("ROWS"),
       "cache rows per sequence per rank (0: enough for the prompt and the decode steps)")
      ("seed", po::value(&o.seed)->default_value(o.seed), "seed of the random tokens")
      ("backend", po::value(&o.backend)->value_name("cpu|cuda"), "default: cuda when a GPU is visible, else cpu")
      ("comm", po::value(&o.comm)->value_name("mpi|nccl"),
       "default: nccl with the cuda backend when every rank of a node has its own GPU, else mpi")
      ("threads", po::value(&o.threads)->default_value(o.threads)->value_name("N"), "CPU threads per rank (0: the cores shared among the node's ranks)")
      ("timeout", po::value(&o.timeout)->default_value(o.timeout)->value_name("SECONDS"), "bound on every wait for a peer")
      ("check", po::bool_switch(&o.check), "compare sampled steps (and prefill rows) with fp64 attention over the whole sequence")
      ("check-steps", po::value(&o.check_steps)->default_value(o.check_steps)->value_name("N"), "decode steps --check samples (first and last, then spread)")
      ("json", po::value(&o.json)->value_name("FILE"), "write the summary as JSON (rank 0)");
  return d;
}

struct DecodeJob {
  DecodeOptions opt;
  std::optional<PromptFiles> files;  // the prompt from --q --k --v
  DType dtype = DType::f32;
  int64_t kv_heads = 0, window_left = -1, capacity = 0;
  bool fill_random = false;
  inference::PrefillMethod method = inference::PrefillMethod::automatic;
  ContextOptions context;
  float scale = 0.0f;
};

// The prompt's shape from --q --k --v, each restated shape flag checked against it.
void shape_from_files(DecodeJob& job, const po::variables_map& vm) {
  DecodeOptions& o = job.opt;
  if (o.q.empty() || o.k.empty() || o.v.empty())
    throw usage_error("--q, --k and --v go together: give all three files, or none for a random prompt");
  job.files = open_prompt_files(o.q, o.k, o.v);
  const PromptFiles& f = *job.files;
  const std::tuple<const char*, int64_t&, int64_t> from_files[] = {
      {"batch", o.batch, f.batch}, {"seq-len", o.seq_len, f.length}, {"heads", o.heads, f.heads},
      {"kv-heads", o.kv_heads, f.kv_heads}, {"head-dim", o.head_dim, f.head_dim}};
  for (const auto& [name, flag, value] : from_files) {
    if (given(vm, name) && flag != value && !(std::string(name) == "kv-heads" && flag == 0 && value == f.heads))
      throw usage_error(std::string("--") + name + " " + std::to_string(flag) + " disagrees with the prompt files (--q " +
                        o.q + " " + format_shape(f.q.shape) + ", --k " + o.k + " " + format_shape(f.k.shape) +
                        "), which give " + std::to_string(value));
    flag = value;
  }
}

DecodeJob resolve(const DecodeOptions& given_options, const LaunchContext& ctx, const po::variables_map& vm) {
  DecodeJob job;
  job.opt = given_options;
  if (!job.opt.q.empty() || !job.opt.k.empty() || !job.opt.v.empty()) shape_from_files(job, vm);
  const DecodeOptions& o = job.opt;
  auto positive = [](const char* flag, int64_t v) {
    if (v < 1) throw usage_error(std::string(flag) + " " + std::to_string(v) + " must be positive");
  };
  positive("--seq-len", o.seq_len), positive("--batch", o.batch), positive("--heads", o.heads);
  positive("--new-tokens", o.new_tokens), positive("--tokens-per-step", o.tokens_per_step);
  positive("--interleave", o.interleave);
  if (o.prefill_chunk < 0) throw usage_error("--prefill-chunk " + std::to_string(o.prefill_chunk) + " must not be negative");
  if (o.capacity < 0) throw usage_error("--capacity " + std::to_string(o.capacity) + " must not be negative");
  if (o.check_steps < 1) throw usage_error("--check-steps must be positive");
  job.kv_heads = o.kv_heads ? o.kv_heads : o.heads;
  if (job.kv_heads < 1 || o.heads % job.kv_heads != 0)
    throw usage_error("--kv-heads " + std::to_string(job.kv_heads) + " must divide --heads " + std::to_string(o.heads));
  job.dtype = parse_dtype_option(o.dtype);
  const size_t comma = o.window.find(',');
  try {
    size_t used = 0;
    job.window_left = std::stoll(o.window.substr(0, comma), &used);
    const int64_t right = comma == std::string::npos ? 0 : std::stoll(o.window.substr(comma + 1));
    if (used != o.window.substr(0, comma).size() || job.window_left < -1 || (right != -1 && right != 0))
      throw std::invalid_argument("window");
  } catch (const std::exception&) {
    throw usage_error("--window '" + o.window + "': expected LEFT,RIGHT with LEFT >= -1 and RIGHT -1 or 0");
  }
  job.fill_random = o.prefill_method == "none";
  if (!job.fill_random) job.method = inference::parse_prefill_method(o.prefill_method);
  const int P = ctx.world.size();
  const int64_t total = o.seq_len + o.new_tokens * o.tokens_per_step;
  // The prompt's layout gives a rank at most ceil(L / 2P) + 1 rows per zigzag chunk; decode adds
  // its share of the new tokens, a unit more at most.
  job.capacity = o.capacity ? o.capacity : (total + P - 1) / P + 2 * o.interleave + 2 * P + 16;
  const inference::CacheShape shape{o.batch, job.kv_heads, o.head_dim, job.capacity, o.interleave, job.dtype};
  if (auto e = inference::check_cache_shape(shape)) throw *e;
  ExecutionOptions exec;
  exec.threads = o.threads, exec.timeout = o.timeout;
  check_execution_options(exec);
  job.context = context_options(choose_execution(o.backend, o.comm, ctx), exec,
                                o.threads ? o.threads : ctx.default_threads());
  job.scale = 1.0f / std::sqrt(float(o.head_dim));
  return job;
}

// The prompt into the cache: prefilled in chunks (timed: the time to first token), or filled with
// random K/V at the rows a ring prefill would have left each rank.
// A call's host q, k, v and o, lse in the backend's memory (the host buffers themselves on the CPU).
struct Staged {
  MirroredBytes q, k, v;
  MirroredFloats o, lse;
  Staged(AttentionBackend& b, std::vector<char>& qh, std::vector<char>& kh, std::vector<char>& vh,
         std::vector<float>& oh, std::vector<float>& lh)
      : q(b, qh.data(), qh.size()), k(b, kh.data(), kh.size()), v(b, vh.data(), vh.size()), o(b, oh), lse(b, lh) {
    upload();
  }
  void upload() { q.upload(), k.upload(), v.upload(); }
  void download() { o.download(), lse.download(); }
};

struct PrefillOutcome {
  double seconds = 0.0;
  inference::PrefillMethod method = inference::PrefillMethod::pass_kv;
  DecodeCheck check;
};

PrefillOutcome fill_cache(const DecodeJob& job, Session& session, inference::KVCache& cache, const TokenSource& src) {
  const DecodeOptions& o = job.opt;
  const int64_t H = o.heads, Hkv = job.kv_heads, D = o.head_dim;
  const size_t eb = size_t(dtype_bytes(job.dtype));
  PrefillOutcome out;
  if (job.fill_random) {
    AttentionSpec spec;
    spec.mask.causal = true;
    const ShardLayout layout = session.layout(o.seq_len, spec);
    std::vector<int64_t> per_rank(size_t(session.size()));
    for (int r = 0; r < session.size(); ++r) per_rank[size_t(r)] = layout.rows(r);
    const std::vector<int64_t> mine = layout.positions(session.rank());
    constexpr size_t kRowsPerFill = 16384;  // bounded temporaries, whatever the share
    std::vector<char> k(kRowsPerFill * size_t(Hkv * D) * eb), v(k.size());
    MirroredBytes kd(session.backend(), k.data(), k.size()), vd(session.backend(), v.data(), v.size());
    for (int64_t s = 0; s < o.batch; ++s)
      if (auto e = cache.capacity_problem(s, per_rank, "capacity")) throw *e;
    for (int64_t s = 0; s < o.batch; ++s) {
      for (size_t first = 0; first < mine.size(); first += kRowsPerFill) {
        const std::vector<int64_t> pos(mine.begin() + long(first),
                                       mine.begin() + long(std::min(mine.size(), first + kRowsPerFill)));
        src.rows_as_dtype(TokenTensor::k, s, pos.data(), int64_t(pos.size()), k.data());
        src.rows_as_dtype(TokenTensor::v, s, pos.data(), int64_t(pos.size()), v.data());
        kd.upload(), vd.upload();
        cache.store_rows(s, pos, kd.data(), vd.data());
      }
      cache.commit_rows(s, per_rank, o.seq_len);
    }
    return out;
  }
  const int64_t chunk = o.prefill_chunk ? o.prefill_chunk : o.seq_len;
  session.world().barrier();
  Stopwatch clock;
  for (int64_t begin = 0; begin < o.seq_len; begin += chunk) {
    inference::PrefillRequest r;
    r.heads = H, r.tokens = std::min(chunk, o.seq_len - begin), r.scale = job.scale, r.window_left = job.window_left;
    r.threads = job.context.threads, r.method = job.method;
    if (auto e = inference::check_prefill(session, cache, r)) throw *e;
    std::vector<int64_t> pos = inference::prefill_chunk_positions(session, r, job.method);
    for (int64_t& p : pos) p += begin;
    const int64_t rows = int64_t(pos.size());
    std::vector<char> q(size_t(o.batch * rows * H * D) * eb), k(size_t(o.batch * rows * Hkv * D) * eb), v(k.size());
    for (int64_t s = 0; s < o.batch; ++s) {
      src.rows_as_dtype(TokenTensor::q, s, pos.data(), rows, q.data() + size_t(s * rows * H * D) * eb);
      src.rows_as_dtype(TokenTensor::k, s, pos.data(), rows, k.data() + size_t(s * rows * Hkv * D) * eb);
      src.rows_as_dtype(TokenTensor::v, s, pos.data(), rows, v.data() + size_t(s * rows * Hkv * D) * eb);
    }
    std::vector<float> o_rows(size_t(o.batch * rows * H * D)), lse(size_t(o.batch * H * rows));
    Staged io(session.backend(), q, k, v, o_rows, lse);
    out.method = inference::prefill(session, cache, r, io.q.data(), io.k.data(), io.v.data(), io.o.data(),
                                    io.lse.data()).method;
    io.download();
    const bool last = begin + chunk >= o.seq_len;
    if (o.check && last && rows > 0) {  // a few of this rank's rows of the last chunk, each sequence
      const int64_t step = std::max<int64_t>(1, rows / 4);
      // pass-KV runs the backend's block kernels (their rounding), pass-Q the decode kernel (fp32,
      // or the block kernels' where the chunk fills their query tiles).
      const kernels::AttentionDims dims{1, H, Hkv, D, job.scale};
      const kernels::SamePrecision precision =
          out.method == inference::PrefillMethod::pass_kv
              ? session.backend().same_precision(dims, job.dtype)
              : session.backend().decode_same_precision(dims, r.tokens, job.dtype);
      for (int64_t s = 0; s < o.batch; ++s)
        for (int64_t j = 0; j < rows; j += step) {
          std::vector<float> oj(o_rows.begin() + (s * rows + j) * H * D, o_rows.begin() + (s * rows + j + 1) * H * D);
          std::vector<float> lj(static_cast<size_t>(H));
          for (int64_t h = 0; h < H; ++h) lj[size_t(h)] = lse[size_t((s * H + h) * rows + j)];
          check_rows(src, s, {pos[size_t(j)]}, oj.data(), lj.data(), job.window_left, job.scale, out.check,
                     precision);
        }
    }
  }
  double t = clock.seconds();
  session.world().allreduce(&t, 1, DType::f64, comm::ReduceOp::max);
  out.seconds = t;
  return out;
}

struct DecodeResults {
  std::vector<double> step_s;  // slowest rank's, per step
  std::vector<double> kernel_fraction;  // this rank's kernel rate / the probe's, per step
  std::vector<double> read_bandwidth;    // the probe's, per step
  uint64_t bytes_per_step = 0, kernel_bytes = 0;
  double kernel_seconds = 0.0, merge_seconds = 0.0;
  const char* collective = "none";
  DecodeCheck check;
};

DecodeResults run_steps(const DecodeJob& job, Session& session, inference::KVCache& cache, const TokenSource& src) {
  const DecodeOptions& o = job.opt;
  const int64_t B = o.batch, T = o.tokens_per_step, H = o.heads, Hkv = job.kv_heads, D = o.head_dim;
  const size_t eb = size_t(dtype_bytes(job.dtype));
  comm::Communicator& world = session.world();
  std::vector<int64_t> checked;  // the steps --check samples
  for (int i = 0; i < o.check_steps && o.check; ++i)
    checked.push_back(o.check_steps == 1 ? o.new_tokens - 1 : i * (o.new_tokens - 1) / (o.check_steps - 1));
  DecodeResults r;
  std::vector<char> q(size_t(B * T * H * D) * eb), k(size_t(B * T * Hkv * D) * eb), v(k.size());
  std::vector<float> out(size_t(B * T * H * D)), lse(size_t(B * H * T));
  Staged io(session.backend(), q, k, v, out, lse);  // once: no step allocates
  // The CPU's read bandwidth is the CPU kernel's yardstick; a GPU's is not probed here.
  const bool probing = session.backend().memory() == comm::MemorySpace::host;
  // The read-bandwidth probe runs between the steps (A, B, A, B): both rates under the same load.
  // (256 MiB, counted in the peak memory: well past the caches, so it measures DRAM.)
  kernels::ReadBandwidthProbe probe(job.context.threads, probing ? size_t(256) << 20 : 0);
  for (int64_t step = 0; step < o.new_tokens; ++step) {
    std::vector<std::vector<int64_t>> pos(static_cast<size_t>(B));
    for (int64_t s = 0; s < B; ++s) {
      for (int64_t t = 0; t < T; ++t) pos[size_t(s)].push_back(cache.length(s) + t);
      src.rows_as_dtype(TokenTensor::q, s, pos[size_t(s)].data(), T, q.data() + size_t(s * T * H * D) * eb);
      src.rows_as_dtype(TokenTensor::k, s, pos[size_t(s)].data(), T, k.data() + size_t(s * T * Hkv * D) * eb);
      src.rows_as_dtype(TokenTensor::v, s, pos[size_t(s)].data(), T, v.data() + size_t(s * T * Hkv * D) * eb);
    }
    inference::DecodeRequest req;
    req.heads = H, req.tokens = T, req.scale = job.scale, req.window_left = job.window_left;
    req.threads = job.context.threads;
    io.upload();
    world.barrier();
    const inference::DecodeStats st =
        inference::decode_step(session, cache, req, io.q.data(), io.k.data(), io.v.data(), io.o.data(), io.lse.data());
    io.download();
    r.step_s.push_back(st.seconds);
    r.bytes_per_step = st.merge.bytes_moved;
    r.collective = inference::merge_collective_name(st.merge.collective);
    r.kernel_bytes += st.bytes_read, r.kernel_seconds += st.compute_seconds, r.merge_seconds += st.merge_seconds;
    if (probing && step % std::max<int64_t>(1, o.new_tokens / 16) == 0) {  // at most 16 or so probes
      world.barrier();  // every rank probes at once, as they decode at once
      const double bandwidth = probe.pass();
      r.read_bandwidth.push_back(bandwidth);
      if (st.compute_seconds > 0) r.kernel_fraction.push_back(double(st.bytes_read) / st.compute_seconds / bandwidth);
    }
    // Each sampled step's sequences are checked by the ranks in turn (the fp64 stream is the slow part).
    if (std::find(checked.begin(), checked.end(), step) != checked.end())
      for (int64_t s = 0; s < B; ++s)
        if ((step + s) % world.size() == world.rank())
          check_rows(src, s, pos[size_t(s)], out.data() + s * T * H * D, lse.data() + s * H * T, job.window_left,
                     job.scale, r.check);
  }
  world.allreduce(r.step_s.data(), r.step_s.size(), DType::f64, comm::ReduceOp::max);
  if (o.check) reduce_check(world, r.check);
  return r;
}

int report(const DecodeJob& job, Session& session, const inference::KVCache& cache, const PrefillOutcome& pre,
           const DecodeResults& r, double peak_rss) {
  const DecodeOptions& o = job.opt;
  comm::Communicator& world = session.world();
  const int P = world.size();
  // Cache rows per rank, per sequence: the min and max over ranks and sequences.
  int64_t rows_min = cache.rows(0, 0), rows_max = 0;
  for (int64_t s = 0; s < o.batch; ++s)
    for (int p = 0; p < P; ++p) rows_min = std::min(rows_min, cache.rows(s, p)), rows_max = std::max(rows_max, cache.rows(s, p));
  double rss[2] = {peak_rss, -peak_rss};
  world.allreduce(rss, 2, DType::f64, comm::ReduceOp::max);
  // The kernel's rate on each rank against the bandwidth probed there between the steps: medians
  // over the steps, means over the ranks.
  double rate[3] = {r.kernel_seconds > 0 ? double(r.kernel_bytes) / r.kernel_seconds : 0.0,
                    median_of(r.read_bandwidth), median_of(r.kernel_fraction)};
  world.allreduce(rate, 3, DType::f64, comm::ReduceOp::sum);
  const double kernel_rate = rate[0] / P, bandwidth = rate[1] / P, fraction = rate[2] / P;
  const double token_s = median_of(r.step_s), p95 = percentile_of(r.step_s, 95.0);
  const double bytes_per_token = double(r.bytes_per_step) / double(o.tokens_per_step);
  const std::string mask = job.window_left < 0 ? "causal" : "causal+window(" + std::to_string(job.window_left) + ",0)";
  const int64_t total = o.seq_len + o.new_tokens * o.tokens_per_step;
  if (world.rank() == 0) {
    std::printf("ringattn decode: %d rank%s, batch %lld, prompt %lld tokens, %lld steps x %lld new token%s; H %lld, "
                "Hkv %lld, D %lld, %s, %s, interleave %lld, %d thread%s per rank\n",
                P, P > 1 ? "s" : "", (long long)o.batch, (long long)o.seq_len, (long long)o.new_tokens,
                (long long)o.tokens_per_step, o.tokens_per_step > 1 ? "s" : "", (long long)o.heads,
                (long long)job.kv_heads, (long long)o.head_dim, dtype_name(job.dtype), mask.c_str(),
                (long long)o.interleave, job.context.threads, job.context.threads > 1 ? "s" : "");
    if (job.fill_random)
      std::printf("  prefill   none: the cache filled with random K/V (no time to first token)\n");
    else
      std::printf("  prefill   %s%s: time to first token %.4f s\n", inference::prefill_method_name(pre.method),
                  o.prefill_chunk ? (" in chunks of " + std::to_string(o.prefill_chunk)).c_str() : "", pre.seconds);
    std::printf("  decode    per token %.3f ms median, %.3f ms p95 (slowest rank per step)\n", token_s * 1e3, p95 * 1e3);
    std::printf("  merge     %s, %s moved per token (all ranks)\n", r.collective, human_bytes(bytes_per_token).c_str());
    if (bandwidth > 0)
      std::printf("  kernel    %.2f GB/s read vs %.2f GB/s memory read bandwidth probed between the steps: %.0f%% "
                  "(median per step)\n",
                  kernel_rate / 1e9, bandwidth / 1e9, 100.0 * fraction);
    else  // a GPU: launch/gpu-check.sh compares the kernel with the device's bandwidth
      std::printf("  kernel    %.2f GB/s read (%s backend; no bandwidth probe)\n", kernel_rate / 1e9,
                  job.context.backend.c_str());
    std::printf("  cache     rows per rank per sequence %lld..%lld (of %lld tokens), %s per rank\n",
                (long long)rows_min, (long long)rows_max, (long long)total, human_bytes(double(cache.bytes())).c_str());
    std::printf("  memory    peak %s per rank (max), %s (min)\n", human_bytes(rss[0]).c_str(), human_bytes(-rss[1]).c_str());
  }
  DecodeCheck check = r.check;
  if (o.check && !job.fill_random) {
    DecodeCheck pre_check = pre.check;
    reduce_check(world, pre_check);
    check.o.merge(pre_check.o), check.lse.merge(pre_check.lse), check.rows += pre_check.rows;
  }
  if (o.check && world.rank() == 0)
    std::printf("  check     %s: %d rows against fp64 over the whole sequence; O error %.2e (bound %.2e), LSE "
                "error %.2e (bound %.2e)\n",
                check.passed() ? "passed" : "FAILED", check.rows, check.o.error, check.o.bound(), check.lse.error,
                check.lse.bound());
  std::fflush(stdout);
  if (!o.json.empty() && world.rank() == 0) {
    RunSummary summary;
    summary.ranks = P, summary.nodes = session.nodes().nodes(), summary.batch = o.batch, summary.seq_len = o.seq_len;
    summary.heads = o.heads, summary.kv_heads = job.kv_heads, summary.head_dim = o.head_dim, summary.mask = mask;
    summary.layout = "zigzag", summary.schedule = "direct", summary.dtype = dtype_name(job.dtype);
    summary.backend = job.context.backend, summary.comm = job.context.comm, summary.threads = job.context.threads, summary.forward_s = token_s;
    // One step's visible pairs: each new token sees every cached key up to it (within the window).
    double pairs = 0;
    for (int64_t t = 0; t < o.tokens_per_step; ++t) {
      const double keys = double(total - o.tokens_per_step + t + 1);
      pairs += job.window_left < 0 ? keys : std::min(keys, double(job.window_left + 1));
    }
    summary.flops_forward = 4.0 * double(o.batch * o.heads * o.head_dim) * pairs;
    summary.gflops_per_rank = rate_per_rank(summary.flops_forward, token_s, P);
    summary.comm_bytes_sent = summary.comm_bytes_needed = r.bytes_per_step;
    summary.exposed_comm_fraction = token_s > 0 ? r.merge_seconds / double(r.step_s.size()) / token_s : 0.0;
    summary.peak_rss_bytes = uint64_t(rss[0]);
    if (o.check) summary.max_abs_err = check.o.error;
    Json j = summary_json(summary);
    j["prefill_s"] = pre.seconds;
    j["decode_token_s"] = token_s;
    j["decode_token_p95_s"] = p95;
    j["decode_bytes_per_token"] = bytes_per_token;
    j["cache_rows_min"] = rows_min;
    j["cache_rows_max"] = rows_max;
    j["prefill_method"] = job.fill_random ? "none" : inference::prefill_method_name(pre.method);
    j["new_tokens"] = o.new_tokens;
    j["tokens_per_step"] = o.tokens_per_step;
    j["interleave"] = o.interleave;
    j["merge_collective"] = r.collective;
    j["cache_bytes_per_rank"] = uint64_t(cache.bytes());
    j["kernel_bytes_per_s"] = kernel_rate;
    j["read_bandwidth_bytes_per_s"] = bandwidth;
    j["kernel_bandwidth_fraction"] = fraction;
    if (o.check) j["check_passed"] = check.passed();
    try {
      write_text_file(o.json, "--json", j.dump() + "\n");
    } catch (const std::exception& e) {
      print_error(message_of(e));
      return exit_code_of(e);
    }
  }
  if (o.check && !check.passed()) {
    if (world.rank() == 0) print_error("--check failed: decode outputs differ from fp64 attention");
    return kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace

int run_decode(LaunchContext& ctx) {
  comm::Communicator& comm = ctx.world;
  DecodeOptions opts;
  const po::options_description desc = describe(opts);
  const po::variables_map vm = parse_and_agree(comm, desc, ctx.args, "decode");
  if (vm.count("help")) {
    if (comm.rank() == 0)
      std::cout << "usage: ringattn decode [options]   (under mpirun -np P for P ranks)\n\n"
                   "Prefill a prompt into a KV cache sharded across the ranks, then decode against it.\n"
                   "Try: ringattn decode --seq-len 65536 --heads 32 --kv-heads 8 --dtype bf16 --prefill-method none\n\n"
                << desc << "\n";
    return 0;
  }
  const ArgumentNames names({{"capacity", "--capacity"},
                             {"method", "--prefill-method"},
                             {"tokens", "--tokens-per-step"},
                             {"cache", "the cache"}});
  DecodeJob job;
  agreed_phase(comm, [&] { job = resolve(opts, ctx, vm); });
  report_thread_binding(comm, job.context.threads, opts.threads > 0, ctx);
  comm.set_timeout(job.opt.timeout);
  std::unique_ptr<Session> session;
  agreed_phase(comm, [&] { session = open_session(comm, job.context, ctx.seam); });
  std::unique_ptr<inference::KVCache> cache;
  agreed_phase(comm, [&] {
    cache = std::make_unique<inference::KVCache>(
        session->backend(), comm.rank(), comm.size(),
        inference::CacheShape{job.opt.batch, job.kv_heads, job.opt.head_dim, job.capacity, job.opt.interleave, job.dtype});
  });
  const DecodeOptions& shape = job.opt;  // the files' shape, when given
  const TokenSource src(shape.seed, shape.seq_len + shape.new_tokens * shape.tokens_per_step, shape.heads, job.kv_heads,
                        shape.head_dim, job.dtype, job.files);
  // A prefill or a step that fails now is the same on every rank (the checks see the same
  // tables), but a peer may be inside a collective: end every rank.
  PrefillOutcome pre{};
  DecodeResults r;
  double rss = 0.0;
  try {
    pre = fill_cache(job, *session, *cache, src);
    r = run_steps(job, *session, *cache, src);
    rss = double(peak_rss_bytes());
  } catch (const ArgumentError& e) {
    agreed_phase(comm, [&] { throw e; });  // every rank found it (the same tables)
    return kExitUsage;
  } catch (const std::exception& e) {
    fail_now(comm, e);
  }
  return report(job, *session, *cache, pre, r, rss);
}

}  // namespace ringattn
