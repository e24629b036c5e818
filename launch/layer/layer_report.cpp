#include "launch/layer/layer_report.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "kernels/cpu/attention_cpu.hpp"
#include "launch/cli/job_control.hpp"
#include "launch/cli/summary.hpp"
#include "runtime/errors.hpp"
#include "util/format.hpp"

namespace ringattn {

namespace {

double max_over_ranks(comm::Communicator& comm, double v) {
  comm.allreduce(&v, 1, DType::f64, comm::ReduceOp::max);
  return v;
}

// "q,k,v" of the projections for which `on` holds, or "none".
template <class On>
std::string projections_where(On on) {
  std::string names;
  for (int p = 0; p < kProjections; ++p)
    if (on(p)) names += std::string(names.empty() ? "" : ",") + projection_name(p);
  return names.empty() ? "none" : names;
}

}  // namespace

void print_layer_header(const LayerJob& job, const LoraLayer& layer, int ranks) {
  const LayerConfig& c = layer.config();
  const LayerOptions& o = job.opt;
  std::printf("ringattn layer  %d rank%s x %d thread%s  backend %s (%s)  comm %s\n", ranks, ranks > 1 ? "s" : "",
              c.threads, c.threads > 1 ? "s" : "", job.context.backend.c_str(),
              job.context.backend == "cpu" ? kernels::cpu_isa() : "device", job.context.comm.c_str());
  std::printf("  shape     batch %lld  seq_len %lld  d_model %lld  heads %lld (kv %lld)  head_dim %lld  %s\n",
              (long long)c.batch, (long long)c.seq_len, (long long)c.d_model, (long long)c.heads, (long long)c.kv_heads,
              (long long)c.head_dim(), dtype_name(c.dtype));
  std::printf("  lora      r %lld  alpha %g (scaling %g)  on %s\n", (long long)c.lora_rank, c.lora_alpha,
              double(c.scaling()), projections_where([&](int p) { return c.lora[size_t(p)]; }).c_str());
  std::printf("  mask      %s   layout %s   schedule %s\n", layer.mask().describe().c_str(),
              layout_name(layer.layout().kind()), o.schedule.c_str());
  if (c.rope.enabled())
    std::printf("  rope      theta %g  %s  dims %lld of %lld%s\n", c.rope.theta,
                c.rope.interleaved ? "interleaved (GPT-J)" : "rotate_half (Llama)",
                (long long)c.rope.rotary_dims(c.head_dim()), (long long)c.head_dim(),
                c.rope.per_document ? "  positions per document" : "");
  const std::string biased = projections_where([&](int p) { return c.bias[size_t(p)]; });
  if (biased != "none") std::printf("  bias      on %s\n", biased.c_str());
  if (o.steps > 0) {
    std::printf("# training: %d steps, %s lr %g%s, loss %s\n", o.steps, optimizer_name(job.optimizer.kind), o.lr,
                job.optimizer.kind == OptimizerKind::adamw ? " (betas 0.9,0.999 eps 1e-8 weight_decay 0.01)" : "",
                o.demo            ? "MSE against the teacher's output"
                : job.target_info ? "MSE against --target"
                                  : "sum(Y * dY)");
    if (o.demo)
      std::printf(
          "# demo: the student starts at W0 (B = 0) and learns the teacher's hidden rank-%lld change "
          "(%g of |W0|) on fresh random sequences\n",
          (long long)c.lora_rank, o.demo_change);
    std::printf("#  step            loss   seconds\n");
  }
  std::fflush(stdout);
}

void print_layer_check(const LayerCheck& check) {
  std::printf("  check     %s against the CPU backend in fp32: %s\n", check.passed ? "passed" : "FAILED",
              check.describe().c_str());
  std::fflush(stdout);
}

int report_layer(comm::Communicator& comm, const LayerJob& job, LoraLayer& layer, const LayerResults& r) {
  const int P = comm.size();
  const LayerConfig& c = layer.config();
  const LayerPassStats& fwd = r.forward;
  const LayerPassStats& bwd = r.backward;
  // Times are the slowest rank's, memory the largest.
  const double fwd_s = max_over_ranks(comm, fwd.seconds), bwd_s = max_over_ranks(comm, bwd.seconds);
  const double gather_wait = max_over_ranks(comm, fwd.gather_wait_seconds + bwd.gather_wait_seconds);
  const double shard = max_over_ranks(comm, double(layer.shard_bytes()));
  const double gathered = max_over_ranks(comm, double(layer.peak_gathered_bytes()));
  const double rss = max_over_ranks(comm, double(peak_rss_bytes()));
  int64_t pairs = count_visible_pairs(layer.mask().view(), layer.layout().runs(comm.rank()), c.seq_len);
  comm.allreduce(&pairs, 1, DType::i64, comm::ReduceOp::sum);
  const double flops = 4.0 * double(c.batch * c.heads * c.head_dim()) * double(pairs);
  double proj_flops = layer.projection_flops_forward();
  comm.allreduce(&proj_flops, 1, DType::f64, comm::ReduceOp::sum);
  const bool ran_backward = job.backward || job.opt.steps > 0;
  // The attention's K/V traffic (forward) and the share of the forward spent waiting for data
  // (K/V or parameters), averaged over ranks.
  uint64_t kv_sent = fwd.attention.bytes_sent, kv_needed = fwd.attention.bytes_needed;
  comm.allreduce(&kv_sent, 1, DType::i64, comm::ReduceOp::sum);
  comm.allreduce(&kv_needed, 1, DType::i64, comm::ReduceOp::sum);
  double exposed = fwd.seconds > 0 ? (fwd.attention.wait_seconds + fwd.gather_wait_seconds) / fwd.seconds : 0.0;
  comm.allreduce(&exposed, 1, DType::f64, comm::ReduceOp::sum);
  const int nodes = layer.session().nodes().nodes();
  if (comm.rank() != 0) return kExitOk;

  if (!r.losses.empty())
    std::printf("  loss      %.4e -> %.4e (%.1fx lower) in %d steps, %.2f s\n", r.losses.front(), r.losses.back(),
                r.losses.front() / std::max(r.losses.back(), 1e-300), int(r.losses.size()), r.train_seconds);
  if (fwd_s > 0)
    std::printf("  forward   %.4f s  (attention %.4f, projections %.4f, exposed gathers %.4f)\n", fwd_s,
                fwd.attention_seconds, fwd.projection_seconds, fwd.gather_wait_seconds);
  if (ran_backward && bwd_s > 0)
    std::printf("  backward  %.4f s  (attention %.4f, projections %.4f, exposed gathers %.4f, reduce %.4f)\n", bwd_s,
                bwd.attention_seconds, bwd.projection_seconds, bwd.gather_wait_seconds, bwd.reduce_seconds);
  std::printf("  params    %s in all; per rank %s held, at most %s gathered\n",
              human_bytes(double(layer.full_parameter_bytes())).c_str(), human_bytes(shard).c_str(),
              human_bytes(gathered).c_str());
  std::printf("  memory    peak %s per rank (max)\n", human_bytes(rss).c_str());
  if (r.check) print_layer_check(*r.check);
  std::fflush(stdout);
  if (job.opt.json.empty()) return kExitOk;
  RunSummary summary;
  summary.ranks = P, summary.nodes = nodes, summary.batch = c.batch, summary.seq_len = c.seq_len;
  summary.heads = c.heads, summary.kv_heads = c.kv_heads, summary.head_dim = c.head_dim();
  summary.mask = layer.mask().describe(), summary.layout = layout_name(layer.layout().kind());
  summary.schedule = job.opt.schedule, summary.dtype = dtype_name(c.dtype), summary.backend = job.context.backend;
  summary.comm = job.context.comm, summary.threads = c.threads, summary.forward_s = fwd_s, summary.flops_forward = flops;
  if (ran_backward) summary.backward_s = bwd_s;
  summary.gflops_per_rank = rate_per_rank(flops + proj_flops, fwd_s, P);  // the whole layer's work
  summary.comm_bytes_sent = kv_sent, summary.comm_bytes_needed = kv_needed;
  summary.exposed_comm_fraction = exposed / P, summary.peak_rss_bytes = uint64_t(rss);
  if (r.check) summary.max_abs_err = r.check->max_abs_err();
  Json j = summary_json(summary);  // then what only the layer reports
  j["d_model"] = c.d_model;
  j["lora_rank"] = c.lora_rank;
  j["lora_alpha"] = c.lora_alpha;
  j["projection_flops_forward"] = proj_flops;
  j["gather_wait_s"] = gather_wait;
  j["parameter_bytes"] = double(layer.full_parameter_bytes());
  j["parameter_bytes_per_rank"] = shard;
  j["peak_gathered_bytes"] = gathered;
  if (r.check) {
    j["check_passed"] = r.check->passed;
    j["check_max_relative_err"] = r.check->max_relative();
  }
  if (!r.losses.empty()) {
    j["steps"] = int(r.losses.size());
    j["optimizer"] = optimizer_name(job.optimizer.kind);
    j["lr"] = job.opt.lr;
    Json l = Json::array();
    for (double v : r.losses) l.push_back(v);
    j["losses"] = l;
  }
  try {
    write_text_file(job.opt.json, "--json", j.dump() + "\n");
  } catch (const std::exception& e) {
    print_error(message_of(e));
    return exit_code_of(e);
  }
  return kExitOk;
}

}  // namespace ringattn
