#include "launch/plan/plan_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace ringattn {

namespace {

std::string rate_text(double gflops) {
  char buf[32];
  if (gflops >= 1e3) std::snprintf(buf, sizeof buf, "%.4g TFLOP/s", gflops / 1e3);
  else std::snprintf(buf, sizeof buf, "%.4g GFLOP/s", gflops);
  return buf;
}

std::string link_text(const LinkSpec& l) {
  char buf[64];
  if (l.gbps > 0) std::snprintf(buf, sizeof buf, "%.4g GB/s, %.3g us", l.gbps, l.latency_us);
  else std::snprintf(buf, sizeof buf, "unlimited bandwidth, %.3g us", l.latency_us);
  return buf;
}

double gib(double bytes) { return bytes / double(1ull << 30); }

// Tokens per rank from which a full c x c block computes longer than its K/V travel:
// 4 c^2 H D / F >= 2 c Hkv D bytes / BW  <=>  c >= Hkv bytes / (2 H) * F / BW.
double block_condition_tokens(const Workload& w, double gflops, double gbps) {
  if (gbps <= 0) return 0.0;
  return double(w.kv_heads * w.dtype_bytes) / double(2 * w.heads) * (gflops * 1e9) / (gbps * 1e9);
}

}  // namespace

Json print_projection(const ClusterSpec& c, const Workload& w, const Mask& mask, const std::vector<int>& ranks,
                      const std::vector<LayoutKind>& layouts, const std::vector<Schedule>& schedules) {
  const bool one_node = c.ranks_per_node >= kOneNode;
  std::printf("# ringattn plan: %s\n", c.name.c_str());
  if (one_node)
    std::printf("# cluster: one node, link %s between ranks", link_text(c.intra).c_str());
  else
    std::printf("# cluster: %d ranks per node; within a node %s per rank; between nodes %s per node over %d link%s",
                c.ranks_per_node, link_text(c.intra).c_str(), link_text(c.inter).c_str(), c.inter_links,
                c.inter_links > 1 ? "s" : "");
  char host[32] = "free";
  if (c.host_copy_gbps > 0) std::snprintf(host, sizeof host, "%.3g GB/s", c.host_copy_gbps);
  std::printf("\n# kernels per rank: forward %s, backward %s; %.3g us per kernel call, %.3g us per message, host copies %s",
              rate_text(c.forward_gflops).c_str(), rate_text(c.backward_gflops).c_str(), c.step_overhead_us,
              c.message_overhead_us, host);
  if (c.memory_gib > 0) std::printf("; %g GiB per rank", c.memory_gib);
  std::printf("\n# workload: seq_len %lld, batch %lld, heads %lld (kv %lld), head_dim %lld, %s, mask %s, %s\n",
              (long long)w.seq_len, (long long)w.batch, (long long)w.heads, (long long)w.kv_heads,
              (long long)w.head_dim, w.dtype_bytes == 2 ? "bf16" : "fp32", mask.describe().c_str(),
              w.backward ? "forward + backward" : "forward only");
  std::printf("# model: compute = visible pairs x 4BHD / rate; transfer = latency + bytes / bandwidth, queued per link;\n"
              "#   a step starts when its K/V arrived and the previous compute ended, so it costs max(compute, transfer)\n"
              "#   once the pipeline runs; host costs not overlapped; a pass ends with its slowest rank (cluster_model.hpp)\n");
  const double intra_c = block_condition_tokens(w, c.forward_gflops, c.intra.gbps);
  const double per_flow = std::min(c.inter.gbps / c.inter_links, c.inter.gbps / std::max(1, c.ranks_per_node));
  std::printf("# block condition (a full c x c block computes >= its K/V transfer): c >= Hkv*bytes/(2H) * FLOPS/bandwidth =");
  if (c.intra.gbps > 0) std::printf(" %.0f tokens within a node", intra_c);
  else std::printf(" any c within a node (unlimited link)");
  if (!one_node && per_flow > 0)
    std::printf(", %.0f between nodes (%.3g GB/s per rank)", block_condition_tokens(w, c.forward_gflops, per_flow), per_flow);
  std::printf("\n#\n# %5s %5s %-10s %-8s %10s %10s %6s %9s %9s %9s %6s %7s %8s %8s %4s\n", "ranks", "nodes", "layout",
              "schedule", "step_ms", "xfer_ms", "ratio", "fwd_s", "bwd_s", "total_s", "effic", "exposed", "GiB/rank",
              "sent_GiB", "fits");

  Json all = Json::array(), best_all = Json::array();
  const MaskView mv = mask.view();
  for (int P : ranks) {
    const int nodes = one_node ? 1 : (P + c.ranks_per_node - 1) / c.ranks_per_node;
    const Prediction* best = nullptr;
    LayoutKind best_layout = layouts.front();
    Schedule best_schedule = schedules.front();
    std::vector<Prediction> here;
    here.reserve(layouts.size() * schedules.size());
    for (LayoutKind layout : layouts)
      for (Schedule schedule : schedules) {
        Workload x = w;
        x.layout = layout, x.schedule = schedule;
        here.push_back(predict(c, x, mv, P));
        const Prediction& p = here.back();
        const double ratio = p.step_transfer_seconds > 0 ? p.step_compute_seconds / p.step_transfer_seconds : 0.0;
        char ratio_text[16] = "-", backward_text[16] = "-";
        if (ratio > 0) std::snprintf(ratio_text, sizeof ratio_text, "%.2f", ratio);
        if (w.backward) std::snprintf(backward_text, sizeof backward_text, "%.4f", p.backward.seconds);
        std::printf("  %5d %5d %-10s %-8s %10.3f %10.3f %6s %9.4f %9s %9.4f %5.1f%% %6.1f%% %8.2f %8.2f %4s\n", P, nodes,
                    layout_name(layout), schedule_name(schedule), p.step_compute_seconds * 1e3,
                    p.step_transfer_seconds * 1e3, ratio_text, p.forward.seconds, backward_text, p.total_seconds(),
                    100 * p.efficiency, 100 * p.forward.exposed_fraction, gib(double(p.memory_bytes)),
                    gib(double(p.bytes_sent)), p.fits_memory ? "yes" : "NO");
        Json j = Json::object();
        j["ranks"] = P;
        j["nodes"] = nodes;
        j["layout"] = layout_name(layout);
        j["schedule"] = schedule_name(schedule);
        j["step_compute_s"] = p.step_compute_seconds;
        j["step_transfer_s"] = p.step_transfer_seconds;
        j["forward_s"] = p.forward.seconds;
        if (w.backward) j["backward_s"] = p.backward.seconds;
        j["efficiency"] = p.efficiency;
        j["exposed_comm_fraction"] = p.forward.exposed_fraction;
        j["flops_forward"] = p.flops_forward;
        j["comm_bytes_sent"] = p.bytes_sent;
        j["comm_bytes_needed"] = p.bytes_needed;
        j["memory_bytes_per_rank"] = p.memory_bytes;
        j["fits_memory"] = p.fits_memory;
        all.push_back(j);
        const bool better = !best || (p.fits_memory && !best->fits_memory) ||
                            (p.fits_memory == best->fits_memory &&
                             (p.total_seconds() < best->total_seconds() * (1 - 1e-9) ||
                              (p.total_seconds() <= best->total_seconds() * (1 + 1e-9) && p.bytes_sent < best->bytes_sent)));
        if (better) best = &here.back(), best_layout = layout, best_schedule = schedule;
      }
    std::printf("# -> %d ranks: %s/%s, %.4g s %s, efficiency %.1f%%, %.2f GiB per rank%s\n", P, layout_name(best_layout),
                schedule_name(best_schedule), best->total_seconds(), w.backward ? "forward + backward" : "forward",
                100 * best->efficiency, gib(double(best->memory_bytes)),
                best->fits_memory ? "" : " (does not fit: more ranks needed)");
    Json b = Json::object();
    b["ranks"] = P;
    b["layout"] = layout_name(best_layout);
    b["schedule"] = schedule_name(best_schedule);
    b["seconds"] = best->total_seconds();
    b["efficiency"] = best->efficiency;
    best_all.push_back(b);
  }
  std::fflush(stdout);
  Json out = Json::object();
  out["predictions"] = all;
  out["recommended"] = best_all;
  return out;
}

