// `ringattn [attention]`: parse, resolve, open the session and its plan, load the inputs, run
// the timed passes, check, write the outputs, report. Each phase is a function of its own below;
// the phases that involve no communication run as agreed phases (launch/cli/job_control.hpp).
#include "launch/attention/attention_job.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "launch/attention/attention_inputs.hpp"
#include "launch/attention/attention_options.hpp"
#include "launch/attention/attention_report.hpp"
#include "launch/cli/argument_names.hpp"
#include "launch/cli/cpu_binding.hpp"
#include "launch/cli/execution.hpp"
#include "launch/cli/job_control.hpp"
#include "launch/cli/job_util.hpp"
#include "launch/cli/npy_outputs.hpp"
#include "launch/cli/options_util.hpp"
#include "runtime/check.hpp"
#include "runtime/errors.hpp"
#include "runtime/session.hpp"
#include "util/stopwatch.hpp"

namespace po = boost::program_options;

namespace ringattn {
namespace {

// Rank 0 reports steps done and time left: on a terminal one line rewritten in place; otherwise
// (under mpirun a rank's stderr is a pipe to mpirun) a new line every few seconds.
class ProgressLine {
 public:
  // weights[p]: the expected cost of pass p (a backward pass costs about 2.5 forward passes).
  ProgressLine(bool enabled, std::vector<double> weights)
      : enabled_(enabled), tty_(isatty(STDERR_FILENO)), passes_(static_cast<int>(weights.size())),
        weights_(std::move(weights)) {
    for (double w : weights_) total_ += w;
  }
  void step(int pass, int done, int steps) {
    if (!enabled_) return;
    const double elapsed = clock_.seconds();
    const bool last = pass + 1 == passes_ && done == steps;
    if (!last && elapsed - shown_ < (tty_ ? 0.1 : 2.0)) return;
    shown_ = elapsed;
    double before = 0.0;
    for (int p = 0; p < pass; ++p) before += weights_[static_cast<size_t>(p)];
    const double fraction = (before + weights_[static_cast<size_t>(pass)] * done / steps) / total_;
    const double left = fraction > 0 ? elapsed * (1.0 - fraction) / fraction : 0.0;
    std::fprintf(stderr, "%spass %d/%d  step %d/%d  elapsed %.1f s  left ~%.1f s%s", tty_ ? "\r  " : "  ", pass + 1,
                 passes_, done, steps, elapsed, left, tty_ ? "   " : "\n");
    std::fflush(stderr);
  }
  ~ProgressLine() {
    if (enabled_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_, tty_;
  int passes_;
  std::vector<double> weights_;
  double total_ = 0.0;
  Stopwatch clock_;  // from the start of the first pass
  double shown_ = -1e9;
};

// Where the job computes: the session and the plan of what the ring computes (with
// RINGATTN_TEST_FAULT, something slightly wrong that --check must catch), and the true mask the
// check judges by (the plan's own, unless a fault changed the spec).
struct Open {
  std::unique_ptr<Session> session;
  AttentionPlan* plan = nullptr;
  Shard shard;
  std::optional<Mask> true_mask;
  std::optional<Json> auto_choice;  // --auto: the candidates and the choice
  const Mask& mask() const { return true_mask ? *true_mask : plan->mask(); }
};

// With --auto, the configuration is chosen (and job's spec set) once the session is open.
Open open_job(Job& job, LaunchContext& ctx) {
  comm::Communicator& comm = ctx.world;
  const TestFault& fault = ctx.seam.fault;
  Open open;
  agreed_phase(comm, [&] { open.session = open_session(comm, job.context, ctx.seam); });  // NCCL's setup is collective
  if (job.opt.auto_options.enabled) {
    try {  // the probe's and the trials' passes and transfers: a failure cannot be agreed on
      const AutoConfigured chosen = configure_automatically(
          *open.session, AutoJob{job.shard, job.spec, job.seq_len, job.backward}, job.auto_settings, /*print=*/true);
      job.spec = chosen.spec;
      job.opt.layout = layout_name(chosen.chosen.layout), job.opt.schedule = schedule_name(chosen.chosen.schedule);
      job.opt.ulysses = chosen.chosen.ulysses;
      open.auto_choice = chosen.json;
    } catch (const std::exception& e) {
      fail_now(comm, e);
    }
  }
  AttentionSpec ring_spec;
  agreed_phase(comm, [&] { ring_spec = fault.ring_spec(job.spec, job.shard.head_dim, job.shard.kv_heads); });
  agreed_phase(comm, [&] {  // collective only where a hybrid group is split, which every rank does
    open.shard = job.shard;
    open.plan = &open.session->plan(open.shard, ring_spec, job.seq_len);
    open.shard.rows = open.plan->rows();
    if (fault.active()) open.true_mask = api::build_mask(job.spec, job.seq_len);
  });
  // Every rank read the same files: the same shapes and the same mask.
  agreed_phase(comm, [&] {
    if (auto d = differs_from_rank0(comm, resolved_lines(job, open.mask())))
      throw usage_error("the ranks read different inputs: " + d->name + " is " + d->on_rank0 + " on rank 0 but " +
                        d->here + " on rank " + std::to_string(comm.rank()) + " (every rank must see the same files)");
  });
  agreed_phase(comm, [&] {
    if (comm.rank() == 0) dump_block_mask(job.opt.mask, open.mask());
  });
  return open;
}

// The timed passes; per repetition the job's time is the slowest rank's. A failure here cannot
// be agreed on (a peer may be blocked in a transfer): it ends every rank at once.
void run_passes(const Job& job, LaunchContext& ctx, Open& open, const AttentionInputs& in, const DeviceBuffer& o,
                const DeviceBuffer& lse, const DeviceBuffer grads[3], AttentionResults& r) {
  comm::Communicator& comm = ctx.world;
  const int P = comm.size(), repetitions = job.opt.warmup + job.opt.iters;
  UlyssesAttention& attention = open.plan->attention();
  std::vector<double> weights;
  for (int it = 0; it < repetitions; ++it) {
    weights.push_back(1.0);
    if (job.backward) weights.push_back(2.5);
  }
  ProgressLine progress(job.opt.progress && comm.rank() == 0, weights);
  int pass = 0;
  attention.on_step = [&](int done, int steps) {
    progress.step(pass, done, steps);
    ctx.seam.hook.at_step();
  };
  auto slowest = [&](double t) {
    comm.allreduce(&t, 1, DType::f64, comm::ReduceOp::max);
    return t;
  };
  auto sum = [&](uint64_t v) {
    comm.allreduce(&v, 1, DType::i64, comm::ReduceOp::sum);
    return v;
  };
  std::string stage;  // where a failure happened, for its message
  try {
    for (int it = 0; it < repetitions; ++it) {
      const bool timed = it >= job.opt.warmup;
      const std::string repetition = " of repetition " + std::to_string(it + 1) + "/" + std::to_string(repetitions);
      stage = "before the forward pass" + repetition;
      comm.barrier();
      stage = "in the forward pass" + repetition;
      const RingStats f = ring_stats(attention.forward(in.q.data(), in.k.data(), in.v.data(), o.as<float>(),
                                                       lse.as<float>()),
                                     attention);
      ++pass;
      stage = "after the forward pass" + repetition;
      const double t = slowest(f.seconds);
      if (timed) {
        r.forward_s.push_back(t);
        double exposed[2] = {f.wait_seconds / std::max(f.seconds, 1e-12), 0.0};
        exposed[1] = exposed[0];
        comm.allreduce(&exposed[0], 1, DType::f64, comm::ReduceOp::sum);
        comm.allreduce(&exposed[1], 1, DType::f64, comm::ReduceOp::max);
        r.exposed_mean += exposed[0] / P;
        r.exposed_max = std::max(r.exposed_max, exposed[1]);
        r.bytes_sent = sum(f.bytes_sent);
        r.a2a_bytes_sent = sum(f.a2a_bytes_sent);
        r.bytes_needed = f.bytes_needed;  // this rank's; summed below
        r.cudnn_steps = f.cudnn_steps, r.own_steps = f.own_steps;
      }
      if (!job.backward) continue;
      stage = "before the backward pass" + repetition;
      comm.barrier();
      stage = "in the backward pass" + repetition;
      const PassStats b = attention.backward(in.q.data(), in.k.data(), in.v.data(), o.as<float>(), lse.as<float>(),
                                             in.dout.data(), grads[0].as<float>(), grads[1].as<float>(),
                                             grads[2].as<float>(), attention.last_forward());
      ++pass;
      stage = "after the backward pass" + repetition;
      const double tb = slowest(b.seconds);
      if (timed) r.backward_s.push_back(tb), r.cudnn_steps += b.cudnn_steps, r.own_steps += b.own_steps;
    }
  } catch (const comm::CommError& e) {
    fail_now(comm, comm::CommError(std::string(e.what()) + " (" + stage + ")"));  // end every rank now
  } catch (const std::exception& e) {
    fail_now(comm, e);  // a peer may be blocked in a transfer: end every rank now
  }
  attention.on_step = nullptr;
}

// The job's output buffers in the backend's memory, and the same results on the host (the
// buffers themselves on the CPU, else copies), as the check and the files see them.
struct Results {
  DeviceBuffer o, lse, grads[3];  // grads: dq, dk, dv
  std::vector<float> copies[5];
  const float* host[5] = {};  // o, lse, dq, dk, dv

  Results(AttentionBackend& backend, const Shard& s, bool backward) {
    const size_t q = size_t(s.batch * s.rows * s.heads * s.head_dim), kv = size_t(s.batch * s.rows * s.kv_heads * s.head_dim);
    o = DeviceBuffer(backend, sizeof(float) * q), lse = DeviceBuffer(backend, sizeof(float) * size_t(s.batch * s.heads * s.rows));
    if (backward)
      grads[0] = DeviceBuffer(backend, sizeof(float) * q), grads[1] = DeviceBuffer(backend, sizeof(float) * kv),
      grads[2] = DeviceBuffer(backend, sizeof(float) * kv);
  }
  // After the passes. With RINGATTN_TEST_FAULT=output-element or causal-diagonal, O and LSE as if
  // the kernels had computed them wrong, for the check to catch.
  void to_host(AttentionBackend& backend, const Job& job, const Open& open, const AttentionInputs& in,
               const TestFault& fault) {
    const DeviceBuffer* buffers[5] = {&o, &lse, &grads[0], &grads[1], &grads[2]};
    for (int t = 0; t < 5; ++t) host[t] = host_floats(backend, *buffers[t], copies[t]);
    if (!fault.changes_outputs()) return;
    const Shard& s = open.shard;
    copies[0].assign(host[0], host[0] + s.batch * s.rows * s.heads * s.head_dim);
    copies[1].assign(host[1], host[1] + s.batch * s.heads * s.rows);
    fault.outputs(open.plan->layout(), open.session->rank(), open.mask(), job.dims(), in.host_q.data(),
                  in.host_k.data(), in.host_v.data(), copies[0], copies[1]);
    host[0] = copies[0].data(), host[1] = copies[1].data();
  }
};

// --check: sampled rows against fp64 (communicates: a failure here ends every rank at once).
CheckReport check_attention(comm::Communicator& comm, const Job& job, const Open& open, const AttentionInputs& in,
                            const Results& out) {
  CheckTensors t{in.host_q.data(), in.host_k.data(), in.host_v.data(), out.host[0], out.host[1],
                 in.host_dout.data(), out.host[2], out.host[3], out.host[4]};
  if (in.host_q.empty())  // the backend's own host fp32 buffers hold the true inputs
    t.q = in.q.as<float>(), t.k = in.k.as<float>(), t.v = in.v.as<float>(), t.dout = in.dout.as<float>();
  const kernels::AttentionDims dims = job.dims();
  return check_sampled_rows(comm, open.plan->layout(), open.mask(), dims, t, job.backward, job.opt.check_rows,
                            job.opt.seed, open.session->backend().same_precision(dims, job.dtype()));
}

// --out, --lse, --dq, --dk, --dv: every rank its rows, all or nothing (collective).
void write_attention_outputs(LaunchContext& ctx, const Job& job, const Open& open, const Results& out) {
  const Shard& s = open.shard;
  const std::vector<int64_t>& pos = open.plan->positions();
  const std::vector<int64_t> qshape = job.q_info ? job.q_info->shape
                                                 : std::vector<int64_t>{s.batch, job.seq_len, s.heads, s.head_dim};
  const std::vector<int64_t> kshape = job.k_info ? job.k_info->shape
                                                 : std::vector<int64_t>{s.batch, job.seq_len, s.kv_heads, s.head_dim};
  std::vector<OutputRows> files;
  auto add = [&](const char* label, const std::string& path, std::vector<int64_t> shape, const float* data,
                 int64_t outer, int64_t inner) {
    if (!path.empty()) files.push_back({path, label, std::move(shape), RowSelection{outer, job.seq_len, inner, pos}, data});
  };
  add("--out", job.opt.out, qshape, out.host[0], s.batch, s.heads * s.head_dim);
  add("--lse", job.opt.lse, {s.batch, s.heads, job.seq_len}, out.host[1], s.batch * s.heads, 1);
  if (job.backward) {
    add("--dq", job.opt.dq, qshape, out.host[2], s.batch, s.heads * s.head_dim);
    add("--dk", job.opt.dk, kshape, out.host[3], s.batch, s.kv_heads * s.head_dim);
    add("--dv", job.opt.dv, kshape, out.host[4], s.batch, s.kv_heads * s.head_dim);
  }
  if (!files.empty()) write_outputs(ctx.world, files, [&] { ctx.seam.hook.at_write(); });
}

// Work and traffic, summed over ranks, and what describes the run (collective).
void count_work(comm::Communicator& comm, const Job& job, const Open& open, AttentionResults& r) {
  const Shard& s = open.shard;
  const ShardLayout& layout = open.plan->layout();
  int64_t pairs = count_visible_pairs(open.mask().view(), layout.runs(comm.rank()), job.seq_len);
  comm.allreduce(&pairs, 1, DType::i64, comm::ReduceOp::sum);
  comm.allreduce(&r.bytes_needed, 1, DType::i64, comm::ReduceOp::sum);
  comm.allreduce(&r.cudnn_steps, 1, DType::i64, comm::ReduceOp::sum);
  comm.allreduce(&r.own_steps, 1, DType::i64, comm::ReduceOp::sum);
  if (job.context.backend == "cuda") r.cudnn = open.session->backend().cudnn_status();
  r.peak_rss = peak_rss_bytes();
  comm.allreduce(&r.peak_rss, 1, DType::i64, comm::ReduceOp::max);
  r.flops = 4.0 * double(s.batch) * double(s.heads) * double(s.head_dim) * double(pairs);
  r.ranks = comm.size(), r.nodes = open.session->nodes().nodes(), r.backend = open.session->backend().name();
  r.mask = open.mask().describe(), r.layout = layout_name(layout.kind());
  r.auto_choice = open.auto_choice;
}

}  // namespace

int run_attention(LaunchContext& ctx) {
  comm::Communicator& comm = ctx.world;
  const int rank = comm.rank();
  Options opts;
  const po::options_description desc = describe_attention_options(opts);
  // docs/reference.md "Command line": with no options, a small self-checking job. Spelled out as
  // options, so that the ranks compare it like any other (one rank without options and one with is
  // a difference).
  std::vector<std::string> args = ctx.args;
  if (args.empty()) args = {"--causal", "--backward", "--check"};
  const po::variables_map vm = parse_and_agree(comm, desc, args, "attention");
  if (vm.count("help")) {
    if (rank == 0)
      std::cout << "usage: ringattn [SUBCOMMAND] [options]   (under mpirun -np P for P ranks)\n\n"
                   "Subcommands (ringattn SUBCOMMAND --help lists each one's options):\n"
                   "  attention   the default: exact attention over the ranks' shards, forward and backward\n"
                   "  layer       the LoRA attention layer (projections, RoPE, training) around the ring\n"
                   "  decode      prefill and decode against a KV cache sharded across the ranks\n"
                   "  bench       benchmarks: scaling over rank counts, the kernels, the decode kernel\n"
                   "  plan        predict runs on a described cluster; calibrate the model\n\n"
                   "With no options: causal attention over 8192 random tokens, forward and backward,\n"
                   "checked against an fp64 reference.\n\n"
                << desc << "\n";
    return 0;
  }
  const ArgumentNames names(file_argument_names(opts));  // the shapes of file inputs are the files'
  Job job;
  agreed_phase(comm, [&] { job = resolve_attention_job(opts, vm, ctx); });
  comm.set_timeout(job.opt.timeout);  // from here on every wait is bounded by --timeout
  report_thread_binding(comm, job.threads(), job.opt.threads > 0, ctx);

  Open open = open_job(job, ctx);
  AttentionBackend& backend = open.session->backend();
  AttentionInputs in;
  agreed_phase(comm, [&] { in = load_attention_inputs(job, open.plan->positions(), backend, ctx.seam.fault); });
  if (rank == 0)  // every rank converted its rows alike: one note
    for (const std::string& note : in.notes) std::fprintf(stderr, "ringattn: note: %s\n", note.c_str());

  Results out(backend, open.shard, job.backward);
  AttentionResults r;
  run_passes(job, ctx, open, in, out.o, out.lse, out.grads, r);
  out.to_host(backend, job, open, in, ctx.seam.fault);
  if (job.opt.check) r.check = check_attention(comm, job, open, in, out);
  const bool check_failed = r.check && !r.check->passed();
  if (!check_failed) write_attention_outputs(ctx, job, open, out);
  count_work(comm, job, open, r);
  if (rank == 0) {
    if (const int code = report_attention(job, r); code != kExitOk) return code;
    if (check_failed) print_error("--check failed: results differ from the fp64 reference; outputs were not written");
  }
  return check_failed ? kExitCheckFailed : kExitOk;
}

}  // namespace ringattn
