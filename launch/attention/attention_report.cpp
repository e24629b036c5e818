#include "launch/attention/attention_report.hpp"

#include <cstdio>

#include "kernels/cpu/attention_cpu.hpp"
#include "launch/cli/context.hpp"
#include "launch/cli/job_control.hpp"
#include "launch/cli/statistics.hpp"
#include "launch/cli/summary.hpp"
#include "runtime/errors.hpp"
#include "util/format.hpp"

namespace ringattn {

namespace {

Json attention_json(const Job& job, const AttentionResults& r, double fwd_s, double bwd_s) {
  const int P = r.ranks;
  const Shard& s = job.shard;
  RunSummary summary;
  summary.ranks = P, summary.nodes = r.nodes, summary.batch = s.batch, summary.seq_len = job.seq_len;
  summary.heads = s.heads, summary.kv_heads = s.kv_heads, summary.head_dim = s.head_dim, summary.mask = r.mask;
  summary.layout = r.layout, summary.schedule = job.opt.schedule, summary.dtype = dtype_name(job.dtype());
  summary.backend = r.backend, summary.comm = job.context.comm, summary.threads = job.threads();
  summary.forward_s = fwd_s, summary.flops_forward = r.flops, summary.gflops_per_rank = rate_per_rank(r.flops, fwd_s, P);
  if (job.backward) summary.backward_s = bwd_s;
  summary.comm_bytes_sent = r.bytes_sent, summary.comm_bytes_needed = r.bytes_needed;
  summary.exposed_comm_fraction = r.exposed_mean / job.opt.iters, summary.peak_rss_bytes = r.peak_rss;
  if (r.check) summary.max_abs_err = r.check->max_abs_err();
  Json j = summary_json(summary);  // then what only the job reports
  if (job.context.backend == "cpu") j["isa"] = kernels::cpu_isa();
  j["iters"] = job.opt.iters;
  if (job.backward) j["gflops_per_rank_backward"] = rate_per_rank(2.5 * r.flops, bwd_s, P);
  j["a2a_bytes_sent"] = r.a2a_bytes_sent;
  j["exposed_comm_fraction_max"] = r.exposed_max;
  j["kernel"] = job.opt.kernel;
  j["deterministic"] = job.opt.deterministic;
  j["cudnn_steps"] = r.cudnn_steps;
  j["own_steps"] = r.own_steps;
  if (!r.cudnn.empty()) j["cudnn"] = r.cudnn;
  if (r.check) {
    j["check_passed"] = r.check->passed();
    j["check_rows"] = r.check->samples;
  }
  if (job.opt.emulate_bandwidth > 0 || job.opt.emulate_latency > 0) {
    j["emulate_bandwidth_gbps"] = job.opt.emulate_bandwidth;
    j["emulate_latency_us"] = job.opt.emulate_latency;
  }
  return j;
}

void print_summary(const Job& job, const AttentionResults& r, double fwd_s, double bwd_s) {
  const int P = r.ranks, threads = job.threads();
  const Shard& s = job.shard;
  std::printf("ringattn  %d rank%s x %d thread%s  backend %s (%s)  comm %s\n", P, P > 1 ? "s" : "", threads,
              threads > 1 ? "s" : "", r.backend, job.context.backend == "cpu" ? kernels::cpu_isa() : "device",
              job.context.comm.c_str());
  std::printf("  shape     batch %lld  seq_len %lld  heads %lld (kv %lld)  head_dim %lld  %s\n", (long long)s.batch,
              (long long)job.seq_len, (long long)s.heads, (long long)s.kv_heads, (long long)s.head_dim,
              dtype_name(job.dtype()));
  std::printf("  mask      %s   layout %s   schedule %s\n", r.mask.c_str(), r.layout.c_str(), job.opt.schedule.c_str());
  std::printf("  forward   %.4f s  (median of %d)  %.3g GFLOP  %.1f GFLOP/s per rank\n", fwd_s, job.opt.iters,
              r.flops / 1e9, rate_per_rank(r.flops, fwd_s, P));
  if (job.backward)
    std::printf("  backward  %.4f s  (median of %d)  %.3g GFLOP  %.1f GFLOP/s per rank\n", bwd_s, job.opt.iters,
                2.5 * r.flops / 1e9, rate_per_rank(2.5 * r.flops, bwd_s, P));
  std::printf("  comm      forward K/V sent %s, needed %s", human_bytes(double(r.bytes_sent)).c_str(),
              human_bytes(double(r.bytes_needed)).c_str());
  if (r.bytes_needed > 0) std::printf(" (%.2fx)", double(r.bytes_sent) / double(r.bytes_needed));
  if (job.opt.ulysses > 1)
    std::printf("; all-to-all (--ulysses %d) sent %s", job.opt.ulysses, human_bytes(double(r.a2a_bytes_sent)).c_str());
  std::printf("; exposed %.1f%% of forward\n", 100.0 * r.exposed_mean / job.opt.iters);
  if (job.context.backend == "cuda")
    std::printf("  kernels   %lld ring steps on cuDNN, %lld on ours (--kernel %s%s); %s\n", (long long)r.cudnn_steps,
                (long long)r.own_steps, job.opt.kernel.c_str(), job.opt.deterministic ? ", deterministic" : "",
                r.cudnn.c_str());
  std::printf("  memory    peak %s per rank (max)\n", human_bytes(double(r.peak_rss)).c_str());
  if (r.check)
    std::printf("  check     %s on %d sampled rows: %s\n", r.check->passed() ? "passed" : "FAILED", r.check->samples,
                r.check->describe().c_str());
  std::fflush(stdout);
}

}  // namespace

int report_attention(const Job& job, const AttentionResults& r) {
  const double fwd_s = median_of(r.forward_s), bwd_s = job.backward ? median_of(r.backward_s) : 0.0;
  if (!job.opt.json.empty()) {
    try {
      write_text_file(job.opt.json, "--json", attention_json(job, r, fwd_s, bwd_s).dump() + "\n");
    } catch (const std::exception& e) {
      print_error(message_of(e));
      return exit_code_of(e);
    }
  }
  print_summary(job, r, fwd_s, bwd_s);
  return kExitOk;
}

}  // namespace ringattn