bool print_calibration(const Calibration& cal, int threads, const std::vector<Comparison>& rows,
                       const std::vector<std::string>& skipped, double tolerance, bool same_run) {
  const ClusterSpec& m = cal.machine;
  char host[32] = "free";
  if (m.host_copy_gbps > 0) std::snprintf(host, sizeof host, "%.3g GB/s", m.host_copy_gbps);
  const bool nodes = std::any_of(rows.begin(), rows.end(), [](const Comparison& c) { return c.point->nodes > 1; });
  const std::string between = nodes ? "; between nodes " + link_text(m.inter) : "";
  if (same_run)
    std::printf("# each point predicted with its own run's kernel rates (its time not blocked waiting), %d thread%s per\n"
                "#   rank; the machine's own link %s%s; U > 1: the hybrid, its intra-group link in brackets\n",
                threads, threads > 1 ? "s" : "", link_text(m.intra).c_str(), between.c_str());
  else
    std::printf("# calibration: %d passes, %d thread%s per rank: forward %s, backward %s per rank; %.1f us per kernel call;\n"
                "#   host copies %s; %.1f us per message posted; the machine's own link %s (rms residual of the fit %.1f%%)\n",
                cal.points, threads, threads > 1 ? "s" : "", rate_text(m.forward_gflops).c_str(),
                rate_text(m.backward_gflops).c_str(), m.step_overhead_us, host, m.message_overhead_us,
                (link_text(m.intra) + between).c_str(), 100 * cal.rms_relative_residual);
  for (const std::string& s : skipped) std::printf("# skipped: %s\n", s.c_str());
  std::printf("# %-24s %5s %2s %8s %-10s %-8s %-16s %9s %9s %7s %9s %9s %7s %7s %7s\n", "point", "ranks", "U", "seq_len",
              "layout", "schedule", "link", "fwd_ms", "pred_ms", "error", "bwd_ms", "pred_ms", "error", "exp_%", "pred_%");
  double worst = 0.0;
  for (const Comparison& c : rows) {
    const MeasuredPoint& p = *c.point;
    char link[64] = "machine", bwd[3][16] = {"-", "-", "-"};
    if (p.nodes > 1) std::snprintf(link, sizeof link, "%d nodes", p.nodes);
    if (p.emulated) std::snprintf(link, sizeof link, "%gGB/s,%gus", p.link.gbps, p.link.latency_us);
    if (p.ulysses > 1 && p.group_emulated)
      std::snprintf(link + std::strlen(link), sizeof link - std::strlen(link), "[%gGB/s,%gus]", p.group_link.gbps,
                    p.group_link.latency_us);
    if (p.workload.backward && p.backward_s > 0) {
      std::snprintf(bwd[0], 16, "%.2f", p.backward_s * 1e3);
      std::snprintf(bwd[1], 16, "%.2f", c.predicted.backward.seconds * 1e3);
      std::snprintf(bwd[2], 16, "%+.1f%%", 100 * c.backward_error);
    }
    std::string label = p.label.size() > 24 ? "..." + p.label.substr(p.label.size() - 21) : p.label;
    std::printf("  %-24s %5d %2d %8lld %-10s %-8s %-16s %9.2f %9.2f %+6.1f%% %9s %9s %7s %7.1f %7.1f\n", label.c_str(),
                p.ranks, p.ulysses, (long long)p.workload.seq_len, layout_name(p.workload.layout), schedule_name(p.workload.schedule), link,
                p.forward_s * 1e3, c.predicted.forward.seconds * 1e3, 100 * c.forward_error, bwd[0], bwd[1], bwd[2],
                100 * p.exposed_fraction, 100 * c.predicted.forward.exposed_fraction);
    worst = std::max(worst, c.worst_error());
  }
  const bool ok = worst <= tolerance;
  std::printf("# largest error %.1f%% over %zu points (tolerance %.0f%%): %s\n#\n", 100 * worst, rows.size(),
              100 * tolerance, ok ? "within tolerance" : "EXCEEDED");
  std::fflush(stdout);
  return ok;
}

