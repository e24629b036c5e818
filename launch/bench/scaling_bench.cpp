#include "launch/bench/scaling_bench.hpp"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "kernels/cpu/attention_cpu.hpp"
#include "launch/cli/cpu_binding.hpp"
#include "launch/cli/job_control.hpp"
#include "launch/cli/execution.hpp"
#include "launch/cli/job_util.hpp"
#include "launch/cli/mask_options.hpp"
#include "launch/cli/options_util.hpp"
#include "launch/bench/scaling_report.hpp"
#include "launch/cli/statistics.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/check.hpp"
#include "launch/plan/auto_configure.hpp"
#include "launch/plan/cluster_model.hpp"
#include "runtime/errors.hpp"
#include "runtime/random_inputs.hpp"
#include "runtime/placement.hpp"
#include "runtime/session.hpp"
#include "runtime/ulysses_attention.hpp"

namespace po = boost::program_options;

namespace ringattn {
namespace {

struct BenchOptions : ExecutionOptions {
  BenchOptions() { iters = 3, warmup = 1; }  // a median and a p95 per point, after a warm-up
  std::string mode = "strong", ranks;
  int64_t seq_len = 4096, tokens_per_rank = 2048, batch = 1, heads = 8, kv_heads = 0, head_dim = 128;
  uint64_t seed = 0;
  MaskOptions mask;
  int check_rows = 16;
  bool forward_only = false, no_check = false;
  std::string json, csv;
  std::string ulysses = "1";
  double emulate_intra_bandwidth = 0.0, emulate_intra_latency = 0.0;
  AutoOptions auto_options;  // --auto: each point's layout, schedule and Ulysses degree chosen for it
};

po::options_description describe(BenchOptions& o) {
  po::options_description sweep("Sweep");
  sweep.add_options()
      ("mode", po::value(&o.mode)->default_value("strong")->value_name("strong|weak"),
       "strong: fixed --seq-len; weak: fixed --tokens-per-rank (the sequence grows with the ranks)")
      ("ranks", po::value(&o.ranks)->value_name("P1,P2,..."),
       "rank counts to run (default: 1, 2, 4, ... up to the job's ranks)")
      ("seq-len", po::value(&o.seq_len)->default_value(4096)->value_name("L"), "strong scaling: sequence length")
      ("tokens-per-rank", po::value(&o.tokens_per_rank)->default_value(2048)->value_name("T"),
       "weak scaling: tokens per rank (L = T * ranks)");
  po::options_description shape("Shape (random inputs, seeded: every point sees the same tensors)");
  shape.add_options()
      ("batch", po::value(&o.batch)->default_value(1)->value_name("B"), "batch")
      ("heads", po::value(&o.heads)->default_value(8)->value_name("H"), "query heads")
      ("kv-heads", po::value(&o.kv_heads)->default_value(0)->value_name("HKV"), "key/value heads, dividing H (0 = H)")
      ("head-dim", po::value(&o.head_dim)->default_value(128)->value_name("D"), "head dim")
      ("seed", po::value(&o.seed)->default_value(0)->value_name("S"), "seed of the inputs, BigBird masks and checked rows");
  po::options_description masks("Masks (combined by intersection)");
  add_mask_options(masks, o.mask);
  po::options_description run("Execution");
  add_ring_options(run, o.fields());
  run.add_options()
      ("ulysses", po::value(&o.ulysses)->default_value("1")->value_name("U1,U2,..."),
       "hybrid parallelism: a point per U (and rank count it divides): all-to-all inside groups of U ranks, "
       "the ring across the P/U groups (1 = ring only)");
  add_hybrid_options(run, nullptr, &o.emulate_intra_bandwidth, &o.emulate_intra_latency);
  add_auto_options(run, o.auto_options);
  run.add_options()
      ("forward-only", po::bool_switch(&o.forward_only), "time the forward pass only (default: forward and backward)")
      ("check-rows", po::value(&o.check_rows)->default_value(16)->value_name("N"), "rows checked against fp64 per point")
      ("no-check", po::bool_switch(&o.no_check), "skip the per-point check")
      ("json", po::value(&o.json)->value_name("FILE"), "write {\"config\", \"points\"} (rank 0)")
      ("csv", po::value(&o.csv)->value_name("FILE"), "write one line per point (rank 0)");
  po::options_description all(
      "ringattn bench options (ringattn bench --kernel --help: the kernel benchmark; --decode --help: the decode kernel's)");
  all.add_options()("help,h", "show this help");
  all.add(sweep).add(shape).add(masks).add(run);
  return all;
}

struct Bench {
  BenchOptions opt;
  bool weak = false, backward = true, check = true;
  std::vector<int> ranks;
  std::vector<int> ulysses;  // --ulysses degrees; a point for each that divides the point's ranks
  std::vector<AttentionSpec> specs;  // one per point (the sequence length differs in weak scaling); ulysses 1
  kernels::AttentionDims dims;
  LayoutKind layout = LayoutKind::contiguous;
  Schedule schedule = Schedule::direct;
  AutoSettings auto_settings;  // --auto; its fixed.ulysses set per point when --ulysses is given
  DType dtype = DType::f32;
  int threads = 1;
  ExecutionChoice execution;  // backend and communicator
  int64_t seq_len(int P) const { return weak ? opt.tokens_per_rank * P : opt.seq_len; }
};

Bench resolve(const BenchOptions& o, const po::variables_map& vm, const LaunchContext& ctx) {
  Bench b;
  b.opt = o;
  const int W = ctx.world.size();
  if (o.mode != "strong" && o.mode != "weak") throw usage_error("--mode " + o.mode + ": expected strong or weak");
  b.weak = o.mode == "weak";
  if (b.weak && given(vm, "seq-len")) throw usage_error("--seq-len is for --mode strong; weak scaling takes --tokens-per-rank");
  if (!b.weak && given(vm, "tokens-per-rank")) throw usage_error("--tokens-per-rank is for --mode weak");
  if (o.ranks.empty()) {
    for (int P = 1; P <= W; P *= 2) b.ranks.push_back(P);
  } else {
    for (int64_t P : parse_int_list(o.ranks, "--ranks")) {
      if (P < 1 || P > W)
        throw usage_error("--ranks " + o.ranks + ": " + std::to_string(P) + " is not between 1 and the job's " +
                         std::to_string(W) + " ranks (start more with mpirun -np)");
      b.ranks.push_back(static_cast<int>(P));
    }
    std::sort(b.ranks.begin(), b.ranks.end());
    b.ranks.erase(std::unique(b.ranks.begin(), b.ranks.end()), b.ranks.end());
  }
  const int64_t Hkv = o.kv_heads ? o.kv_heads : o.heads;
  if (o.tokens_per_rank < 1) throw usage_error("--tokens-per-rank " + std::to_string(o.tokens_per_rank) + " must be positive");
  b.execution = choose_execution(o.backend, o.comm, ctx);
  check_execution_options(o);
  if (o.check_rows < 1) throw usage_error("--check-rows " + std::to_string(o.check_rows) + ": must be at least 1");
  b.dtype = parse_dtype_option(o.dtype);
  b.layout = layout_option(o.layout, o.mask.causal);
  for (int64_t U : parse_int_list(o.ulysses, "--ulysses")) {
    if (U < 1 || U > W)
      throw usage_error("--ulysses " + o.ulysses + ": " + std::to_string(U) + " is not between 1 and the job's " +
                       std::to_string(W) + " ranks");
    if (auto bad = check_ulysses(int(U), int(U), o.heads, Hkv)) throw *bad;  // H (and Hkv) against U; P per point
    if (std::none_of(b.ranks.begin(), b.ranks.end(), [&](int P) { return P % U == 0; }))
      throw usage_error("--ulysses " + std::to_string(U) + " divides none of the rank counts (--ranks)");
    b.ulysses.push_back(int(U));
  }
  std::sort(b.ulysses.begin(), b.ulysses.end());
  b.ulysses.erase(std::unique(b.ulysses.begin(), b.ulysses.end()), b.ulysses.end());
  b.schedule = parse_schedule(o.schedule);
  b.auto_settings = resolve_auto_options(o.auto_options, vm);
  if (given(vm, "layout")) b.auto_settings.fixed.layout = b.layout;
  if (given(vm, "schedule")) b.auto_settings.fixed.schedule = b.schedule;
  b.backward = !o.forward_only;
  b.check = !o.no_check;
  b.threads = o.threads ? o.threads : ctx.default_threads();
  b.dims = kernels::AttentionDims{o.batch, o.heads, Hkv, o.head_dim, 1.0f / std::sqrt(float(o.head_dim))};
  const Shard shard{o.batch, 1, o.heads, Hkv, o.head_dim, api::element_type_of(b.dtype)};
  const ContextOptions context = context_options(b.execution, b.opt, b.threads, o.emulate_intra_bandwidth,
                                                 o.emulate_intra_latency);
  if (auto bad = api::check_options(context)) throw *bad;
  if (auto bad = api::check_shard(shard, b.execution.backend == "cuda")) throw *bad;
  for (int P : b.ranks) {
    AttentionSpec spec;
    spec.mask = mask_spec(o.mask, b.seq_len(P), o.seed);
    spec.layout = layout_spec(o.layout);
    spec.schedule = schedule_spec(o.schedule);
    spec.kernel = kernel_spec(o.kernel);
    spec.deterministic = o.deterministic;
    for (auto bad : {api::check_spec(spec), api::check_call(shard, spec, b.seq_len(P), P)})
      if (bad) throw *bad;
    b.specs.push_back(std::move(spec));
  }
  // Strong scaling has one mask; weak scaling one per length, and the largest is the one to inspect.
  if (ctx.world.rank() == 0) dump_block_mask(o.mask, api::build_mask(b.specs.back(), b.seq_len(b.ranks.back())));
  return b;
}

// Peak resident memory of one point: Linux resets the high-water mark on request (after the
// memory the previous point freed went back to the system).
bool reset_peak_rss() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  std::ofstream f("/proc/self/clear_refs");
  return f && (f << "5").flush();
}

uint64_t point_peak_rss(bool was_reset) {
  std::ifstream f("/proc/self/status");
  for (std::string line; was_reset && std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return uint64_t(std::stoull(line.substr(6))) * 1024;
  return peak_rss_bytes();  // since the process started
}

// Medians over iterations of values reduced over the ranks each iteration.
struct PassSeries {
  std::vector<double> slowest, mean, compute, wait, exposed;
  uint64_t bytes_sent = 0;

  void add(comm::Communicator& comm, const RingStats& s) {
    const int P = comm.size();
    double slow = s.seconds;
    double sums[4] = {s.seconds, s.compute_seconds, s.wait_seconds, s.wait_seconds / std::max(s.seconds, 1e-12)};
    uint64_t sent = s.bytes_sent;
    comm.allreduce(&slow, 1, DType::f64, comm::ReduceOp::max);
    comm.allreduce(sums, 4, DType::f64, comm::ReduceOp::sum);
    comm.allreduce(&sent, 1, DType::i64, comm::ReduceOp::sum);
    slowest.push_back(slow);
    mean.push_back(sums[0] / P), compute.push_back(sums[1] / P), wait.push_back(sums[2] / P);
    exposed.push_back(sums[3] / P);
    bytes_sent = sent;
  }
};

// Runs one point on the ranks of `comm`; every rank returns the same point. The attention runs
// through the runtime's session over the point's ranks, as the attention job's does.
ScalingPoint run_point(comm::Communicator& comm, const Bench& b, size_t index, int ulysses, bool ulysses_given,
                       const TestSeam& seam) {
  const int P = comm.size(), rank = comm.rank();
  const int64_t L = b.seq_len(P);
  const kernels::AttentionDims& dims = b.dims;
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim;
  const bool was_reset = reset_peak_rss();

  // The emulated links: --emulate-* between ranks (between groups with --ulysses), and the link
  // inside the groups. The point's plan gives this rank's rows (with --ulysses, placed on nodes).
  std::unique_ptr<Session> session;
  agreed_phase(comm, [&] {
    session = open_session(comm, context_options(b.execution, b.opt, b.threads, b.opt.emulate_intra_bandwidth,
                                                 b.opt.emulate_intra_latency),
                           seam);
  });
  AttentionSpec spec = b.specs[index];
  spec.ulysses = ulysses;
  const Shard shard{B, 0, H, Hkv, D, api::element_type_of(b.dtype)};
  std::optional<AutoConfigured> chosen;
  if (b.auto_settings.options.enabled) {  // for this point's ranks, before its plan
    AutoSettings settings = b.auto_settings;
    if (ulysses_given) settings.fixed.ulysses = ulysses;
    chosen = configure_automatically(*session, AutoJob{shard, spec, L, b.backward}, settings, comm.rank() == 0);
    spec = chosen->spec;
  }
  AttentionPlan* plan = nullptr;
  agreed_phase(comm, [&] { plan = &session->plan(shard, spec, L); });
  UlyssesAttention& attention = plan->attention();
  const ShardLayout& layout = plan->layout();
  const Mask& mask = plan->mask();
  const std::vector<int64_t>& pos = plan->positions();
  const int64_t rows = plan->rows();
  AttentionBackend* backend = &session->backend();
  auto random_input = [&](RandomTensor t, int64_t heads) {
    std::vector<float> x(static_cast<size_t>(B * rows * heads * D));
    random_rows(x.data(), b.opt.seed, t, B, L, heads * D, pos.data(), rows);
    return x;
  };
  std::vector<float> q = random_input(RandomTensor::q, H), k = random_input(RandomTensor::k, Hkv);
  std::vector<float> v = random_input(RandomTensor::v, Hkv), dout;
  if (b.backward) dout = random_input(RandomTensor::dout, H);
  const DeviceBuffer q_in = to_backend(*backend, q, b.dtype), k_in = to_backend(*backend, k, b.dtype);
  const DeviceBuffer v_in = to_backend(*backend, v, b.dtype);
  DeviceBuffer dout_in;
  if (b.backward) dout_in = to_backend(*backend, dout, b.dtype);
  // fp32 in host memory: the check reads the backend's buffers, so no rank holds a second copy.
  const bool host_fp32 = backend->memory() == comm::MemorySpace::host && b.dtype == DType::f32;
  if (!b.check || host_fp32) q = {}, k = {}, v = {}, dout = {};

  uint64_t a2a_bytes = 0, needed = 0;
  auto f32 = [&](int64_t n) { return DeviceBuffer(*backend, sizeof(float) * static_cast<size_t>(n)); };
  const DeviceBuffer o = f32(B * rows * H * D), lse = f32(B * H * rows);
  DeviceBuffer dq, dk, dv;
  if (b.backward) dq = f32(B * rows * H * D), dk = f32(B * rows * Hkv * D), dv = f32(B * rows * Hkv * D);

  PassSeries fwd, bwd;
  for (int it = 0; it < b.opt.warmup + b.opt.iters; ++it) {
    const bool timed = it >= b.opt.warmup;
    comm.barrier();
    const RingStats f =
        ring_stats(attention.forward(q_in.data(), k_in.data(), v_in.data(), o.as<float>(), lse.as<float>()), attention);
    a2a_bytes = f.a2a_bytes_sent, needed = f.bytes_needed;
    PassSeries ignored;
    (timed ? fwd : ignored).add(comm, f);
    if (!b.backward) continue;
    comm.barrier();
    const RingStats g = ring_stats(attention.backward(q_in.data(), k_in.data(), v_in.data(), o.as<float>(),
                                                      lse.as<float>(), dout_in.data(), dq.as<float>(), dk.as<float>(),
                                                      dv.as<float>(), attention.last_forward()),
                                   attention);
    (timed ? bwd : ignored).add(comm, g);
  }

  ScalingPoint pt;
  pt.ranks = P;
  pt.ulysses = spec.ulysses;
  pt.layout = layout_name(chosen ? chosen->chosen.layout : b.layout);
  pt.schedule = schedule_name(chosen ? chosen->chosen.schedule : b.schedule);
  if (chosen) pt.auto_choice = chosen->json;
  pt.nodes = session->nodes().nodes();  // the point's ranks may span fewer nodes than the job's
  pt.seq_len = L;
  if (b.check) {
    const bool host = backend->memory() == comm::MemorySpace::host;
    auto host_view = [&](const DeviceBuffer& buf, std::vector<float>& copy) -> const float* {
      if (host || !buf.data()) return buf.as<float>();
      copy = download(*backend, buf);
      return copy.data();
    };
    std::vector<float> copies[5];
    CheckTensors t;
    t.q = host_fp32 ? q_in.as<float>() : q.data();
    t.k = host_fp32 ? k_in.as<float>() : k.data();
    t.v = host_fp32 ? v_in.as<float>() : v.data();
    t.dout = host_fp32 ? dout_in.as<float>() : dout.data();
    t.o = host_view(o, copies[0]), t.lse = host_view(lse, copies[1]);
    t.dq = host_view(dq, copies[2]), t.dk = host_view(dk, copies[3]), t.dv = host_view(dv, copies[4]);
    const CheckReport report = check_sampled_rows(comm, layout, mask, dims, t, b.backward, b.opt.check_rows, b.opt.seed,
                                                  backend->same_precision(dims, b.dtype));
    pt.checked = true;
    pt.check_passed = report.passed();
    pt.max_abs_err = report.max_abs_err();
    pt.wrong = report.wrong();  // tensors over kernels/error_rule.hpp's bound (a NaN is one)
  }

  int64_t pairs = count_visible_pairs(mask.view(), layout.runs(rank), L);
  uint64_t rss = point_peak_rss(was_reset);
  comm.allreduce(&pairs, 1, DType::i64, comm::ReduceOp::sum);
  comm.allreduce(&needed, 1, DType::i64, comm::ReduceOp::sum);
  comm.allreduce(&a2a_bytes, 1, DType::i64, comm::ReduceOp::sum);
  pt.a2a_bytes_sent = a2a_bytes;
  comm.allreduce(&rss, 1, DType::i64, comm::ReduceOp::max);
  pt.flops_forward = 4.0 * double(B * H * D) * double(pairs);
  pt.bytes_needed = needed;
  pt.peak_rss = rss;
  pt.bytes_sent = fwd.bytes_sent;
  pt.forward_s = median_of(fwd.slowest), pt.forward_p95_s = percentile_of(fwd.slowest, 95);
  pt.forward_mean_s = median_of(fwd.mean), pt.forward_compute_s = median_of(fwd.compute);
  pt.forward_wait_s = median_of(fwd.wait), pt.exposed_forward = median_of(fwd.exposed);
  if (b.backward) {
    pt.backward_s = median_of(bwd.slowest), pt.backward_p95_s = percentile_of(bwd.slowest, 95);
    pt.backward_mean_s = median_of(bwd.mean), pt.backward_compute_s = median_of(bwd.compute);
    pt.backward_wait_s = median_of(bwd.wait), pt.exposed_backward = median_of(bwd.exposed);
  }
  return pt;
}

void set_efficiency(ScalingPoint& p, const ScalingPoint& base) {
  p.efficiency_forward = scaling_efficiency({p.ranks, p.flops_forward, p.forward_s}, {base.ranks, base.flops_forward, base.forward_s});
  p.efficiency = p.efficiency_forward;
  if (p.backward_s > 0 && base.backward_s > 0) {
    p.efficiency_backward = scaling_efficiency({p.ranks, 2.5 * p.flops_forward, p.backward_s},
                                               {base.ranks, 2.5 * base.flops_forward, base.backward_s});
    p.efficiency = scaling_efficiency({p.ranks, 3.5 * p.flops_forward, p.forward_s + p.backward_s},
                                      {base.ranks, 3.5 * base.flops_forward, base.forward_s + base.backward_s});
  }
}

}  // namespace

int run_scaling_bench(LaunchContext& ctx, const std::vector<std::string>& args) {
  comm::Communicator& world = ctx.world;
  BenchOptions opts;
  const po::options_description desc = describe(opts);
  Bench b;
  // Parse, agree, then validate: each its own agreed phase.
  const po::variables_map vm = parse_and_agree(world, desc, args, "bench");
  const bool help = vm.count("help") > 0;
  if (!help) agreed_phase(world, [&] { b = resolve(opts, vm, ctx); });
  if (help) {
    if (world.rank() == 0)
      std::cout << "usage: mpirun -np P ringattn bench [options]   (ringattn bench --kernel: the kernel benchmark; --decode: the decode kernel against the memory bandwidth)\n\n"
                   "Strong or weak scaling of ring attention over 1, 2, 4, ... ranks of the job, each point\n"
                   "checked against an fp64 reference (exit 3 when one is wrong).\n\n"
                << desc << "\n";
    return 0;
  }
  report_thread_binding(world, b.threads, b.opt.threads > 0, ctx);

  ScalingSetup setup;
  setup.weak = b.weak, setup.backward = b.backward, setup.ranks = b.ranks;
  setup.job_ranks = world.size(), setup.hardware_threads = ctx.hardware_threads, setup.threads = b.threads;
  setup.nodes = ctx.nodes;
  setup.seq_len = b.opt.seq_len, setup.tokens_per_rank = b.opt.tokens_per_rank;
  setup.batch = b.dims.batch, setup.heads = b.dims.heads, setup.kv_heads = b.dims.kv_heads;
  setup.head_dim = b.dims.head_dim;
  setup.mask = api::build_mask(b.specs.front(), b.seq_len(b.ranks.front())).describe(), setup.mask_options = b.opt.mask;
  const AutoFixed& fixed = b.auto_settings.fixed;
  const bool chosen = b.auto_settings.options.enabled;
  setup.layout = chosen && !fixed.layout ? "auto" : layout_name(b.layout);
  setup.schedule = chosen && !fixed.schedule ? "auto" : schedule_name(b.schedule);
  setup.dtype = dtype_name(b.dtype);
  setup.backend = b.execution.backend, setup.comm = b.execution.comm;
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  setup.host = host, setup.cpu = cpu_model(), setup.isa = kernels::cpu_isa();
  setup.iters = b.opt.iters, setup.warmup = b.opt.warmup, setup.check_rows = b.check ? b.opt.check_rows : 0;
  setup.seed = b.opt.seed;
  setup.emulate_bandwidth = b.opt.emulate_bandwidth, setup.emulate_latency = b.opt.emulate_latency;
  setup.emulate_intra_bandwidth = b.opt.emulate_intra_bandwidth;
  setup.emulate_intra_latency = b.opt.emulate_intra_latency;
  if (world.rank() == 0) print_scaling_header(setup);

  std::vector<ScalingPoint> points;
  for (size_t i = 0; i < b.ranks.size(); ++i) {
    for (int U : b.ulysses) {  // a point per --ulysses degree that divides P
      const int P = b.ranks[i];
      if (P % U != 0) continue;
      world.set_timeout(b.opt.timeout);
      std::unique_ptr<comm::Communicator> sub = world.split(world.rank() < P ? 0 : -1, world.rank());
      ScalingPoint pt;
      if (sub) {
        try {
          pt = run_point(*sub, b, i, U, given(vm, "ulysses"), ctx.seam);
        } catch (const std::exception& e) {
          // Ranks of the point may be blocked in a transfer, and those outside it wait at the
          // barrier below: end them all (a failure the point's ranks agreed on is reported already).
          fail_now(world, e);
        }
      }
      sub.reset();
      world.set_timeout(1e9);  // the ranks outside the point wait for as long as it takes
      world.barrier();
      world.set_timeout(b.opt.timeout);
      set_efficiency(pt, points.empty() ? pt : points.front());
      points.push_back(pt);
      if (world.rank() == 0) print_scaling_row(pt, setup);
    }
  }
  int wrong = 0;
  for (const ScalingPoint& p : points) wrong += p.wrong;
  world.allreduce(&wrong, 1, DType::i32, comm::ReduceOp::max);  // rank 0 was in every point

  if (world.rank() == 0) print_scaling_footer(points, setup);
  agreed_phase(world, [&] {
    if (world.rank() != 0) return;
    if (!b.opt.json.empty()) {
      Json out = Json::object(), list = Json::array();
      for (const ScalingPoint& p : points) list.push_back(scaling_point_json(p, setup));
      out["config"] = scaling_config_json(setup);
      out["points"] = list;
      write_text_file(b.opt.json, "--json", out.dump() + "\n");
    }
    if (!b.opt.csv.empty()) write_text_file(b.opt.csv, "--csv", scaling_csv(points, setup));
  });
  if (wrong) throw JobFailed(kExitCheckFailed);
  return kExitOk;
}

}  // namespace ringattn
