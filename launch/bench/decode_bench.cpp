#include "launch/bench/decode_bench.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/cpu/decode_cpu.hpp"
#include "launch/cli/job_control.hpp"
#include "launch/cli/job_util.hpp"
#include "launch/cli/json.hpp"
#include "launch/cli/mask_options.hpp"
#include "launch/cli/options_util.hpp"
#include "launch/cli/statistics.hpp"
#include "launch/decode/decode_inputs.hpp"
#include "runtime/errors.hpp"
#include "util/format.hpp"
#include "util/stopwatch.hpp"

namespace po = boost::program_options;

namespace ringattn {
namespace {

// One sequence's cache as the KV cache holds it (head-major: head g's rows contiguous), filled
// from the decode job's token source at positions 0 .. rows - 1.
struct BenchCache {
  std::vector<char> k, v;
  std::vector<int64_t> pos;
};

BenchCache make_cache(const TokenSource& src, int64_t rows, DType dtype) {
  const int64_t Hkv = src.kv_heads(), D = src.head_dim();
  const size_t eb = size_t(dtype_bytes(dtype)), row = size_t(D) * eb;
  BenchCache c;
  c.k.resize(size_t(Hkv * rows) * row), c.v.resize(c.k.size());
  c.pos.resize(size_t(rows));
  for (int64_t j = 0; j < rows; ++j) c.pos[size_t(j)] = j;
  constexpr int64_t kFillRows = 16384;  // bounded temporaries: (rows, Hkv, D) blocks scattered per head
  std::vector<char> kb(size_t(kFillRows * Hkv) * row), vb(kb.size());
  for (int64_t j0 = 0; j0 < rows; j0 += kFillRows) {
    const int64_t n = std::min(kFillRows, rows - j0);
    src.rows_as_dtype(TokenTensor::k, 0, c.pos.data() + j0, n, kb.data());
    src.rows_as_dtype(TokenTensor::v, 0, c.pos.data() + j0, n, vb.data());
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t g = 0; g < Hkv; ++g) {
        const size_t from = size_t(j * Hkv + g) * row, to = size_t(g * rows + j0 + j) * row;
        std::copy_n(kb.data() + from, row, c.k.data() + to);
        std::copy_n(vb.data() + from, row, c.v.data() + to);
      }
  }
  return c;
}

struct Point {
  int threads;
  std::string dtype;
  double step_s, kernel_rate, probe_rate, fraction, fraction_min, fraction_max;
  int wrong;
};

}  // namespace

