#include "launch/attention_job.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "comm/stopwatch.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "launch/attention_options.hpp"
#include "launch/cpu_binding.hpp"
#include "launch/execution.hpp"
#include "launch/job_control.hpp"
#include "launch/job_util.hpp"
#include "launch/mask_options.hpp"
#include "launch/npy_outputs.hpp"
#include "launch/options_util.hpp"
#include "launch/statistics.hpp"
#include "launch/summary.hpp"
#include "launch/test_hook.hpp"
#include "runtime/backend.hpp"
#include "runtime/check.hpp"
#include "runtime/errors.hpp"
#include "runtime/io/npy.hpp"
#include "runtime/random_inputs.hpp"
#include "runtime/ulysses_attention.hpp"
#include "comm/mpi_communicator.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/api/arguments.hpp"

namespace po = boost::program_options;

namespace ringattn {
namespace {

// Reads (or generates) this rank's rows of a (B, L, heads*D) tensor, as fp32 on the host. A file
// that is not float32 is converted, and `note` says so. With `scan_finite`, a NaN or Inf in the
// file, or (with --dtype bf16) a value that bfloat16 cannot hold, is refused naming the position.
std::vector<float> load_rows(const Job& job, const std::optional<NpyInfo>& info, RandomTensor tensor, int64_t heads,
                             const std::vector<int64_t>& pos, bool scan_finite, std::string* note) {
  const int64_t B = job.dims.batch, D = job.dims.head_dim;
  std::vector<float> x(static_cast<size_t>(B * static_cast<int64_t>(pos.size()) * heads * D));
  if (!info) {
    random_rows(x.data(), job.opt.seed, tensor, B, job.seq_len, heads * D, pos.data(), static_cast<int64_t>(pos.size()));
    return x;
  }
  std::string converted;
  read_npy_rows(*info, rows_along(info->shape, info->shape.size() == 4 ? 1 : 0, pos), x.data(), &converted);
  if (!converted.empty() && note) *note = info->label + " " + info->path + ": converted " +
                                          (info->descr == "<f8" ? "float64" : "float16") + " to float32";
  if (!scan_finite) return x;
  const std::string where = info->label + " " + info->path + ": ";
  auto position = [&](size_t i) { return std::to_string(pos[(i / static_cast<size_t>(heads * D)) % pos.size()]); };
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isfinite(x[i])) continue;
    if (std::isinf(x[i]) && converted.find("beyond") != std::string::npos)
      throw UsageError(where + "a float64 value at sequence position " + position(i) +
                       " is beyond the float32 range (it would be inf); rescale the input");
    throw UsageError(where + "contains " + (std::isnan(x[i]) ? "NaN" : "Inf") + " (at sequence position " + position(i) +
                     "); fix the input or pass --no-check-finite");
  }
  if (job.dtype == DType::bf16)
    for (size_t i = 0; i < x.size(); ++i)
      if (std::isinf(bf16_to_float(float_to_bf16(x[i])))) {
        char value[32];
        std::snprintf(value, sizeof value, "%.6g", double(x[i]));
        throw UsageError(where + "value " + value + " at sequence position " + position(i) +
                         " overflows bfloat16 (largest finite 3.39e38) under --dtype bf16; rescale the input or use "
                         "--dtype fp32");
      }
  return x;
}

// Rank 0 reports steps done and time left: on a terminal one line rewritten in place; otherwise
// (under mpirun a rank's stderr is a pipe to mpirun) a new line every few seconds.
class ProgressLine {
 public:
  // weights[p]: the expected cost of pass p (a backward pass costs about 2.5 forward passes).
  ProgressLine(bool enabled, std::vector<double> weights)
      : enabled_(enabled),
        tty_(isatty(STDERR_FILENO)),
        passes_(static_cast<int>(weights.size())),
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
  comm::Stopwatch clock_;  // from the start of the first pass
  double shown_ = -1e9;
};

}  // namespace

