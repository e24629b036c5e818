#include "launch/bench/scaling_report.hpp"

#include <cstdio>

#include "launch/cli/summary.hpp"

namespace ringattn {

namespace {

// Every field of a point, in the order of the JSON and CSV: docs/reference.md's summary first.
template <class Visit>
void point_fields(const ScalingPoint& p, const ScalingSetup& s, Visit&& visit) {
  RunSummary r;
  r.ranks = p.ranks, r.batch = s.batch, r.seq_len = p.seq_len, r.heads = s.heads, r.kv_heads = s.kv_heads;
  r.head_dim = s.head_dim, r.mask = s.mask, r.layout = p.layout, r.schedule = p.schedule, r.dtype = s.dtype;
  r.backend = s.backend, r.comm = s.comm, r.threads = s.threads;
  r.forward_s = p.forward_s, r.flops_forward = p.flops_forward;
  r.gflops_per_rank = rate_per_rank(p.flops_forward, p.forward_s, p.ranks);
  if (s.backward) r.backward_s = p.backward_s;
  r.comm_bytes_sent = p.bytes_sent, r.comm_bytes_needed = p.bytes_needed;
  r.exposed_comm_fraction = p.exposed_forward, r.nodes = p.nodes, r.peak_rss_bytes = p.peak_rss;
  if (p.checked) r.max_abs_err = p.max_abs_err;
  visit_summary(r, visit);
  visit("efficiency", Json(p.efficiency));
  visit("tokens_per_rank", Json(p.seq_len / p.ranks));
  visit("forward_p95_s", Json(p.forward_p95_s));
  visit("forward_mean_s", Json(p.forward_mean_s));
  visit("forward_compute_s", Json(p.forward_compute_s));
  visit("forward_wait_s", Json(p.forward_wait_s));
  const auto backward = [&](double value) { return s.backward ? Json(value) : Json(); };
  visit("backward_p95_s", backward(p.backward_p95_s));
  visit("backward_mean_s", backward(p.backward_mean_s));
  visit("backward_compute_s", backward(p.backward_compute_s));
  visit("backward_wait_s", backward(p.backward_wait_s));
  visit("exposed_comm_fraction_backward", backward(p.exposed_backward));
  visit("gflops_per_rank_backward",
        p.backward_s > 0 ? backward(rate_per_rank(2.5 * p.flops_forward, p.backward_s, p.ranks)) : Json());
  visit("efficiency_forward", Json(p.efficiency_forward));
  visit("efficiency_backward", backward(p.efficiency_backward));
  visit("check_passed", p.checked ? Json(p.check_passed) : Json());
  visit("wrong", Json(p.wrong));
  visit("emulate_bandwidth_gbps", Json(s.emulate_bandwidth));
  visit("emulate_latency_us", Json(s.emulate_latency));
  visit("ulysses", Json(p.ulysses));
  visit("a2a_bytes_sent", Json(p.a2a_bytes_sent));
  visit("emulate_intra_bandwidth_gbps", Json(s.emulate_intra_bandwidth));
  visit("emulate_intra_latency_us", Json(s.emulate_intra_latency));
}

double mib(double bytes) { return bytes / double(1 << 20); }

}  // namespace

void print_scaling_header(const ScalingSetup& s) {
  std::printf("# ringattn bench: %s scaling, ", s.weak ? "weak" : "strong");
  if (s.weak) std::printf("%lld tokens per rank (seq_len = tokens x ranks)\n", (long long)s.tokens_per_rank);
  else std::printf("seq_len %lld\n", (long long)s.seq_len);
  std::printf("# shape: batch %lld, heads %lld (kv %lld), head_dim %lld, %s; mask %s; layout %s; schedule %s\n",
              (long long)s.batch, (long long)s.heads, (long long)s.kv_heads, (long long)s.head_dim, s.dtype.c_str(),
              s.mask.c_str(), s.layout.c_str(), s.schedule.c_str());
  std::printf("# job: %d rank%s on %d node%s (%s), %s (%s), %d hardware threads per node; %d thread%s per rank; "
              "backend %s, comm %s\n",
              s.job_ranks, s.job_ranks > 1 ? "s" : "", s.nodes, s.nodes > 1 ? "s" : "", s.host.c_str(), s.cpu.c_str(),
              s.isa.c_str(), s.hardware_threads, s.threads, s.threads > 1 ? "s" : "", s.backend.c_str(), s.comm.c_str());
  const int largest = s.ranks.empty() ? 1 : s.ranks.back();
  const int per_node = (largest + s.nodes - 1) / s.nodes;
  if (per_node * s.threads > s.hardware_threads)
    std::printf("# note: %d ranks x %d threads per node exceed its %d hardware threads: those points time-share cores\n",
                per_node, s.threads, s.hardware_threads);
  if (s.emulate_bandwidth > 0 || s.emulate_latency > 0)
    std::printf("# link emulation: every transfer as over a link of %g GB/s (0 = unlimited) with %g us latency\n",
                s.emulate_bandwidth, s.emulate_latency);
  else
    std::printf("# link emulation: off (this machine's own transport)\n");
  std::printf("# timing: median and p95 of %d iteration%s after %d warm-up; an iteration takes its slowest rank's time\n",
              s.iters, s.iters > 1 ? "s" : "", s.warmup);
  std::printf("# GF/s/rank: forward FLOPs (4*B*H*D*visible pairs) / time / ranks;  effic: per-rank throughput of %s\n"
              "#   relative to the first point (strong: T1*P1 / (P*TP); weak: GF/s per rank, fair as work grows as L^2)\n",
              s.backward ? "forward + backward (FLOPs 3.5x forward)" : "the forward pass");
  std::printf("# exposed: time waiting for K/V or gradients / pass time, mean over ranks;  compute: forward kernel time\n"
              "# sent / need: forward K/V bytes over all ranks; need is the least any schedule moves;  peak: largest rank's RSS\n"
              "# U: --ulysses, ranks per group: all-to-all inside a group, the ring across groups; exposed includes the\n"
              "#   all-to-all, sent/need count the ring's K/V only (the all-to-all's bytes: a2a_bytes_sent in --json)\n");
  if (s.emulate_intra_bandwidth > 0 || s.emulate_intra_latency > 0)
    std::printf("# link emulation inside groups: %g GB/s, %g us (the ring's link above is the one between groups)\n",
                s.emulate_intra_bandwidth, s.emulate_intra_latency);
  if (s.check_rows > 0)
    std::printf("# #wrong: checked tensors (o, lse%s) off the fp64 reference on %d sampled rows (any > 0: exit 3)\n",
                s.backward ? ", dq, dk, dv" : "", s.check_rows);
  else
    std::printf("# #wrong: not checked (--no-check)\n");
  std::printf("#\n#                      |----- forward -----| |----- backward ----|          |  exposed  |\n");
  std::printf("# %5s %3s %9s %9s %9s %9s %9s %9s %6s %5s %5s %10s %9s %9s %9s %9s %6s\n", "ranks", "U", "seq_len", "time_ms",
              "p95_ms", "time_ms", "p95_ms", "GF/s/rank", "effic", "fwd%", "bwd%", "compute_ms", "sent_MiB", "need_MiB",
              "peak_MiB", "max_err", "#wrong");
  std::fflush(stdout);
}

void print_scaling_row(const ScalingPoint& p, const ScalingSetup& s) {
  char bwd[32] = "-", bwd95[32] = "-", bexp[16] = "-", err[32] = "-";
  if (s.backward) {
    std::snprintf(bwd, sizeof bwd, "%.2f", p.backward_s * 1e3);
    std::snprintf(bwd95, sizeof bwd95, "%.2f", p.backward_p95_s * 1e3);
    std::snprintf(bexp, sizeof bexp, "%.1f", 100 * p.exposed_backward);
  }
  if (p.checked) std::snprintf(err, sizeof err, "%.2e", p.max_abs_err);
  std::printf("  %5d %3d %9lld %9.2f %9.2f %9s %9s %9.1f %5.1f%% %5.1f %5s %10.2f %9.1f %9.1f %9.1f %9s %6d\n",
              p.ranks, p.ulysses, (long long)p.seq_len, p.forward_s * 1e3, p.forward_p95_s * 1e3, bwd, bwd95,
              p.flops_forward / p.forward_s / p.ranks / 1e9, 100 * p.efficiency, 100 * p.exposed_forward, bexp,
              p.forward_compute_s * 1e3, mib(double(p.bytes_sent)), mib(double(p.bytes_needed)), mib(double(p.peak_rss)),
              err, p.wrong);
  std::fflush(stdout);
}

void print_scaling_footer(const std::vector<ScalingPoint>& points, const ScalingSetup& s) {
  int wrong = 0;
  for (const ScalingPoint& p : points) wrong += p.wrong;
  if (wrong) std::printf("# FAILED: %d checked tensor%s off the fp64 reference (#wrong)\n", wrong, wrong > 1 ? "s" : "");
  else if (s.check_rows > 0) std::printf("# OK: every point matches the fp64 reference on its sampled rows\n");
  std::fflush(stdout);
}

Json scaling_config_json(const ScalingSetup& s) {
  Json c = Json::object();
  c["mode"] = s.weak ? "weak" : "strong";
  Json ranks = Json::array();
  for (int P : s.ranks) ranks.push_back(P);
  c["ranks"] = ranks;
  c["job_ranks"] = s.job_ranks;
  c["nodes"] = s.nodes;
  c["host"] = s.host;
  c["cpu"] = s.cpu;
  c["isa"] = s.isa;
  c["hardware_threads"] = s.hardware_threads;
  c["batch"] = s.batch;
  if (s.weak) c["tokens_per_rank"] = s.tokens_per_rank;
  else c["seq_len"] = s.seq_len;
  c["heads"] = s.heads;
  c["kv_heads"] = s.kv_heads;
  c["head_dim"] = s.head_dim;
  c["mask"] = s.mask;
  Json m = Json::object();  // enough for `ringattn plan --calibrate` to rebuild the mask
  m["causal"] = s.mask_options.causal;
  m["window"] = s.mask_options.window;
  m["doc_lens"] = s.mask_options.doc_lens;
  m["block_mask"] = s.mask_options.block_mask;
  m["mask_block"] = s.mask_options.mask_block;
  m["bigbird"] = s.mask_options.bigbird;
  c["mask_options"] = m;
  c["layout"] = s.layout;
  c["schedule"] = s.schedule;
  c["dtype"] = s.dtype;
  c["backend"] = s.backend;
  c["comm"] = s.comm;
  c["threads"] = s.threads;
  c["backward"] = s.backward;
  c["iters"] = s.iters;
  c["warmup"] = s.warmup;
  c["seed"] = s.seed;
  c["check_rows"] = s.check_rows;
  c["emulate_bandwidth_gbps"] = s.emulate_bandwidth;
  c["emulate_latency_us"] = s.emulate_latency;
  c["efficiency_base_ranks"] = s.ranks.empty() ? 1 : s.ranks.front();
  return c;
}

Json scaling_point_json(const ScalingPoint& p, const ScalingSetup& s) {
  Json j = Json::object();
  point_fields(p, s, [&](const char* key, Json value) { j[key] = std::move(value); });
  if (p.auto_choice) j["auto"] = *p.auto_choice;  // not a CSV column: the candidates are a list
  return j;
}

std::string scaling_csv(const std::vector<ScalingPoint>& points, const ScalingSetup& s) {
  std::string out;
  point_fields(ScalingPoint{}, s, [&](const char* key, const Json&) { out += std::string(out.empty() ? "" : ",") + key; });
  out += "\n";
  for (const ScalingPoint& p : points) {
    std::string line;
    point_fields(p, s, [&](const char*, const Json& value) {
      const std::string v = value.dump(0);
      line += (line.empty() ? "" : ",") + (v == "null" ? std::string() : v);
    });
    out += line + "\n";
  }
  return out;
}

}  // namespace ringattn