Json calibration_json(const Calibration& cal, const std::vector<Comparison>& rows, double tolerance) {
  Json j = Json::object(), list = Json::array();
  j["passes"] = cal.points;
  j["rms_relative_residual"] = cal.rms_relative_residual;
  j["tolerance"] = tolerance;
  double worst = 0.0;
  for (const Comparison& c : rows) {
    const MeasuredPoint& p = *c.point;
    Json r = Json::object();
    r["point"] = p.label;
    r["ranks"] = p.ranks;
    r["nodes"] = p.nodes;
    r["ulysses"] = p.ulysses;
    r["seq_len"] = p.workload.seq_len;
    r["layout"] = layout_name(p.workload.layout);
    r["schedule"] = schedule_name(p.workload.schedule);
    r["emulated"] = p.emulated;
    r["link_gbps"] = p.emulated ? p.link.gbps : cal.machine.intra.gbps;
    r["link_latency_us"] = p.emulated ? p.link.latency_us : cal.machine.intra.latency_us;
    r["forward_s"] = p.forward_s;
    r["predicted_forward_s"] = c.predicted.forward.seconds;
    r["forward_error"] = c.forward_error;
    if (p.workload.backward) {
      r["backward_s"] = p.backward_s;
      r["predicted_backward_s"] = c.predicted.backward.seconds;
      r["backward_error"] = c.backward_error;
    }
    r["exposed_comm_fraction"] = p.exposed_fraction;
    r["predicted_exposed_comm_fraction"] = c.predicted.forward.exposed_fraction;
    list.push_back(r);
    worst = std::max(worst, c.worst_error());
  }
  j["largest_error"] = worst;
  j["within_tolerance"] = worst <= tolerance;
  j["points"] = list;
  return j;
}

}  // namespace ringattn