int run_decode_bench(LaunchContext& ctx, const std::vector<std::string>& args) {
  int64_t rows = 262144, H = 32, Hkv = 8, D = 128, probe_mib = 512;
  std::string dtypes = "fp32,bf16", thread_list = "1,2", json_path;
  int repeats = 7;
  bool no_check = false;
  po::options_description desc("ringattn bench --decode options");
  desc.add_options()("help,h", "show this help")
      ("decode", "benchmark the CPU decode kernel on one process against the memory read bandwidth")
      ("cache-tokens", po::value(&rows)->default_value(rows)->value_name("N"), "cached tokens of the sequence (far past the caches)")
      ("heads", po::value(&H)->default_value(H)->value_name("H"), "query heads")
      ("kv-heads", po::value(&Hkv)->default_value(Hkv)->value_name("HKV"), "key/value heads (0 = --heads)")
      ("head-dim", po::value(&D)->default_value(D)->value_name("D"), "head dim")
      ("dtypes", po::value(&dtypes)->default_value(dtypes)->value_name("fp32,bf16"), "cache element types, comma-separated")
      ("threads", po::value(&thread_list)->default_value(thread_list)->value_name("T1,T2,..."), "thread counts to run")
      ("repeats", po::value(&repeats)->default_value(repeats)->value_name("N"),
       "timed decode steps per row, each followed by a read-bandwidth pass (the table gives medians)")
      ("probe-mib", po::value(&probe_mib)->default_value(probe_mib)->value_name("MIB"), "buffer the read-bandwidth probe sums")
      ("no-check", po::bool_switch(&no_check), "skip the check of the step against fp64 attention")
      ("json", po::value(&json_path)->value_name("FILE"), "write the table as JSON");
  std::vector<int64_t> threads;
  std::vector<DType> types;
  const po::variables_map vm = parse_and_agree(ctx.world, desc, args, "bench --decode");
  const bool help = vm.count("help") > 0;
  agreed_phase(ctx.world, [&] {
    threads = parse_int_list(thread_list, "--threads");
    for (int64_t t : threads)
      if (t < 1) throw usage_error("--threads: " + std::to_string(t) + " must be positive");
    types = parse_dtype_list(dtypes, "--dtypes");
    if (rows < 1 || H < 1 || repeats < 1 || probe_mib < 1)
      throw usage_error("--cache-tokens, --heads, --repeats, --probe-mib must be positive");
    if (Hkv < 0 || (Hkv > 0 && H % Hkv != 0)) throw usage_error("--kv-heads must divide --heads (or be 0)");
    if (!kernels::cpu_supports_head_dim(D)) throw usage_error("--head-dim " + std::to_string(D) + " is not supported");
  });
  if (help) {
    if (ctx.world.rank() == 0) std::cout << desc << "\n";
    return 0;
  }
  if (ctx.world.rank() != 0) {  // one process measures; the others wait
    ctx.world.barrier();
    return 0;
  }
  if (!Hkv) Hkv = H;

  const float scale = 1.0f / std::sqrt(float(D));
  const kernels::AttentionDims dims{1, H, Hkv, D, scale};
  std::printf("# ringattn decode benchmark: the CPU decode kernel's read rate against the memory read bandwidth of the\n"
              "# same threads, measured in the same run: each timed step is followed by one pass of the read probe\n");
  std::printf("# cpu: %s, isa %s\n", cpu_model().c_str(), kernels::cpu_isa());
  std::printf("# one new token against %lld cached tokens, H %lld, Hkv %lld, D %lld (K and V read once per step); probe:\n"
              "# the sum of a %lld MiB buffer; kernel/probe: median over %d repeats of each step's ratio (min..max)\n",
              (long long)rows, (long long)H, (long long)Hkv, (long long)D, (long long)probe_mib, repeats);
  std::printf("#%7s %-5s %9s %10s %12s %11s %13s %7s\n", "threads", "dtype", "cache", "step_ms", "kernel_GB/s", "probe_GB/s",
              "kernel/probe", "#wrong");

  std::vector<Point> points;
  int total_wrong = 0;
  for (DType dtype : types) {
    const TokenSource src(0, rows, H, Hkv, D, dtype);
    const BenchCache cache = make_cache(src, rows, dtype);
    const int64_t q_pos = rows - 1;  // the new token is the last cached row, as decode appends it first
    std::vector<char> q(size_t(H * D) * size_t(dtype_bytes(dtype)));
    src.rows_as_dtype(TokenTensor::q, 0, &q_pos, 1, q.data());
    const kernels::DecodeQueries queries{q.data(), dtype, 1, &q_pos};
    const kernels::CachedKeyValues kv{cache.k.data(), cache.v.data(), dtype, rows, rows, cache.pos.data()};
    const double bytes = double(kernels::decode_bytes_read(dims, kv, -1, queries));
    std::vector<float> o(static_cast<size_t>(H * D)), lse(static_cast<size_t>(H));
    for (size_t ti = 0; ti < threads.size(); ++ti) {
      const int t = int(threads[ti]);
      kernels::CpuOptions options;
      options.threads = t;
      kernels::ReadBandwidthProbe probe(t, size_t(probe_mib) << 20);
      probe.pass();  // warm-up of both
      kernels::decode_forward(dims, queries, kv, -1, kernels::AttentionState{o.data(), lse.data()}, options);
      std::vector<double> step, kernel_rate, probe_rate, fraction;
      for (int rep = 0; rep < repeats; ++rep) {
        const double t0 = now_seconds();
        kernels::decode_forward(dims, queries, kv, -1, kernels::AttentionState{o.data(), lse.data()}, options);
        step.push_back(now_seconds() - t0);
        kernel_rate.push_back(bytes / step.back());
        probe_rate.push_back(probe.pass());
        fraction.push_back(kernel_rate.back() / probe_rate.back());
      }
      int wrong = 0;
      if (!no_check && ti == 0) {  // the outputs do not depend on the thread count (DecodeCpu tests)
        DecodeCheck check;
        check_rows(src, 0, {q_pos}, o.data(), lse.data(), -1, scale, check);
        wrong = check.passed() ? 0 : 1;
        if (wrong)
          std::printf("# %s: O error %.2e (bound %.2e), LSE error %.2e (bound %.2e)\n", dtype_name(dtype), check.o.error,
                      check.o.bound(), check.lse.error, check.lse.bound());
      }
      total_wrong += wrong;
      const Point p{t, dtype_name(dtype), median_of(step), median_of(kernel_rate), median_of(probe_rate),
                    median_of(fraction), *std::min_element(fraction.begin(), fraction.end()),
                    *std::max_element(fraction.begin(), fraction.end()), wrong};
      points.push_back(p);
      char ratio[48];
      std::snprintf(ratio, sizeof ratio, "%.0f%% (%.0f..%.0f)", 100 * p.fraction, 100 * p.fraction_min, 100 * p.fraction_max);
      std::printf(" %7d %-5s %9s %10.2f %12.2f %11.2f %13s %7d\n", t, p.dtype.c_str(),
                  human_bytes(2.0 * double(cache.k.size())).c_str(), 1e3 * p.step_s, p.kernel_rate / 1e9,
                  p.probe_rate / 1e9, ratio, wrong);
      std::fflush(stdout);
    }
  }
  std::printf("# %s\n", no_check ? "check skipped (--no-check)"
                        : total_wrong ? "FAILED: a step differs from fp64 attention beyond the error rule"
                                      : "OK: each dtype's step within the error rule of fp64 attention");

  if (!json_path.empty()) {
    Json j = Json::object();
    Json cfg = Json::object();
    cfg["cache_tokens"] = rows;
    cfg["heads"] = H;
    cfg["kv_heads"] = Hkv;
    cfg["head_dim"] = D;
    cfg["repeats"] = repeats;
    cfg["probe_bytes"] = int64_t(probe_mib) << 20;
    cfg["isa"] = kernels::cpu_isa();
    cfg["cpu"] = cpu_model();
    j["config"] = cfg;
    Json pts = Json::array();
    for (const Point& p : points) {
      Json e = Json::object();
      e["threads"] = p.threads;
      e["dtype"] = p.dtype;
      e["step_s"] = p.step_s;
      e["kernel_bytes_per_s"] = p.kernel_rate;
      e["read_bandwidth_bytes_per_s"] = p.probe_rate;
      e["kernel_bandwidth_fraction"] = p.fraction;
      e["wrong"] = p.wrong;
      pts.push_back(e);
    }
    j["points"] = pts;
    write_text_file(json_path, "--json", j.dump() + "\n");
  }
  ctx.world.barrier();
  if (total_wrong) throw CheckFailure("decode benchmark: a step differs from fp64 attention");
  return 0;
}

}  // namespace ringattn
