#include "launch/bench/kernel_bench.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <vector>

#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/sampled_check.hpp"
#include "launch/job_control.hpp"
#include "launch/job_util.hpp"
#include "launch/json.hpp"
#include "launch/mask_options.hpp"
#include "launch/options_util.hpp"
#include "runtime/errors.hpp"
#include "kernels/mask/mask.hpp"
#include "runtime/random_inputs.hpp"

extern "C" char* openblas_get_corename(void);
extern "C" void openblas_set_num_threads(int);

namespace po = boost::program_options;

namespace ringattn {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Best of a few square sgemms of size n on `threads` threads, GFLOP/s.
double sgemm_gflops(int threads, int n) {
  openblas_set_num_threads(threads);
  std::vector<float> a(size_t(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = float(i % 7) * 0.1f;
  double best = 0.0;
  for (int rep = 0; rep < 4; ++rep) {
    const double t0 = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double t = now() - t0;
    if (rep) best = std::max(best, 2.0 * n * double(n) * n / t / 1e9);  // the first warms up
  }
  return best;
}

std::string torch_key(int64_t head_dim, const std::string& dtype, const std::string& mask, const std::string& pass);

// PyTorch's numbers for the same shapes, keyed "D/causal/pass"; empty when torch is missing.
std::map<std::string, double> torch_gflops(int64_t L, int64_t H, const std::vector<int64_t>& dims,
                                           const std::string& dtypes, int threads, int iters,
                                           std::string& version_note) {
  std::map<std::string, double> out;
  char exe[4096] = {0};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string script = std::getenv("RINGATTN_TORCH_BENCH") ? std::getenv("RINGATTN_TORCH_BENCH") : "";
  if (script.empty() && n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    script = dir + "/../launch/bench/bench_torch_cpu.py";
  }
  std::string d_list;
  for (int64_t d : dims) d_list += (d_list.empty() ? "" : ",") + std::to_string(d);
  const char* python = std::getenv("RINGATTN_PYTHON");  // a Python with torch, e.g. a venv's
  const std::string cmd = std::string(python && *python ? python : "python3") + " " + script + " --seq-len " + std::to_string(L) + " --heads " + std::to_string(H) +
                          " --head-dims " + d_list + " --dtypes " + dtypes + " --threads " + std::to_string(threads) +
                          " --iters " + std::to_string(iters) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[512];
  while (fgets(line, sizeof line, p)) {
    // {"head_dim": 64, "causal": false, "pass": "forward", "seconds": ..., "gflops": ...}
    std::string s(line);
    auto field = [&](const std::string& key) {
      const size_t at = s.find("\"" + key + "\": ");
      return at == std::string::npos ? std::string() : s.substr(at + key.size() + 4);
    };
    const long d = std::strtol(field("head_dim").c_str(), nullptr, 10);
    const bool causal = field("causal").rfind("true", 0) == 0;
    const std::string pass = field("pass").rfind("\"forward", 0) == 0 ? "forward" : "backward";
    const std::string dtype = field("dtype").rfind("\"bf16", 0) == 0 ? "bf16" : "fp32";
    out[torch_key(d, dtype, causal ? "causal" : "none", pass)] = std::strtod(field("gflops").c_str(), nullptr);
  }
  version_note = pclose(p) == 0 && !out.empty()
                     ? "PyTorch CPU scaled_dot_product_attention, same shapes, dtypes and threads"
                     : "PyTorch not available (install torch, or point RINGATTN_PYTHON at a Python that has it)";
  return out;
}

std::string torch_key(int64_t head_dim, const std::string& dtype, const std::string& mask, const std::string& pass) {
  return std::to_string(head_dim) + "/" + dtype + "/" + mask + "/" + pass;
}

struct Row {
  int64_t head_dim;
  std::string mask, dtype, pass;
  double seconds, gflops;
  int wrong;
};

}  // namespace

int run_kernel_bench(LaunchContext& ctx, const std::vector<std::string>& args) {
  int64_t L = 8192, H = 8;
  std::string head_dims = "64,128", dtypes = "fp32", json_path;
  int threads = 0, iters = 3;
  bool no_torch = false;
  po::options_description desc("ringattn bench --kernel options");
  desc.add_options()("help,h", "show this help")
      ("kernel", "benchmark the CPU kernels on one process")
      ("seq-len", po::value(&L)->default_value(8192)->value_name("L"), "sequence length (queries and keys)")
      ("heads", po::value(&H)->default_value(8)->value_name("H"), "heads (Hkv = H)")
      ("head-dims", po::value(&head_dims)->default_value("64,128")->value_name("D1,D2,..."), "head dims to run")
      ("dtypes", po::value(&dtypes)->default_value("fp32")->value_name("fp32,bf16"), "fp32 and/or bf16, comma-separated")
      ("threads", po::value(&threads)->default_value(0)->value_name("N"), "threads (0 = the node's cores shared among its ranks)")
      ("iters", po::value(&iters)->default_value(3)->value_name("N"), "timed repetitions (median reported) after one warm-up")
      ("no-torch", po::bool_switch(&no_torch), "skip the PyTorch comparison")
      ("json", po::value(&json_path)->value_name("FILE"), "write the table as JSON");
  std::vector<int64_t> dims;
  std::vector<DType> types;
  const po::variables_map vm = parse_and_agree(ctx.world, desc, args, "bench --kernel");
  const bool help = vm.count("help") > 0;
  agreed_phase(ctx.world, [&] {
    dims = parse_int_list(head_dims, "--head-dims");
    for (int64_t d : dims)
      if (!kernels::cpu_supports_head_dim(d)) throw UsageError("--head-dims: " + std::to_string(d) + " is not supported");
    std::stringstream ss(dtypes);
    for (std::string t; std::getline(ss, t, ',');) {
      if (t == "fp32") types.push_back(DType::f32);
      else if (t == "bf16") types.push_back(DType::bf16);
      else throw UsageError("--dtypes: '" + t + "' is not fp32 or bf16");
    }
    if (L < 1 || H < 1 || iters < 1 || threads < 0) throw UsageError("--seq-len, --heads, --iters must be positive");
  });
  if (help) {
    if (ctx.world.rank() == 0) std::cout << desc << "\n";
    return 0;
  }
  if (ctx.world.rank() != 0) {  // one process measures; the others wait
    ctx.world.barrier();
    return 0;
  }
  if (!threads) threads = ctx.default_threads();

  const double peak = kernels::measure_fma_peak_gflops(threads);
  const double sgemm = sgemm_gflops(threads, 2048);
  std::string torch_note = "PyTorch comparison skipped (--no-torch)";
  const auto torch = no_torch ? std::map<std::string, double>{} : torch_gflops(L, H, dims, dtypes, threads, iters, torch_note);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");

  std::printf("# ringattn kernel benchmark: CPU attention vs sgemm and FMA peak on the same cores, same run\n");
  std::printf("# cpu: %s, isa %s, %d thread%s\n", cpu_model().c_str(), kernels::cpu_isa(), threads, threads > 1 ? "s" : "");
  std::printf("# fma peak: %.1f GFLOP/s   sgemm (OpenBLAS %s, n = 2048): %.1f GFLOP/s%s\n", peak,
              openblas_get_corename(), sgemm, coretype ? "  [OPENBLAS_CORETYPE is set: sgemm may be slowed]" : "");
  std::printf("# shapes: batch 1, seq_len %lld, heads %lld (kv %lld); FLOPs: forward 4*B*H*D*visible pairs, backward 2.5x\n",
              (long long)L, (long long)H, (long long)H);
  std::printf("# torch: %s\n", torch_note.c_str());
  std::printf("#%5s %-7s %-5s %-9s %9s %9s %7s %7s %10s %8s %7s\n", "D", "mask", "dtype", "pass", "time_s", "GFLOP/s",
              "%sgemm", "%peak", "torch_GF/s", "vs_torch", "#wrong");

  std::vector<Row> rows;
  int total_wrong = 0;
  const std::vector<int64_t> pos = [&] {
    std::vector<int64_t> p(static_cast<size_t>(L));
    for (int64_t i = 0; i < L; ++i) p[i] = i;
    return p;
  }();
  for (int64_t D : dims)
    for (DType dtype : types)
      for (bool causal : {false, true}) {
        const kernels::AttentionDims kd{1, H, H, D, 1.0f / std::sqrt(float(D))};
        const size_t n = size_t(L * H * D);
        std::vector<float> q(n), k(n), v(n), dout(n), o(n), lse(size_t(H * L)), delta(lse.size()), dq(n), dk(n), dv(n);
        random_rows(q.data(), 1, RandomTensor::q, 1, L, H * D, pos.data(), L);
        random_rows(k.data(), 1, RandomTensor::k, 1, L, H * D, pos.data(), L);
        random_rows(v.data(), 1, RandomTensor::v, 1, L, H * D, pos.data(), L);
        random_rows(dout.data(), 1, RandomTensor::dout, 1, L, H * D, pos.data(), L);
        std::vector<bf16_bits> qb, kb, vb, db;
        const void *qp = q.data(), *kp = k.data(), *vp = v.data(), *dp = dout.data();
        if (dtype == DType::bf16) {
          auto round = [](std::vector<float>& x, std::vector<bf16_bits>& b) {
            b.resize(x.size());
            for (size_t i = 0; i < x.size(); ++i) b[i] = float_to_bf16(x[i]), x[i] = bf16_to_float(b[i]);
          };
          round(q, qb), round(k, kb), round(v, vb), round(dout, db);
          qp = qb.data(), kp = kb.data(), vp = vb.data(), dp = db.data();
        }
        Mask mask;
        mask.causal = causal;
        const MaskView mv = mask.view();
        const kernels::QueryRows qr{qp, dtype, L, pos.data()};
        const kernels::KeyValueRows kvr{kp, vp, dtype, L, pos.data()};
        kernels::CpuOptions opt;
        opt.threads = threads;
        const double flops = 4.0 * H * D * double(causal ? L * (L + 1) / 2 : L * L);

        std::vector<double> tf, tb;
        for (int it = 0; it <= iters; ++it) {
          std::fill(o.begin(), o.end(), 0.0f);
          std::fill(lse.begin(), lse.end(), -INFINITY);
          double t0 = now();
          kernels::attention_forward(kd, qr, kvr, mv, kernels::AttentionState{o.data(), lse.data()}, opt);
          if (it) tf.push_back(now() - t0);
          kernels::attention_delta(kd, L, o.data(), dp, dtype, delta.data());
          std::fill(dq.begin(), dq.end(), 0.0f), std::fill(dk.begin(), dk.end(), 0.0f), std::fill(dv.begin(), dv.end(), 0.0f);
          t0 = now();
          kernels::attention_backward(kd, qr, kvr, dp, lse.data(), delta.data(), dq.data(), dk.data(), dv.data(), mv, opt);
          if (it) tb.push_back(now() - t0);
        }

        // The benchmark is also a test: 8 sampled query rows (O, LSE, dQ) and key rows (dK, dV), judged
        // by kernels/error_rule.hpp against fp64 and the same-precision reference.
        const std::vector<int64_t> sample = {0, 1, L / 3, L / 2, L - 2, L - 1, 7 % L, (L * 5) / 7};
        const kernels::SampledErrors errors = kernels::check_sampled_rows(
            kernels::WholeProblem{kd, L, mv, q.data(), k.data(), v.data(), dout.data()},
            kernels::KernelResults{o.data(), lse.data(), dq.data(), dk.data(), dv.data()}, sample);
        const int fwd_wrong = errors.wrong_forward(), bwd_wrong = errors.wrong_backward();
        total_wrong += fwd_wrong + bwd_wrong;

        const std::string mname = causal ? "causal" : "none";
        for (int pass = 0; pass < 2; ++pass) {
          const double t = median(pass ? tb : tf);
          const double g = (pass ? 2.5 : 1.0) * flops / t / 1e9;
          const std::string pname = pass ? "backward" : "forward";
          Row r{D, mname, dtype_name(dtype), pname, t, g, pass ? bwd_wrong : fwd_wrong};
          rows.push_back(r);
          const auto it = torch.find(torch_key(D, dtype_name(dtype), mname, pname));
          char tcol[32] = "n/a", rcol[32] = "n/a";
          if (it != torch.end()) {
            std::snprintf(tcol, sizeof tcol, "%.1f", it->second);
            std::snprintf(rcol, sizeof rcol, "%.2fx", g / it->second);
          }
          std::printf(" %5lld %-7s %-5s %-9s %9.4f %9.1f %6.1f%% %6.1f%% %10s %8s %7d\n", (long long)D, mname.c_str(),
                      dtype_name(dtype), pname.c_str(), t, g, 100.0 * g / sgemm, 100.0 * g / peak, tcol, rcol, r.wrong);
          std::fflush(stdout);
        }
      }
  std::printf("# %s: %d wrong values against the fp64 reference\n", total_wrong ? "FAILED" : "OK", total_wrong);

  if (!json_path.empty()) {
    Json j = Json::object();
    Json cfg = Json::object();
    cfg["seq_len"] = L;
    cfg["heads"] = H;
    cfg["threads"] = threads;
    cfg["isa"] = kernels::cpu_isa();
    cfg["cpu"] = cpu_model();
    cfg["fma_peak_gflops"] = peak;
    cfg["sgemm_gflops"] = sgemm;
    cfg["openblas_core"] = openblas_get_corename();
    j["config"] = cfg;
    Json pts = Json::array();
    for (const Row& r : rows) {
      Json p = Json::object();
      p["head_dim"] = r.head_dim;
      p["mask"] = r.mask;
      p["dtype"] = r.dtype;
      p["pass"] = r.pass;
      p["seconds"] = r.seconds;
      p["gflops"] = r.gflops;
      p["fraction_of_sgemm"] = r.gflops / sgemm;
      p["fraction_of_peak"] = r.gflops / peak;
      const auto it = torch.find(torch_key(r.head_dim, r.dtype, r.mask, r.pass));
      if (it != torch.end()) p["torch_gflops"] = it->second;
      p["wrong"] = r.wrong;
      pts.push_back(p);
    }
    j["points"] = pts;
    write_text_file(json_path, "--json", j.dump() + "\n");
  }
  ctx.world.barrier();
  if (total_wrong) throw CheckFailure("kernel benchmark: results differ from the fp64 reference");
  return 0;
}

}  // namespace ringattn
