#include "launch/plan/plan_job.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>

#include "launch/cli/job_control.hpp"
#include "launch/cli/json.hpp"
#include "runtime/io/json_reader.hpp"
#include "launch/cli/mask_options.hpp"
#include "launch/cli/options_util.hpp"
#include "launch/plan/plan_report.hpp"
#include "launch/plan/calibration.hpp"
#include "launch/plan/hybrid_report.hpp"
#include "runtime/errors.hpp"

namespace po = boost::program_options;

namespace ringattn {
namespace {

// The cluster projected when none is described: 8 GPUs per node, NVLink within a node, four
// 400 Gb/s InfiniBand NICs per node, FlashAttention-class kernels (bf16).
ClusterSpec default_cluster() {
  ClusterSpec c;
  c.name = "8x H100 SXM per node, NVLink 450 GB/s, 4x 400 Gb/s InfiniBand";
  c.ranks_per_node = 8;
  c.intra = {450.0, 3.0};
  c.inter = {200.0, 5.0};
  c.inter_links = 4;
  c.forward_gflops = 500e3;
  c.backward_gflops = 400e3;
  c.step_overhead_us = 20.0;
  c.message_overhead_us = 10.0;
  c.memory_gib = 80.0;
  return c;
}

struct PlanOptions {
  std::string cluster, ranks = "8,64,512", layouts = "contiguous,zigzag,striped", schedules = "direct,ring";
  int64_t seq_len = 1 << 20, batch = 1, heads = 8, kv_heads = 0, head_dim = 128;
  std::string dtype = "bf16";
  uint64_t seed = 0;
  MaskOptions mask;
  bool forward_only = false;
  std::string calibrate, validate, save_calibration, json;
  double tolerance = 0.15;
  bool check = false, same_run = false;
  double machine_bandwidth = 0.0, machine_latency = 0.0;
  double machine_inter_bandwidth = 0.0, machine_inter_latency = 0.0;  // between the nodes of multi-node points
  std::string ulysses;  // hybrid degrees to compare ("auto": 1, 2, 4, ...)
};

// Cluster flags: applied over --cluster FILE (or the default cluster) when given.
struct ClusterFlags {
  int ranks_per_node = 0, inter_links = 0;
  double intra_gbps = 0, intra_us = -1, inter_gbps = 0, inter_us = -1;
  double tflops = 0, gflops = 0, backward_tflops = 0, backward_gflops = 0;
  double step_us = -1, message_us = -1, host_gbps = -1, memory_gib = -1;
};

// "what (default 450)": the default cluster's value, since the flags only override what is given.
std::string with_default(const char* what, double value) {
  std::ostringstream text;
  text << what << " (default " << value << ")";
  return text.str();
}

po::options_description describe(PlanOptions& o, ClusterFlags& f) {
  const ClusterSpec d = default_cluster();
  po::options_description cluster("Cluster (--cluster FILE.json, then these flags over it; default: 8x H100 per node)");
  cluster.add_options()
      ("cluster", po::value(&o.cluster)->value_name("FILE.json"), "cluster description (keys as these flags, see --help)")
      ("ranks-per-node", po::value(&f.ranks_per_node)->value_name("N"),
       with_default("GPUs (ranks) per node", d.ranks_per_node).c_str())
      ("intra-bandwidth", po::value(&f.intra_gbps)->value_name("GBPS"),
       with_default("within a node, per rank and direction (GB/s)", d.intra.gbps).c_str())
      ("intra-latency", po::value(&f.intra_us)->value_name("US"),
       with_default("within a node (microseconds)", d.intra.latency_us).c_str())
      ("inter-bandwidth", po::value(&f.inter_gbps)->value_name("GBPS"),
       with_default("between nodes: a node's total (GB/s)", d.inter.gbps).c_str())
      ("inter-links", po::value(&f.inter_links)->value_name("N"),
       with_default("NICs per node; one transfer uses one", d.inter_links).c_str())
      ("inter-latency", po::value(&f.inter_us)->value_name("US"),
       with_default("between nodes (microseconds)", d.inter.latency_us).c_str())
      ("tflops", po::value(&f.tflops)->value_name("X"),
       with_default("forward attention kernel per rank (TFLOP/s)", d.forward_gflops / 1e3).c_str())
      ("gflops", po::value(&f.gflops)->value_name("X"), "the same in GFLOP/s (CPUs)")
      ("backward-tflops", po::value(&f.backward_tflops)->value_name("X"), "backward kernel (default: 0.8x forward)")
      ("backward-gflops", po::value(&f.backward_gflops)->value_name("X"), "the same in GFLOP/s")
      ("step-overhead", po::value(&f.step_us)->value_name("US"),
       with_default("per kernel call", d.step_overhead_us).c_str())
      ("message-overhead", po::value(&f.message_us)->value_name("US"),
       with_default("per message, not overlapped", d.message_overhead_us).c_str())
      ("host-copy-bandwidth", po::value(&f.host_gbps)->value_name("GBPS"),
       with_default("host copies, not overlapped (0 = free)", d.host_copy_gbps).c_str())
      ("memory-gib", po::value(&f.memory_gib)->value_name("GIB"),
       with_default("memory per rank (0 = unknown)", d.memory_gib).c_str());
  po::options_description work("Workload");
  work.add_options()
      ("ranks", po::value(&o.ranks)->default_value("8,64,512")->value_name("P1,P2,..."), "rank counts to project")
      ("seq-len", po::value(&o.seq_len)->default_value(1 << 20)->value_name("L"), "sequence length")
      ("batch", po::value(&o.batch)->default_value(1)->value_name("B"), "batch")
      ("heads", po::value(&o.heads)->default_value(8)->value_name("H"), "query heads")
      ("kv-heads", po::value(&o.kv_heads)->default_value(0)->value_name("HKV"), "key/value heads (0 = H)")
      ("head-dim", po::value(&o.head_dim)->default_value(128)->value_name("D"), "head dim")
      ("dtype", po::value(&o.dtype)->default_value("bf16")->value_name("fp32|bf16"), "storage and transfer type")
      ("seed", po::value(&o.seed)->default_value(0)->value_name("S"), "seed of BigBird masks")
      ("layouts", po::value(&o.layouts)->default_value("contiguous,zigzag,striped"), "layouts to compare")
      ("schedules", po::value(&o.schedules)->default_value("direct,ring"), "schedules to compare")
      ("forward-only", po::bool_switch(&o.forward_only), "inference: forward passes only")
      ("ulysses", po::value(&o.ulysses)->value_name("U1,U2,...|auto"),
       "also predict the hybrid (all-to-all inside groups of U ranks, the ring across) and recommend U");
  po::options_description masks("Masks (combined by intersection)");
  add_mask_options(masks, o.mask);
  po::options_description cal("Calibration on this machine");
  cal.add_options()
      ("calibrate", po::value(&o.calibrate)->value_name("FILE,..."),
       "fit kernel rates, per-call, per-byte and per-message costs to `ringattn bench --json` files")
      ("validate", po::value(&o.validate)->value_name("FILE,..."), "compare with these files (default: the --calibrate ones)")
      ("tolerance", po::value(&o.tolerance)->default_value(0.15, "0.15")->value_name("X"), "largest relative error accepted")
      ("check", po::bool_switch(&o.check), "exit 3 when a prediction misses a measured time by more than --tolerance")
      ("same-run", po::bool_switch(&o.same_run),
       "no fit: predict each --calibrate point with the kernel rate of its own run (its time not blocked), "
       "so that the links and the waiting are what is compared (loaded or oversubscribed machines; hybrid points)")
      ("machine-link-bandwidth", po::value(&o.machine_bandwidth)->default_value(0.0)->value_name("GBPS"),
       "the machine's own link between ranks, bandwidth (0 = unlimited; default: fitted with the latency)")
      ("machine-link-latency", po::value(&o.machine_latency)->default_value(0.0)->value_name("US"),
       "its latency (default: both fitted to the points run without emulation)")
      ("machine-inter-bandwidth", po::value(&o.machine_inter_bandwidth)->default_value(0.0)->value_name("GBPS"),
       "points that spanned several nodes (their JSON's nodes): a node's link to the others, bandwidth per "
       "direction (0 = unlimited; the cluster in a box: its --rate's TCP payload rate)")
      ("machine-inter-latency", po::value(&o.machine_inter_latency)->default_value(0.0)->value_name("US"),
       "its latency")
      ("save-calibration", po::value(&o.save_calibration)->value_name("FILE.json"), "write the fitted machine (a --cluster file)")
      ("json", po::value(&o.json)->value_name("FILE"), "write predictions (and the calibration) as JSON");
  po::options_description all("ringattn plan options");
  all.add_options()("help,h", "show this help");
  all.add(cluster).add(work).add(masks).add(cal);
  return all;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

double positive_or(const JsonValue& j, const char* key, double fallback, const std::string& path) {
  const JsonValue* v = j.find(key);
  if (!v) return fallback;
  if (!v->is_number() || v->number() < 0)
    throw usage_error(std::string("--cluster ") + path + ": \"" + key + "\" must be a non-negative number");
  return v->number();
}

ClusterSpec load_cluster(const PlanOptions& o, const ClusterFlags& f, const po::variables_map& vm) {
  ClusterSpec c = default_cluster();
  if (!o.cluster.empty()) {
    const JsonValue j = read_json_file(o.cluster, "--cluster");
    if (!j.is_object()) throw usage_error("--cluster " + o.cluster + ": expected a JSON object");
    ClusterSpec d;
    d.name = j.string_or("name", o.cluster);
    d.ranks_per_node = static_cast<int>(positive_or(j, "ranks_per_node", 1, o.cluster));
    d.intra = {positive_or(j, "intra_bandwidth_gbps", 0, o.cluster), positive_or(j, "intra_latency_us", 0, o.cluster)};
    d.inter = {positive_or(j, "inter_bandwidth_gbps", 0, o.cluster), positive_or(j, "inter_latency_us", 0, o.cluster)};
    d.inter_links = static_cast<int>(positive_or(j, "inter_links", 1, o.cluster));
    d.forward_gflops = positive_or(j, "forward_gflops", positive_or(j, "forward_tflops", 0, o.cluster) * 1e3, o.cluster);
    d.backward_gflops = positive_or(j, "backward_gflops", positive_or(j, "backward_tflops", 0, o.cluster) * 1e3, o.cluster);
    d.step_overhead_us = positive_or(j, "step_overhead_us", 0, o.cluster);
    d.message_overhead_us = positive_or(j, "message_overhead_us", 0, o.cluster);
    d.host_copy_gbps = positive_or(j, "host_copy_gbps", 0, o.cluster);
    d.memory_gib = positive_or(j, "memory_gib", 0, o.cluster);
    c = d;
  }
  if (given(vm, "ranks-per-node")) c.ranks_per_node = f.ranks_per_node;
  if (given(vm, "intra-bandwidth")) c.intra.gbps = f.intra_gbps;
  if (given(vm, "intra-latency")) c.intra.latency_us = f.intra_us;
  if (given(vm, "inter-bandwidth")) c.inter.gbps = f.inter_gbps;
  if (given(vm, "inter-links")) c.inter_links = f.inter_links;
  if (given(vm, "inter-latency")) c.inter.latency_us = f.inter_us;
  if (given(vm, "tflops") && given(vm, "gflops")) throw usage_error("--tflops and --gflops give the same rate: use one");
  if (given(vm, "tflops")) c.forward_gflops = f.tflops * 1e3;
  if (given(vm, "gflops")) c.forward_gflops = f.gflops;
  if (given(vm, "backward-tflops")) c.backward_gflops = f.backward_tflops * 1e3;
  else if (given(vm, "backward-gflops")) c.backward_gflops = f.backward_gflops;
  else if (given(vm, "tflops") || given(vm, "gflops")) c.backward_gflops = 0.8 * c.forward_gflops;
  if (given(vm, "step-overhead")) c.step_overhead_us = f.step_us;
  if (given(vm, "message-overhead")) c.message_overhead_us = f.message_us;
  if (given(vm, "host-copy-bandwidth")) c.host_copy_gbps = f.host_gbps;
  if (given(vm, "memory-gib")) c.memory_gib = f.memory_gib;
  if (c.backward_gflops <= 0) c.backward_gflops = 0.8 * c.forward_gflops;
  if (c.ranks_per_node < 1 || c.inter_links < 1) throw usage_error("--ranks-per-node and --inter-links must be at least 1");
  if (c.forward_gflops <= 0) throw usage_error("the cluster needs a kernel rate: --tflops or --gflops (or forward_tflops in --cluster)");
  if (c.intra.gbps < 0 || c.inter.gbps < 0 || c.intra.latency_us < 0 || c.inter.latency_us < 0 ||
      c.step_overhead_us < 0 || c.message_overhead_us < 0 || c.host_copy_gbps < 0 || c.memory_gib < 0)
    throw usage_error("cluster bandwidths, latencies, overheads and memory must not be negative");
  return c;
}

Json cluster_json(const ClusterSpec& c) {
  Json j = Json::object();
  j["name"] = c.name;
  j["ranks_per_node"] = c.ranks_per_node;
  j["intra_bandwidth_gbps"] = c.intra.gbps;
  j["intra_latency_us"] = c.intra.latency_us;
  j["inter_bandwidth_gbps"] = c.inter.gbps;
  j["inter_links"] = c.inter_links;
  j["inter_latency_us"] = c.inter.latency_us;
  j["forward_gflops"] = c.forward_gflops;
  j["backward_gflops"] = c.backward_gflops;
  j["step_overhead_us"] = c.step_overhead_us;
  j["message_overhead_us"] = c.message_overhead_us;
  j["host_copy_gbps"] = c.host_copy_gbps;
  j["memory_gib"] = c.memory_gib;
  return j;
}

int64_t dtype_bytes_of(const std::string& name, const std::string& where) {
  if (name == "fp32") return 4;
  if (name == "bf16") return 2;
  throw usage_error(where + ": dtype " + name + ": expected fp32 or bf16");
}

// The points of `ringattn bench --json` files, each with its mask rebuilt and its link.
std::vector<MeasuredPoint> load_points(const std::string& files, int* threads, std::vector<std::string>& skipped,
                                       bool keep_oversubscribed = false) {
  std::vector<MeasuredPoint> out;
  for (const std::string& path : split_list(files)) {
    const JsonValue doc = read_json_file(path, "--calibrate");
    const JsonValue* config = doc.find("config");
    const JsonValue* points = doc.find("points");
    if (!config || !config->is_object() || !points || !points->is_array())
      throw usage_error("--calibrate " + path + ": expected {\"config\": {...}, \"points\": [...]} from ringattn bench --json");
    const JsonValue* m = config->find("mask_options");
    MaskOptions mo;
    if (m) {
      mo.causal = m->bool_or("causal", false);
      mo.window = m->string_or("window", "");
      mo.doc_lens = m->string_or("doc_lens", "");
      mo.block_mask = m->string_or("block_mask", "");
      mo.mask_block = static_cast<int64_t>(m->number_or("mask_block", 128));
      mo.bigbird = m->string_or("bigbird", "");
    }
    const double emulated_gbps = config->number_or("emulate_bandwidth_gbps", 0.0);
    const double emulated_us = config->number_or("emulate_latency_us", 0.0);
    const int hardware = static_cast<int>(config->number_or("hardware_threads", 0));
    const int nodes = std::max(1, static_cast<int>(config->number_or("nodes", 1)));
    for (size_t i = 0; i < points->items().size(); ++i) {
      const JsonValue& p = points->items()[i];
      MeasuredPoint mp;
      mp.label = path + "#" + std::to_string(i);
      mp.ranks = static_cast<int>(p.number_or("ranks", 0));
      mp.nodes = std::max(1, static_cast<int>(p.number_or("nodes", 1)));  // older files: one node
      const int point_nodes = p.find("nodes") ? mp.nodes : nodes;
      Workload& w = mp.workload;
      w.batch = static_cast<int64_t>(p.number_or("batch", 1));
      w.seq_len = static_cast<int64_t>(p.number_or("seq_len", 0));
      w.heads = static_cast<int64_t>(p.number_or("heads", 1));
      w.kv_heads = static_cast<int64_t>(p.number_or("kv_heads", 1));
      w.head_dim = static_cast<int64_t>(p.number_or("head_dim", 1));
      w.dtype_bytes = dtype_bytes_of(p.string_or("dtype", "fp32"), "--calibrate " + path);
      w.layout = parse_layout(p.string_or("layout", "contiguous"));
      w.schedule = parse_schedule(p.string_or("schedule", "direct"));
      w.backward = p.number_or("backward_s", 0.0) > 0;
      if (mp.ranks < 1 || w.seq_len < mp.ranks)
        throw usage_error("--calibrate " + mp.label + ": needs ranks and seq_len (a ringattn bench --json point)");
      const int t = static_cast<int>(p.number_or("threads", 1));
      if (*threads == 0) *threads = t;
      if (t != *threads)
        throw usage_error("--calibrate " + mp.label + ": ran " + std::to_string(t) + " threads per rank, others " +
                         std::to_string(*threads) + ": calibrate one thread count at a time");
      if (!keep_oversubscribed && hardware > 0 && (mp.ranks + point_nodes - 1) / point_nodes * t > hardware) {
        skipped.push_back(mp.label + " (" + std::to_string(mp.ranks) + " ranks x " + std::to_string(t) +
                          " threads oversubscribe " + std::to_string(hardware) + " hardware threads)");
        continue;
      }
      mp.mask = mask_from_options(mo, w.seq_len, static_cast<uint64_t>(config->number_or("seed", 0)));
      mp.emulated = emulated_gbps > 0 || emulated_us > 0;
      mp.link = LinkSpec{emulated_gbps, emulated_us};
      mp.forward_s = p.number_or("forward_s", 0.0);
      mp.forward_mean_s = p.number_or("forward_mean_s", mp.forward_s);
      mp.forward_wait_s = p.number_or("forward_wait_s", 0.0);
      mp.backward_s = p.number_or("backward_s", 0.0);
      mp.backward_mean_s = p.number_or("backward_mean_s", mp.backward_s);
      mp.backward_wait_s = p.number_or("backward_wait_s", 0.0);
      mp.exposed_fraction = p.number_or("exposed_comm_fraction", 0.0);
      mp.ulysses = static_cast<int>(p.number_or("ulysses", 1));
      mp.group_link = LinkSpec{p.number_or("emulate_intra_bandwidth_gbps", 0.0), p.number_or("emulate_intra_latency_us", 0.0)};
      mp.group_emulated = mp.group_link.gbps > 0 || mp.group_link.latency_us > 0;
      out.push_back(std::move(mp));
    }
  }
  return out;
}

// Everything rank 0 does: returns the exit code.
int plan(const PlanOptions& o, const ClusterFlags& f, const po::variables_map& vm) {
  if (o.tolerance <= 0) throw usage_error("--tolerance must be positive");
  if (!o.validate.empty() && o.calibrate.empty()) throw usage_error("--validate needs --calibrate");
  if ((o.check || !o.save_calibration.empty() || o.same_run) && o.calibrate.empty())
    throw usage_error("--check, --same-run and --save-calibration need --calibrate");
  if (o.same_run && (!o.validate.empty() || !o.save_calibration.empty()))
    throw usage_error("--same-run fits nothing: it takes neither --validate nor --save-calibration");
  Json out = Json::object();

  // Calibration on this machine, and the comparison with what was measured.
  bool within = true;
  std::optional<ClusterSpec> machine;
  if (o.same_run) {
    int threads = 0;
    std::vector<std::string> skipped;
    const std::vector<MeasuredPoint> points = load_points(o.calibrate, &threads, skipped, true);
    if (points.empty()) throw usage_error("--calibrate " + o.calibrate + ": no usable points");
    // No fit: each point's rates come from its run; the machine's links as given (default unlimited).
    Calibration own;
    own.machine.name = "each run's own kernel rates";
    own.machine.intra = {o.machine_bandwidth, o.machine_latency};
    own.machine.inter = {o.machine_inter_bandwidth, o.machine_inter_latency};
    const std::vector<Comparison> rows = compare_same_run(points, own.machine);
    within = print_calibration(own, threads, rows, skipped, o.tolerance, true);
    out["calibration"] = calibration_json(own, rows, o.tolerance);
  } else if (!o.calibrate.empty()) {
    int threads = 0;
    std::vector<std::string> skipped;
    std::vector<MeasuredPoint> fit_points = load_points(o.calibrate, &threads, skipped);
    // The fit is the ring's; hybrid points (--ulysses > 1) are only compared.
    std::vector<MeasuredPoint> all_points = fit_points;
    std::erase_if(fit_points, [](const MeasuredPoint& p) { return p.ulysses > 1; });
    const std::vector<MeasuredPoint> check_points =
        o.validate.empty() ? all_points : load_points(o.validate, &threads, skipped);
    if (fit_points.empty()) throw usage_error("--calibrate " + o.calibrate + ": no usable points");
    ClusterSpec start;
    start.name = "this machine (calibrated)";
    start.forward_gflops = start.backward_gflops = 100.0;
    start.intra = {o.machine_bandwidth, o.machine_latency};
    start.inter = {o.machine_inter_bandwidth, o.machine_inter_latency};
    const Calibration cal =
        calibrate(fit_points, start, !given(vm, "machine-link-latency") && !given(vm, "machine-link-bandwidth"));
    machine = cal.machine;
    machine->ranks_per_node = kOneNode;  // this machine: every rank on one node, its own link between them
    machine->inter = machine->intra;
    const std::vector<Comparison> rows = compare(check_points, cal.machine);
    within = print_calibration(cal, threads, rows, skipped, o.tolerance);
    out["calibration"] = calibration_json(cal, rows, o.tolerance);
    out["calibration"]["machine"] = cluster_json(*machine);
    if (!o.save_calibration.empty())
      write_text_file(o.save_calibration, "--save-calibration", cluster_json(*machine).dump() + "\n");
  }

  // Projection: on the described cluster, or on the calibrated machine when only it is known.
  bool cluster_given = !o.cluster.empty();
  for (const char* flag : {"ranks-per-node", "intra-bandwidth", "intra-latency", "inter-bandwidth", "inter-links",
                           "inter-latency", "tflops", "gflops", "backward-tflops", "backward-gflops", "step-overhead",
                           "message-overhead", "host-copy-bandwidth", "memory-gib"})
    cluster_given = cluster_given || given(vm, flag);
  bool workload_given = false;
  for (const char* flag : {"ranks", "seq-len", "batch", "heads", "kv-heads", "head-dim", "dtype", "causal", "window",
                           "doc-lens", "block-mask", "bigbird", "layouts", "schedules", "forward-only", "ulysses"})
    workload_given = workload_given || given(vm, flag);
  if ((!machine && !o.same_run) || cluster_given || workload_given) {
    const ClusterSpec cluster = machine && !cluster_given ? *machine : load_cluster(o, f, vm);
    Workload w;
    w.batch = o.batch, w.seq_len = o.seq_len, w.heads = o.heads;
    w.kv_heads = o.kv_heads ? o.kv_heads : o.heads, w.head_dim = o.head_dim;
    w.dtype_bytes = dtype_bytes_of(o.dtype, "--dtype");
    w.backward = !o.forward_only;
    if (w.batch < 1 || w.seq_len < 1 || w.heads < 1 || w.kv_heads < 1 || w.head_dim < 1 || w.heads % w.kv_heads)
      throw usage_error("batch, seq-len, heads, head-dim must be positive and --kv-heads must divide --heads");
    const Mask mask = mask_from_options(o.mask, w.seq_len, o.seed);
    dump_block_mask(o.mask, mask);
    std::vector<int> ranks;
    for (int64_t P : parse_int_list(o.ranks, "--ranks")) {
      if (P < 1 || P > w.seq_len) throw usage_error("--ranks: " + std::to_string(P) + " must be between 1 and --seq-len");
      ranks.push_back(static_cast<int>(P));
    }
    std::vector<LayoutKind> layouts;
    for (const std::string& name : split_list(o.layouts)) layouts.push_back(parse_layout(name));
    std::vector<Schedule> schedules;
    for (const std::string& name : split_list(o.schedules)) schedules.push_back(parse_schedule(name));
    if (layouts.empty() || schedules.empty()) throw usage_error("--layouts and --schedules need at least one entry");
    out["cluster"] = cluster_json(cluster);
    out["projection"] = print_projection(cluster, w, mask, ranks, layouts, schedules);
    if (!o.ulysses.empty()) {
      std::vector<int> degrees;
      if (o.ulysses != "auto")
        for (int64_t U : parse_int_list(o.ulysses, "--ulysses")) {
          if (U < 1) throw usage_error("--ulysses " + o.ulysses + ": degrees must be at least 1");
          degrees.push_back(static_cast<int>(U));
        }
      // The hybrid's ring: the one layout given, else zigzag for causal masks (balanced), else contiguous.
      w.layout = layouts.size() == 1 ? layouts[0] : (o.mask.causal ? LayoutKind::zigzag : LayoutKind::contiguous);
      w.schedule = schedules[0];
      out["hybrid"] = print_hybrid_projection(cluster, w, mask, ranks, degrees);
    }
  }

  if (!o.json.empty()) write_text_file(o.json, "--json", out.dump() + "\n");
  if (o.check && !within)
    throw CheckFailure("calibrated predictions miss a measured time by more than --tolerance " + std::to_string(o.tolerance));
  return kExitOk;
}

}  // namespace

int run_plan(LaunchContext& ctx) {
  PlanOptions opts;
  ClusterFlags flags;
  const po::options_description desc = describe(opts, flags);
  int code = kExitOk;
  const po::variables_map vm = parse_and_agree(ctx.world, desc, ctx.args, "plan");
  const bool help = vm.count("help") > 0;
  // Arithmetic only: rank 0 plans, and every rank ends with its exit code.
  agreed_phase(ctx.world, [&] {
    if (help || ctx.world.rank() != 0) return;
    code = plan(opts, flags, vm);
  });
  if (help && ctx.world.rank() == 0)
    std::cout << "usage: ringattn plan [options]\n\n"
                 "Predicts ring attention on a cluster for every layout and schedule, and recommends one.\n"
                 "A --cluster file holds the flags' values under the keys name, ranks_per_node,\n"
                 "intra_bandwidth_gbps, intra_latency_us, inter_bandwidth_gbps, inter_links, inter_latency_us,\n"
                 "forward_tflops (or forward_gflops), backward_tflops (or backward_gflops), step_overhead_us,\n"
                 "message_overhead_us, host_copy_gbps, memory_gib. The model is described in\n"
                 "launch/plan/cluster_model.hpp; --calibrate fits it to this machine's ringattn bench --json files.\n\n"
              << desc << "\n";
  return code;
}

}  // namespace ringattn