int run_attention(LaunchContext& ctx) {
  comm::Communicator& comm = ctx.world;
  const int P = comm.size(), rank = comm.rank();
  TestHook test_hook;
  TestFault test_fault;  // tests of --check only: what the ring computes differs from what is checked
  Options opts;
  const po::options_description desc = describe_attention_options(opts);
  Job job;
  // SPEC.md: with no options, a small self-checking job. Spelled out as options, so that the
  // ranks compare it like any other (one rank without options and one with is a difference).
  std::vector<std::string> args = ctx.args;
  if (args.empty()) args = {"--causal", "--backward", "--check"};
  // Parse, agree, then validate: each its own agreed phase.
  const po::variables_map vm = parse_and_agree(comm, desc, args, "attention");
  agreed_phase(comm, [&] {
    test_hook = TestHook::from_environment(rank);
    test_fault = TestFault::from_environment();
  });
  const bool help = vm.count("help") > 0;
  if (!help) {
    agreed_phase(comm, [&] { job = resolve_attention_job(opts, vm, ctx); });
    comm.set_timeout(job.opt.timeout);  // from here on every wait is bounded by --timeout
  }
  if (help) {
    if (rank == 0)
      std::cout << "usage: ringattn [attention] [options]   (under mpirun -np P for P ranks)\n"
                   "       ringattn layer|bench|plan [options]\n\n"
                   "With no options: causal attention over 8192 random tokens, forward and backward,\n"
                   "checked against an fp64 reference.\n\n"
                << desc << "\n";
    return 0;
  }
  report_thread_binding(comm, job.threads, job.opt.threads > 0, ctx);

  std::optional<ShardLayout> layout_storage;
  std::vector<int64_t> pos;
  Mask mask, ring_mask;
  agreed_phase(comm, [&] {
    // --ulysses U > 1: the groups are U ranks of a node where the nodes allow (collective), as the
    // library's hybrid places them.
    layout_storage.emplace(hybrid_layout(comm, job.layout, job.seq_len, job.opt.ulysses));
    pos = layout_storage->positions(rank);
    mask = build_mask(job.opt.mask, job.seq_len, job.opt.seed);
    ring_mask = test_fault.ring_mask(mask);
  });
  // Every rank read the same files: the same shapes and the same mask.
  agreed_phase(comm, [&] {
    if (auto d = differs_from_rank0(comm, resolved_lines(job, mask)))
      throw UsageError("the ranks read different inputs: " + d->name + " is " + d->on_rank0 + " on rank 0 but " +
                       d->here + " on rank " + std::to_string(rank) + " (every rank must see the same files)");
  });
  agreed_phase(comm, [&] {
    if (rank == 0) dump_block_mask(job.opt.mask, mask);
  });
  const ShardLayout& layout = *layout_storage;
  const int64_t rows = static_cast<int64_t>(pos.size());
  const int64_t B = job.dims.batch, H = job.dims.heads, Hkv = job.dims.kv_heads, D = job.dims.head_dim;

  // Where the job computes: the library's context (include/ringattn/ringattn.hpp) over this job's
  // ranks builds the backend and the ring's communicator; NCCL setup is collective, and a node short
  // of GPUs is a usage error.
  std::unique_ptr<Context> api;
  agreed_phase(comm, [&] {
    // --ulysses U > 1: the ring runs across groups, an all-to-all inside them, over the intra link.
    api = open_context(ctx.world, context_options(job.execution, job.opt, job.threads, job.opt.emulate_intra_bandwidth,
                                                  job.opt.emulate_intra_latency));
  });
  AttentionBackend* backend = &api->backend();
  const Shard shard{B, rows, H, Hkv, D, job.dtype == DType::bf16 ? ElementType::bfloat16 : ElementType::float32};
  // What the ring computes: the job's mask, scale and hybrid degree (RINGATTN_TEST_FAULT may plant an
  // error here, which the --check must catch).
  const AttentionSpec spec =
      api::attention_spec(ring_mask, job.layout, job.schedule, test_fault.ring_dims(job.dims).scale, job.opt.ulysses);

  // Inputs: each rank reads (or generates) only its own rows, one tensor at a time into the
  // backend. A host copy is kept only for --check, and not even then when the backend's buffers
  // are host fp32 already (the check reads them).
  std::vector<float> q, k, v, dout;
  DeviceBuffer dq_in, dk_in, dv_in, ddo_in;
  const bool scan = job.files ? !job.opt.no_check_finite : job.opt.check_finite;
  const bool inputs_on_host = backend->memory() == comm::MemorySpace::host && job.dtype == DType::f32;
  const bool keep_host_copy = job.opt.check && (!inputs_on_host || test_fault.active());
  std::string notes[4];
  agreed_phase(comm, [&] {
    auto load = [&](std::vector<float>& host, DeviceBuffer& buf, const std::optional<NpyInfo>& info,
                    RandomTensor tensor, int64_t heads, std::string* note) {
      host = load_rows(job, info, tensor, heads, pos, scan, note);
      buf = to_backend(*backend, host, job.dtype);
      std::vector<float> faulty;
      const bool kv = tensor == RandomTensor::k || tensor == RandomTensor::v;
      if (test_fault.ring_rows(host, kv, job.dims, faulty)) buf = to_backend(*backend, faulty, job.dtype);
      if (!keep_host_copy) host = std::vector<float>();
    };
    load(q, dq_in, job.q_info, RandomTensor::q, H, &notes[0]);
    load(k, dk_in, job.k_info, RandomTensor::k, Hkv, &notes[1]);
    load(v, dv_in, job.v_info, RandomTensor::v, Hkv, &notes[2]);
    if (job.backward) load(dout, ddo_in, job.dout_info, RandomTensor::dout, H, &notes[3]);
  });
  if (rank == 0)  // every rank converted its rows alike: one note
    for (const std::string& note : notes)
      if (!note.empty()) std::fprintf(stderr, "ringattn: note: %s\n", note.c_str());

  DeviceBuffer o_buf(*backend, sizeof(float) * static_cast<size_t>(B * rows * H * D));
  DeviceBuffer lse_buf(*backend, sizeof(float) * static_cast<size_t>(B * H * rows));
  DeviceBuffer dq_buf, dk_buf, dv_buf;
  if (job.backward) {
    dq_buf = DeviceBuffer(*backend, sizeof(float) * static_cast<size_t>(B * rows * H * D));
    dk_buf = DeviceBuffer(*backend, sizeof(float) * static_cast<size_t>(B * rows * Hkv * D));
    dv_buf = DeviceBuffer(*backend, sizeof(float) * static_cast<size_t>(B * rows * Hkv * D));
  }

  // Timed passes. Per iteration the job's time is the slowest rank's.
  std::vector<double> fwd_times, bwd_times;
  double wait_fraction_sum = 0.0, wait_fraction_max = 0.0;
  uint64_t bytes_sent = 0, needed = 0, a2a_bytes_sent = 0;
  {
    std::vector<double> weights;
    for (int it = 0; it < job.opt.warmup + job.opt.iters; ++it) {
      weights.push_back(1.0);
      if (job.backward) weights.push_back(2.5);
    }
    ProgressLine progress(job.opt.progress && rank == 0, weights);
    int pass = 0;
    std::string stage;  // where a failure happened, for its message
    try {
      for (int it = 0; it < job.opt.warmup + job.opt.iters; ++it) {
        const bool timed = it >= job.opt.warmup;
        const std::string repetition = " of repetition " + std::to_string(it + 1) + "/" +
                                       std::to_string(job.opt.warmup + job.opt.iters);
        stage = "before the forward pass" + repetition;
        comm.barrier();
        stage = "in the forward pass" + repetition;
        api->set_step_callback([&](int done, int steps) {
          progress.step(pass, done, steps);
          test_hook.at_step();
        });
        RingStats f =
            api->forward(shard, spec, dq_in.data(), dk_in.data(), dv_in.data(), o_buf.as<float>(), lse_buf.as<float>());
        needed = f.bytes_needed;
        ++pass;
        stage = "after the forward pass" + repetition;
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
          uint64_t a2a = f.a2a_bytes_sent;
          comm.allreduce(&a2a, 1, comm::DataType::i64, comm::ReduceOp::sum);
          a2a_bytes_sent = a2a;
        }
        if (!job.backward) continue;
        stage = "before the backward pass" + repetition;
        comm.barrier();
        stage = "in the backward pass" + repetition;
        RingStats b = api->backward(shard, spec, dq_in.data(), dk_in.data(), dv_in.data(), o_buf.as<float>(),
                                    lse_buf.as<float>(), ddo_in.data(), dq_buf.as<float>(), dk_buf.as<float>(),
                                    dv_buf.as<float>());
        ++pass;
        stage = "after the backward pass" + repetition;
        double tb = b.seconds;
        comm.allreduce(&tb, 1, comm::DataType::f64, comm::ReduceOp::max);
        if (timed) bwd_times.push_back(tb);
      }
    } catch (const comm::CommError& e) {
      fail_now(comm, comm::CommError(std::string(e.what()) + " (" + stage + ")"));  // end every rank now
    } catch (const std::exception& e) {
      fail_now(comm, e);  // a peer may be blocked in a transfer: end every rank now
    }
  }
  api->set_step_callback(nullptr);

  // Results on the host: the backend's buffers themselves, or copies from the device.
  std::vector<float> o_copy, lse_copy, dq_copy, dk_copy, dv_copy;
  const float* o = host_floats(*backend, o_buf, o_copy);
  const float* lse = host_floats(*backend, lse_buf, lse_copy);
  const float* dq = host_floats(*backend, dq_buf, dq_copy);
  const float* dk = host_floats(*backend, dk_buf, dk_copy);
  const float* dv = host_floats(*backend, dv_buf, dv_copy);
  if (test_fault.changes_outputs()) {
    o_copy.assign(o, o + B * rows * H * D), lse_copy.assign(lse, lse + B * H * rows);
    test_fault.outputs(layout, rank, mask, job.dims, q.data(), k.data(), v.data(), o_copy, lse_copy);
    o = o_copy.data(), lse = lse_copy.data();
  }

  std::optional<CheckReport> check;
  if (job.opt.check) {  // communicates: a failure here ends every rank at once (main's handler)
    CheckTensors t{q.data(), k.data(), v.data(), o, lse, dout.data(), dq, dk, dv};
    if (inputs_on_host && !test_fault.active())
      t.q = dq_in.as<float>(), t.k = dk_in.as<float>(), t.v = dv_in.as<float>(), t.dout = ddo_in.as<float>();
    check = check_sampled_rows(comm, layout, mask, job.dims, t, job.backward, job.opt.check_rows, job.opt.seed,
                               backend->same_precision(job.dims, job.dtype));
  }
  const bool check_failed = check && !check->passed();

  // Work and traffic, summed over ranks.
  int64_t pairs = count_visible_pairs(mask.view(), layout.runs(rank), job.seq_len);
  comm.allreduce(&pairs, 1, comm::DataType::i64, comm::ReduceOp::sum);
  comm.allreduce(&needed, 1, comm::DataType::i64, comm::ReduceOp::sum);
  uint64_t rss = peak_rss_bytes();
  comm.allreduce(&rss, 1, comm::DataType::i64, comm::ReduceOp::max);
  const double flops = 4.0 * double(B) * double(H) * double(D) * double(pairs);
  const double fwd_s = median_of(fwd_times), bwd_s = job.backward ? median_of(bwd_times) : 0.0;
  const double gflops_rank = rate_per_rank(flops, fwd_s, P);

  if (!check_failed) {
    std::vector<OutputRows> files;
    const std::vector<int64_t> qshape = job.q_info ? job.q_info->shape : std::vector<int64_t>{B, job.seq_len, H, D};
    const std::vector<int64_t> kshape = job.k_info ? job.k_info->shape : std::vector<int64_t>{B, job.seq_len, Hkv, D};
    auto add = [&](const char* label, const std::string& path, std::vector<int64_t> shape, const float* data,
                   int64_t outer, int64_t inner) {
      if (!path.empty()) files.push_back({path, label, std::move(shape), RowSelection{outer, job.seq_len, inner, pos}, data});
    };
    add("--out", job.opt.out, qshape, o, B, H * D);
    add("--lse", job.opt.lse, {B, H, job.seq_len}, lse, B * H, 1);
    if (job.backward) {
      add("--dq", job.opt.dq, qshape, dq, B, H * D);
      add("--dk", job.opt.dk, kshape, dk, B, Hkv * D);
      add("--dv", job.opt.dv, kshape, dv, B, Hkv * D);
    }
    if (!files.empty()) write_outputs(comm, files, [&] { test_hook.at_write(); });
  }

  if (rank == 0) {
    RunSummary summary;
    summary.ranks = P, summary.batch = B, summary.seq_len = job.seq_len, summary.heads = H, summary.kv_heads = Hkv;
    summary.head_dim = D, summary.mask = mask.describe(), summary.layout = layout_name(job.layout);
    summary.schedule = schedule_name(job.schedule), summary.dtype = dtype_name(job.dtype);
    summary.backend = backend->name(), summary.comm = job.execution.comm, summary.threads = job.threads;
    summary.forward_s = fwd_s, summary.flops_forward = flops, summary.gflops_per_rank = gflops_rank;
    if (job.backward) summary.backward_s = bwd_s;
    summary.comm_bytes_sent = bytes_sent, summary.comm_bytes_needed = needed;
    summary.exposed_comm_fraction = wait_fraction_sum / job.opt.iters, summary.peak_rss_bytes = rss;
    summary.nodes = ctx.nodes;
    if (check) summary.max_abs_err = check->max_abs_err();
    Json j = summary_json(summary);  // then what only the job reports
    if (job.execution.backend == "cpu") j["isa"] = kernels::cpu_isa();
    j["iters"] = job.opt.iters;
    if (job.backward) j["gflops_per_rank_backward"] = rate_per_rank(2.5 * flops, bwd_s, P);
    j["a2a_bytes_sent"] = a2a_bytes_sent;
    j["exposed_comm_fraction_max"] = wait_fraction_max;
    if (check) {
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
                job.threads > 1 ? "s" : "", backend->name(),
                job.execution.backend == "cpu" ? kernels::cpu_isa() : "device", job.execution.comm.c_str());
    std::printf("  shape     batch %lld  seq_len %lld  heads %lld (kv %lld)  head_dim %lld  %s\n", (long long)B,
                (long long)job.seq_len, (long long)H, (long long)Hkv, (long long)D, dtype_name(job.dtype));
    std::printf("  mask      %s   layout %s   schedule %s\n", mask.describe().c_str(), layout_name(job.layout),
                schedule_name(job.schedule));
    std::printf("  forward   %.4f s  (median of %d)  %.3g GFLOP  %.1f GFLOP/s per rank\n", fwd_s, job.opt.iters,
                flops / 1e9, gflops_rank);
    if (job.backward)
      std::printf("  backward  %.4f s  (median of %d)  %.3g GFLOP  %.1f GFLOP/s per rank\n", bwd_s, job.opt.iters,
                  2.5 * flops / 1e9, rate_per_rank(2.5 * flops, bwd_s, P));
    std::printf("  comm      forward K/V sent %s, needed %s", human_bytes(double(bytes_sent)).c_str(),
                human_bytes(double(needed)).c_str());
    if (needed > 0) std::printf(" (%.2fx)", double(bytes_sent) / double(needed));
    if (job.opt.ulysses > 1)
      std::printf("; all-to-all (--ulysses %d) sent %s", job.opt.ulysses, human_bytes(double(a2a_bytes_sent)).c_str());
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
