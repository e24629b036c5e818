#include "launch/attention_job.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>

#include "kernels/attention_cpu.hpp"
#include "launch/job_control.hpp"
#include "launch/job_util.hpp"
#include "launch/json.hpp"
#include "launch/mask_options.hpp"
#include "launch/options_util.hpp"
#include "runtime/backend.hpp"
#include "runtime/check.hpp"
#include "runtime/cluster_model.hpp"
#include "runtime/errors.hpp"
#include "runtime/npy.hpp"
#include "runtime/random_inputs.hpp"
#include "runtime/ring_attention.hpp"

namespace po = boost::program_options;

namespace ringattn {
namespace {

struct Options {
  std::string q, k, v, dout;
  std::string out, lse, dq, dk, dv;
  int64_t seq_len = 8192, batch = 1, heads = 8, kv_heads = 0, head_dim = 128;
  uint64_t seed = 0;
  double scale = 0.0;
  bool backward = false;
  MaskOptions mask;
  std::string layout, schedule = "direct", dtype = "fp32", backend, comm;
  int threads = 0, iters = 1, warmup = 0;
  bool check = false;
  int check_rows = 16;
  bool check_finite = false, no_check_finite = false;
  std::string json;
  double timeout = 300.0;
  bool progress = false;
  double emulate_bandwidth = 0.0, emulate_latency = 0.0;
};

po::options_description describe(Options& o) {
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
      ("seed", po::value(&o.seed)->default_value(0), "seed of random inputs, BigBird masks and --check rows")
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
  run.add_options()
      ("layout", po::value(&o.layout)->value_name("contiguous|zigzag|striped"),
       "token sharding over ranks (default: zigzag when causal, else contiguous)")
      ("schedule", po::value(&o.schedule)->default_value("direct")->value_name("direct|ring"),
       "direct: each rank's rows straight to the ranks that need them; ring: neighbour relay")
      ("dtype", po::value(&o.dtype)->default_value("fp32")->value_name("fp32|bf16"),
       "storage and transfer type (accumulation is fp32)")
      ("backend", po::value(&o.backend)->value_name("cpu|cuda"), "default: cuda when a GPU is visible, else cpu")
      ("comm", po::value(&o.comm)->value_name("mpi|nccl"), "default: nccl with the cuda backend, else mpi")
      ("threads", po::value(&o.threads)->default_value(0)->value_name("N"),
       "CPU threads per rank (0 = the node's cores shared among its ranks)")
      ("iters", po::value(&o.iters)->default_value(1)->value_name("N"), "timed repetitions (the median is reported)")
      ("warmup", po::value(&o.warmup)->default_value(0)->value_name("N"), "untimed repetitions first")
      ("check", po::bool_switch(&o.check), "compare sampled rows with an fp64 reference (exit 3 if off)")
      ("check-rows", po::value(&o.check_rows)->default_value(16)->value_name("N"), "rows sampled by --check")
      ("check-finite", po::bool_switch(&o.check_finite), "refuse NaN/Inf inputs (default for file inputs)")
      ("no-check-finite", po::bool_switch(&o.no_check_finite), "skip the NaN/Inf scan of file inputs")
      ("json", po::value(&o.json)->value_name("FILE"), "write a JSON summary (rank 0)")
      ("timeout", po::value(&o.timeout)->default_value(300.0)->value_name("SECONDS"),
       "end the job (exit 4) when a rank waits longer than this for a peer")
      ("progress", po::bool_switch(&o.progress), "show steps done and time left on stderr (a terminal)")
      ("emulate-bandwidth", po::value(&o.emulate_bandwidth)->default_value(0.0)->value_name("GBPS"),
       "MPI: delay transfers as a link of this bandwidth would (GB/s, 0 = off)")
      ("emulate-latency", po::value(&o.emulate_latency)->default_value(0.0)->value_name("US"),
       "MPI: add this latency to every transfer (microseconds)");
  po::options_description all("ringattn [attention] options");
  all.add_options()("help,h", "show this help");
  all.add(inputs).add(outputs).add(masks).add(run);
  return all;
}

// Everything the job needs, resolved and validated.
struct Job {
  Options opt;
  kernels::AttentionDims dims;
  int64_t seq_len = 0;
  bool files = false;
  bool backward = false;
  LayoutKind layout = LayoutKind::contiguous;
  Schedule schedule = Schedule::direct;
  DType dtype = DType::f32;
  int threads = 1;
  std::optional<NpyInfo> q_info, k_info, v_info, dout_info;
};

// Shape (B, L, heads, D) of a Q/K/V/dO file: 4-D, or 3-D with B = 1.
std::vector<int64_t> as_bshd(const NpyInfo& info) {
  if (info.shape.size() == 4) return info.shape;
  if (info.shape.size() == 3) return {1, info.shape[0], info.shape[1], info.shape[2]};
  throw UsageError(info.label + " " + info.path + ": expected a (B, L, H, D) or (L, H, D) array, got " +
                   std::to_string(info.shape.size()) + " dimensions");
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + ")";
}

Job resolve(const Options& o, const po::variables_map& vm, const LaunchContext& ctx) {
  Job job;
  job.opt = o;
  const int P = ctx.world.size();
  job.files = !o.q.empty() || !o.k.empty() || !o.v.empty();
  if (job.files && (o.q.empty() || o.k.empty() || o.v.empty()))
    throw UsageError("--q, --k and --v go together: give all three files, or none for random inputs");
  int64_t B = o.batch, L = o.seq_len, H = o.heads, Hkv = o.kv_heads ? o.kv_heads : o.heads, D = o.head_dim;
  if (job.files) {
    for (const char* name : {"seq-len", "batch", "heads", "kv-heads", "head-dim"})
      if (given(vm, name))
        throw UsageError(std::string("--") + name + " describes random inputs; with --q/--k/--v the shapes come from the files");
    job.q_info = inspect_npy(o.q, "--q");
    job.k_info = inspect_npy(o.k, "--k");
    job.v_info = inspect_npy(o.v, "--v");
    const auto qs = as_bshd(*job.q_info), ks = as_bshd(*job.k_info), vs = as_bshd(*job.v_info);
    B = qs[0], L = qs[1], H = qs[2], D = qs[3], Hkv = ks[2];
    if (ks != vs)
      throw UsageError("--k " + o.k + " has shape " + shape_text(job.k_info->shape) + " but --v " + o.v + " has " +
                       shape_text(job.v_info->shape));
    if (ks[0] != B || ks[1] != L || ks[3] != D)
      throw UsageError("--q " + o.q + " has shape " + shape_text(job.q_info->shape) + " but --k " + o.k + " has " +
                       shape_text(job.k_info->shape) + ": batch, length and head dim must agree");
  }
  if (B < 1 || L < 1 || H < 1 || Hkv < 1 || D < 1)
    throw UsageError("batch, seq-len, heads, kv-heads and head-dim must be positive");
  if (H % Hkv != 0)
    throw UsageError("heads " + std::to_string(H) + " is not a multiple of kv-heads " + std::to_string(Hkv) +
                     " (grouped-query attention needs Hkv to divide H)");
  if (!kernels::cpu_supports_head_dim(D))
    throw UsageError("head dim " + std::to_string(D) + " is not supported: use a multiple of 16 up to 512");
  if (L < P)
    throw UsageError("sequence length " + std::to_string(L) + " is smaller than the number of ranks " +
                     std::to_string(P));
  if (!o.dout.empty()) {
    if (!job.files) throw UsageError("--dout needs --q/--k/--v files (use --backward for random dO)");
    job.dout_info = inspect_npy(o.dout, "--dout");
    if (as_bshd(*job.dout_info) != as_bshd(*job.q_info))
      throw UsageError("--dout " + o.dout + " has shape " + shape_text(job.dout_info->shape) + " but Q has " +
                       shape_text(job.q_info->shape));
  }
  job.backward = o.backward || !o.dout.empty();
  if (!job.backward && (!o.dq.empty() || !o.dk.empty() || !o.dv.empty()))
    throw UsageError("--dq/--dk/--dv are gradients: they need --backward or --dout");
  if (o.iters < 1) throw UsageError("--iters must be at least 1");
  if (o.warmup < 0) throw UsageError("--warmup must not be negative");
  if (o.threads < 0) throw UsageError("--threads must not be negative");
  if (o.timeout <= 0) throw UsageError("--timeout must be positive");
  if (o.check_rows < 1) throw UsageError("--check-rows must be at least 1");
  if (o.scale < 0 || !std::isfinite(o.scale)) throw UsageError("--scale must be a positive number");
  if (o.emulate_bandwidth < 0 || o.emulate_latency < 0)
    throw UsageError("--emulate-bandwidth and --emulate-latency must not be negative");
  if (o.check_finite && o.no_check_finite) throw UsageError("--check-finite and --no-check-finite contradict");
  if (o.dtype == "fp32") job.dtype = DType::f32;
  else if (o.dtype == "bf16") job.dtype = DType::bf16;
  else throw UsageError("--dtype " + o.dtype + ": expected fp32 or bf16");
  if (!o.backend.empty() && o.backend != "cpu") {
    if (o.backend == "cuda") throw UsageError("--backend cuda: this build has no usable GPU backend");
    throw UsageError("--backend " + o.backend + ": expected cpu or cuda");
  }
  if (!o.comm.empty() && o.comm != "mpi") {
    if (o.comm == "nccl") throw UsageError("--comm nccl needs --backend cuda");
    throw UsageError("--comm " + o.comm + ": expected mpi or nccl");
  }
  job.layout = o.layout.empty() ? (o.mask.causal ? LayoutKind::zigzag : LayoutKind::contiguous)
                                : parse_layout(o.layout);
  job.schedule = parse_schedule(o.schedule);
  job.threads = o.threads ? o.threads : ctx.default_threads();
  job.seq_len = L;
  job.dims = kernels::AttentionDims{B, H, Hkv, D, o.scale > 0 ? float(o.scale) : 1.0f / std::sqrt(float(D))};
  return job;
}

// Reads (or generates) this rank's rows of a (B, L, heads*D) tensor, as fp32 on the host.
std::vector<float> load_rows(const Job& job, const std::optional<NpyInfo>& info, RandomTensor tensor, int64_t heads,
                             const std::vector<int64_t>& pos, bool scan_finite) {
  const int64_t B = job.dims.batch, D = job.dims.head_dim;
  std::vector<float> x(static_cast<size_t>(B * static_cast<int64_t>(pos.size()) * heads * D));
  if (!info) {
    random_rows(x.data(), job.opt.seed, tensor, B, job.seq_len, heads * D, pos.data(), static_cast<int64_t>(pos.size()));
    return x;
  }
  std::string note;
  read_npy_rows(*info, rows_along(info->shape, info->shape.size() == 4 ? 1 : 0, pos), x.data(), &note);
  if (scan_finite) {
    for (size_t i = 0; i < x.size(); ++i)
      if (!std::isfinite(x[i]))
        throw UsageError(info->label + " " + info->path + ": contains NaN or Inf (at sequence position " +
                         std::to_string(pos[(i / static_cast<size_t>(heads * D)) % pos.size()]) +
                         "); fix the input or pass --no-check-finite");
  }
  return x;
}

// Rank 0 shows "step s/n of pass p/q, elapsed, left" on a terminal.
class ProgressLine {
 public:
  ProgressLine(bool enabled, int passes) : enabled_(enabled && isatty(STDERR_FILENO)), passes_(passes) {
    start_ = std::chrono::steady_clock::now();
  }
  void step(int pass, int done, int steps) {
    if (!enabled_) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double fraction = (pass + double(done) / steps) / passes_;
    const double left = fraction > 0 ? elapsed * (1.0 - fraction) / fraction : 0.0;
    std::fprintf(stderr, "\r  pass %d/%d  step %d/%d  elapsed %.1f s  left ~%.1f s   ", pass + 1, passes_, done, steps,
                 elapsed, left);
    std::fflush(stderr);
  }
  ~ProgressLine() {
    if (enabled_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  int passes_;
  std::chrono::steady_clock::time_point start_;
};

// Writes this rank's rows of each requested output; the files appear only when every rank wrote.
void write_outputs(comm::Communicator& comm, const Job& job, const std::vector<int64_t>& pos,
                   const std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, const float*>>>& files,
                   const std::vector<std::pair<int64_t, int64_t>>& outer_inner) {
  std::vector<std::optional<NpyOutput>> outs(files.size());
  agreed_phase(comm, [&] {
    if (comm.rank() == 0)
      for (size_t i = 0; i < files.size(); ++i) outs[i] = NpyOutput::create(files[i].first, "output", files[i].second.first);
  });
  for (size_t i = 0; i < files.size(); ++i) {
    std::string temp = comm.rank() == 0 ? outs[i]->temp_path() : std::string();
    uint64_t n = temp.size();
    comm.broadcast(&n, sizeof n, 0);
    temp.resize(n);
    comm.broadcast(temp.data(), n, 0);
    if (comm.rank() != 0) outs[i].emplace(NpyOutput::open(files[i].first, temp, "output", files[i].second.first));
  }
  agreed_phase(comm, [&] {
    for (size_t i = 0; i < files.size(); ++i) {
      RowSelection rows{outer_inner[i].first, job.seq_len, outer_inner[i].second, pos};
      outs[i]->write_rows(rows, files[i].second.second);
      outs[i]->finish();
    }
  });
  agreed_phase(comm, [&] {
    if (comm.rank() == 0)
      for (auto& out : outs) out->commit();
  });
}

}  // namespace

int run_attention(LaunchContext& ctx) {
  comm::Communicator& comm = ctx.world;
  const int P = comm.size(), rank = comm.rank();
  Options opts;
  const po::options_description desc = describe(opts);
  Job job;
  bool help = false;
  const bool default_job = ctx.args.empty();
  agreed_phase(comm, [&] {
    const po::variables_map vm = parse_options(desc, ctx.args, "attention");
    if (vm.count("help")) {
      help = true;
      return;
    }
    if (default_job) {  // SPEC.md: with no options, a small self-checking job
      opts.mask.causal = true;
      opts.backward = true;
      opts.check = true;
    }
    agree_on_options(comm, canonical_options(vm));
    job = resolve(opts, vm, ctx);
  });
  if (help) {
    if (rank == 0)
      std::cout << "usage: ringattn [attention] [options]   (under mpirun -np P for P ranks)\n"
                   "       ringattn layer|bench|plan [options]\n\n"
                   "With no options: causal attention over 8192 random tokens, forward and backward,\n"
                   "checked against an fp64 reference.\n\n"
                << desc << "\n";
    return 0;
  }

  const ShardLayout layout(job.layout, job.seq_len, P);
  const std::vector<int64_t> pos = layout.positions(rank);
  const int64_t rows = static_cast<int64_t>(pos.size());
  const int64_t B = job.dims.batch, H = job.dims.heads, Hkv = job.dims.kv_heads, D = job.dims.head_dim;
  Mask mask;
  agreed_phase(comm, [&] {
    mask = build_mask(job.opt.mask, job.seq_len, job.opt.seed);
    if (rank == 0) dump_block_mask(job.opt.mask, mask);
  });

  // Inputs: each rank reads (or generates) only its own rows.
  auto backend = make_cpu_backend(job.threads);
  std::vector<float> q, k, v, dout;
  DeviceBuffer dq_in, dk_in, dv_in, ddo_in;
  const bool scan = job.files ? !job.opt.no_check_finite : job.opt.check_finite;
  agreed_phase(comm, [&] {
    q = load_rows(job, job.q_info, RandomTensor::q, H, pos, scan);
    k = load_rows(job, job.k_info, RandomTensor::k, Hkv, pos, scan);
    v = load_rows(job, job.v_info, RandomTensor::v, Hkv, pos, scan);
    if (job.backward) dout = load_rows(job, job.dout_info, RandomTensor::dout, H, pos, scan);
    dq_in = to_backend(*backend, q, job.dtype);
    dk_in = to_backend(*backend, k, job.dtype);
    dv_in = to_backend(*backend, v, job.dtype);
    if (job.backward) ddo_in = to_backend(*backend, dout, job.dtype);
  });
  if (!job.opt.check) {  // the host copies are only needed to check
    q = {}, k = {}, v = {};
    if (job.backward) dout = {};
  }

  comm.set_timeout(job.opt.timeout);
  comm.set_link_emulation(comm::LinkEmulation{job.opt.emulate_bandwidth, job.opt.emulate_latency});
  RingAttention ring(comm, *backend, layout, mask, RingOptions{job.dims, job.dtype, job.schedule});
  DeviceBuffer o_buf(*backend, sizeof(float) * static_cast<size_t>(B * rows * H * D));
  DeviceBuffer lse_buf(*backend, sizeof(float) * static_cast<size_t>(B * H * rows));
  DeviceBuffer dq_buf, dk_buf, dv_buf;
  if (job.backward) {
    dq_buf = DeviceBuffer(*backend, sizeof(float) * static_cast<size_t>(B * rows * H * D));
    dk_buf = DeviceBuffer(*backend, sizeof(float) * static_cast<size_t>(B * rows * Hkv * D));
    dv_buf = DeviceBuffer(*backend, sizeof(float) * static_cast<size_t>(B * rows * Hkv * D));
  }

  // Timed passes. Per iteration the job's time is the slowest rank's.
  const int passes = (job.opt.warmup + job.opt.iters) * (job.backward ? 2 : 1);
  std::vector<double> fwd_times, bwd_times;
  double wait_fraction_sum = 0.0, wait_fraction_max = 0.0;
  uint64_t bytes_sent = 0;
  {
    ProgressLine progress(job.opt.progress && rank == 0, passes);
    int pass = 0;
    try {
      for (int it = 0; it < job.opt.warmup + job.opt.iters; ++it) {
        const bool timed = it >= job.opt.warmup;
        comm.barrier();
        ring.on_step = [&](int done, int steps) { progress.step(pass, done, steps); };
        PassStats f = ring.forward(dq_in.data(), dk_in.data(), dv_in.data(), o_buf.as<float>(), lse_buf.as<float>());
        ++pass;
        double t = f.seconds;
        comm.allreduce(&t, 1, comm::DataType::f64, comm::ReduceOp::max);
        if (timed) {
          fwd_times.push_back(t);
          double frac[2] = {f.wait_seconds / std::max(f.seconds, 1e-12), 0.0};
          frac[1] = frac[0];
          comm.allreduce(&frac[0], 1, comm::DataType::f64, comm::ReduceOp::sum);
          comm.allreduce(&frac[1], 1, comm::DataType::f64, comm::ReduceOp::max);
          wait_fraction_sum += frac[0] / P;
          wait_fraction_max = std::max(wait_fraction_max, frac[1]);
          uint64_t sent = f.bytes_sent;
          comm.allreduce(&sent, 1, comm::DataType::i64, comm::ReduceOp::sum);
          bytes_sent = sent;
        }
        if (!job.backward) continue;
        comm.barrier();
        PassStats b = ring.backward(dq_in.data(), dk_in.data(), dv_in.data(), o_buf.as<float>(), lse_buf.as<float>(),
                                    ddo_in.data(), dq_buf.as<float>(), dk_buf.as<float>(), dv_buf.as<float>());
        ++pass;
        double tb = b.seconds;
        comm.allreduce(&tb, 1, comm::DataType::f64, comm::ReduceOp::max);
        if (timed) bwd_times.push_back(tb);
      }
    } catch (const std::exception& e) {
      fail_now(comm, e);  // a peer may be blocked in a transfer: end every rank now
    }
  }
  ring.on_step = nullptr;

  // Results on the host.
  const std::vector<float> o = download(*backend, o_buf), lse = download(*backend, lse_buf);
  std::vector<float> dq, dk, dv;
  if (job.backward) dq = download(*backend, dq_buf), dk = download(*backend, dk_buf), dv = download(*backend, dv_buf);

  std::optional<CheckReport> check;
  if (job.opt.check) {
    agreed_phase(comm, [&] {
      CheckTensors t{q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data()};
      check = check_sampled_rows(comm, layout, mask, job.dims, t, job.backward, job.opt.check_rows, job.opt.seed);
    });
  }
  const bool check_failed = check && !check->passed();

  // Work and traffic, summed over ranks.
  int64_t pairs = count_visible_pairs(mask.view(), layout.runs(rank), job.seq_len);
  comm.allreduce(&pairs, 1, comm::DataType::i64, comm::ReduceOp::sum);
  uint64_t needed = ring.bytes_needed();
  comm.allreduce(&needed, 1, comm::DataType::i64, comm::ReduceOp::sum);
  uint64_t rss = peak_rss_bytes();
  comm.allreduce(&rss, 1, comm::DataType::i64, comm::ReduceOp::max);
  const double flops = 4.0 * double(B) * double(H) * double(D) * double(pairs);
  const double fwd_s = median_of(fwd_times), bwd_s = job.backward ? median_of(bwd_times) : 0.0;
  const double gflops_rank = flops / fwd_s / P / 1e9;

  if (!check_failed) {
    std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, const float*>>> files;
    std::vector<std::pair<int64_t, int64_t>> outer_inner;
    const std::vector<int64_t> qshape = job.q_info ? job.q_info->shape : std::vector<int64_t>{B, job.seq_len, H, D};
    const std::vector<int64_t> kshape = job.k_info ? job.k_info->shape : std::vector<int64_t>{B, job.seq_len, Hkv, D};
    auto add = [&](const std::string& path, std::vector<int64_t> shape, const float* data, int64_t outer,
                   int64_t inner) {
      if (path.empty()) return;
      files.push_back({path, {std::move(shape), data}});
      outer_inner.push_back({outer, inner});
    };
    add(job.opt.out, qshape, o.data(), B, H * D);
    add(job.opt.lse, {B, H, job.seq_len}, lse.data(), B * H, 1);
    if (job.backward) {
      add(job.opt.dq, qshape, dq.data(), B, H * D);
      add(job.opt.dk, kshape, dk.data(), B, Hkv * D);
      add(job.opt.dv, kshape, dv.data(), B, Hkv * D);
    }
    if (!files.empty()) write_outputs(comm, job, pos, files, outer_inner);
  }

  if (rank == 0) {
    Json j = Json::object();
    j["ranks"] = P;
    j["batch"] = B;
    j["seq_len"] = job.seq_len;
    j["heads"] = H;
    j["kv_heads"] = Hkv;
    j["head_dim"] = D;
    j["mask"] = mask.describe();
    j["layout"] = layout_name(job.layout);
    j["schedule"] = schedule_name(job.schedule);
    j["dtype"] = dtype_name(job.dtype);
    j["backend"] = backend->name();
    j["comm"] = comm.name();
    j["threads"] = job.threads;
    j["isa"] = kernels::cpu_isa();
    j["iters"] = job.opt.iters;
    j["forward_s"] = fwd_s;
    if (job.backward) j["backward_s"] = bwd_s;
    j["flops_forward"] = flops;
    j["gflops_per_rank"] = gflops_rank;
    if (job.backward) j["gflops_per_rank_backward"] = 2.5 * flops / bwd_s / P / 1e9;
    j["comm_bytes_sent"] = bytes_sent;
    j["comm_bytes_needed"] = needed;
    j["exposed_comm_fraction"] = wait_fraction_sum / job.opt.iters;
    j["exposed_comm_fraction_max"] = wait_fraction_max;
    j["peak_rss_bytes"] = rss;
    if (check) {
      j["max_abs_err"] = check->max_abs_err();
      j["check_passed"] = check->passed();
      j["check_rows"] = check->samples;
    }
    if (job.opt.emulate_bandwidth > 0 || job.opt.emulate_latency > 0) {
      j["emulate_bandwidth_gbps"] = job.opt.emulate_bandwidth;
      j["emulate_latency_us"] = job.opt.emulate_latency;
    }
    if (!job.opt.json.empty()) {
      try {
        write_text_file(job.opt.json, "--json", j.dump() + "\n");
      } catch (const std::exception& e) {
        print_error(e.what());
        return exit_code_of(e);
      }
    }

    std::printf("ringattn  %d rank%s x %d thread%s  backend %s (%s)  comm %s\n", P, P > 1 ? "s" : "", job.threads,
                job.threads > 1 ? "s" : "", backend->name(), kernels::cpu_isa(), comm.name());
    std::printf("  shape     batch %lld  seq_len %lld  heads %lld (kv %lld)  head_dim %lld  %s\n", (long long)B,
                (long long)job.seq_len, (long long)H, (long long)Hkv, (long long)D, dtype_name(job.dtype));
    std::printf("  mask      %s   layout %s   schedule %s\n", mask.describe().c_str(), layout_name(job.layout),
                schedule_name(job.schedule));
    std::printf("  forward   %.4f s  (median of %d)  %.3g GFLOP  %.1f GFLOP/s per rank\n", fwd_s, job.opt.iters,
                flops / 1e9, gflops_rank);
    if (job.backward)
      std::printf("  backward  %.4f s  (median of %d)  %.3g GFLOP  %.1f GFLOP/s per rank\n", bwd_s, job.opt.iters,
                  2.5 * flops / 1e9, 2.5 * flops / bwd_s / P / 1e9);
    std::printf("  comm      forward K/V sent %s, needed %s", human_bytes(double(bytes_sent)).c_str(),
                human_bytes(double(needed)).c_str());
    if (needed > 0) std::printf(" (%.2fx)", double(bytes_sent) / double(needed));
    std::printf("; exposed %.1f%% of forward\n", 100.0 * wait_fraction_sum / job.opt.iters);
    std::printf("  memory    peak %s per rank (max)\n", human_bytes(double(rss)).c_str());
    if (check)
      std::printf("  check     %s on %d sampled rows: %s\n", check->passed() ? "passed" : "FAILED", check->samples,
                  check->describe().c_str());
    std::fflush(stdout);
  }
  if (check_failed) {
    if (rank == 0) print_error("--check failed: results differ from the fp64 reference; outputs were not written");
    return kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace ringattn
