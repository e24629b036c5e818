#include "launch/bench/kernel_bench.hpp"

#include <cblas.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "util/stopwatch.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/sampled_check.hpp"
#include "launch/cli/job_control.hpp"
#include "launch/cli/job_util.hpp"
#include "launch/cli/json.hpp"
#include "launch/cli/mask_options.hpp"
#include "launch/cli/options_util.hpp"
#include "launch/cli/statistics.hpp"
#include "runtime/errors.hpp"
#include "kernels/mask/mask.hpp"
#include "runtime/random_inputs.hpp"

extern "C" char* openblas_get_corename(void);
extern "C" void openblas_set_num_threads(int);

namespace po = boost::program_options;

namespace ringattn {
namespace {

// Best of reps - 1 square sgemms of size n on `threads` threads (after one warm-up), GFLOP/s.
double sgemm_gflops(int threads, int n, int reps = 4) {
  openblas_set_num_threads(threads);
  std::vector<float> a(size_t(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = float(i % 7) * 0.1f;
  double best = 0.0;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = now_seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double t = now_seconds() - t0;
    if (rep) best = std::max(best, 2.0 * n * double(n) * n / t / 1e9);  // the first warms up
  }
  return best;
}

// PyTorch's CPU SDPA as a child process (launch/bench/bench_torch_cpu.py) that measures one row
// when asked, so that its rows and ours interleave: a machine whose speed drifts (other jobs,
// clocks) then slows both alike, and the per-repeat ratio stays honest. The child gets the same
// threads and no OPENBLAS_CORETYPE.
class TorchServer {
 public:
  TorchServer(int64_t L, int threads, int iters) {
    char exe[4096] = {0};
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    std::string script = std::getenv("RINGATTN_TORCH_BENCH") ? std::getenv("RINGATTN_TORCH_BENCH") : "";
    if (script.empty() && n > 0) {
      std::string dir(exe, static_cast<size_t>(n));
      dir = dir.substr(0, dir.rfind('/'));
      script = dir + "/../launch/bench/bench_torch_cpu.py";
    }
    const char* env_python = std::getenv("RINGATTN_PYTHON");  // a Python with torch, e.g. a venv's
    const std::string python = env_python && *env_python ? env_python : "python3";
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0) return;
    if (pipe(from_child) != 0) {
      close(to_child[0]), close(to_child[1]);
      return;
    }
    signal(SIGPIPE, SIG_IGN);  // a child that died answers EOF, not a signal
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0), dup2(from_child[1], 1);
      close(to_child[1]), close(from_child[0]);
      if (FILE* null = std::fopen("/dev/null", "w")) dup2(fileno(null), 2);
      unsetenv("OPENBLAS_CORETYPE");
      const std::string l = std::to_string(L), t = std::to_string(threads), it = std::to_string(iters);
      execlp(python.c_str(), python.c_str(), script.c_str(), "--seq-len", l.c_str(), "--threads", t.c_str(), "--iters",
             it.c_str(), static_cast<char*>(nullptr));
      _exit(3);
    }
    close(to_child[0]), close(from_child[1]);
    if (pid_ < 0) {
      close(to_child[1]), close(from_child[0]);
      return;
    }
    to_ = to_child[1];
    from_ = fdopen(from_child[0], "r");
    std::string header;
    if (!read_line(header) || field(header, "torch").empty()) {
      stop();
      return;
    }
    version_ = field(header, "torch") + ", CPU kernel " + field(header, "capability") + ", " +
               field(header, "threads") + " threads";
  }
  ~TorchServer() { stop(); }
  bool available() const { return from_ != nullptr; }
  const std::string& version() const { return version_; }

  // Median seconds of forward and backward for one row; false when the child failed.
  bool measure(int64_t D, DType dtype, bool causal, int64_t H, int64_t Hkv, double& forward, double& backward) {
    if (!available()) return false;
    const std::string req = std::to_string(D) + " " + dtype_name(dtype) + " " + (causal ? "1" : "0") + " " +
                            std::to_string(H) + " " + std::to_string(Hkv) + "\n";
    std::string answer;
    if (write(to_, req.data(), req.size()) != static_cast<ssize_t>(req.size()) || !read_line(answer)) {
      stop();
      return false;
    }
    forward = std::strtod(field(answer, "forward").c_str(), nullptr);
    backward = std::strtod(field(answer, "backward").c_str(), nullptr);
    return forward > 0 && backward > 0;
  }

 private:
  bool read_line(std::string& out) {
    char line[1024];
    if (!from_ || !fgets(line, sizeof line, from_)) return false;
    out = line;
    return true;
  }
  // The value of "key" in a one-line JSON object (strings without their quotes).
  static std::string field(const std::string& s, const std::string& key) {
    size_t at = s.find("\"" + key + "\": ");
    if (at == std::string::npos) return "";
    at += key.size() + 4;
    if (s[at] == '"') return s.substr(at + 1, s.find('"', at + 1) - at - 1);
    return s.substr(at, s.find_first_of(",}", at) - at);
  }
  void stop() {
    if (to_ >= 0) close(to_), to_ = -1;
    if (from_) fclose(from_), from_ = nullptr;
    if (pid_ > 0) waitpid(pid_, nullptr, 0), pid_ = -1;
  }
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
  std::string version_;
};

struct Row {
  int64_t head_dim;
  std::string mask, dtype, pass, path;
  double seconds, gflops, of_sgemm, of_peak;
  double torch_gflops, vs_torch;  // 0 when torch did not run
  int wrong;
};

}  // namespace

int run_kernel_bench(LaunchContext& ctx, const std::vector<std::string>& args) {
  int64_t L = 8192, H = 8, Hkv = 0;
  std::string head_dims = "64,128", dtypes = "fp32", json_path;
  int threads = 0, iters = 3, repeats = 3, sgemm_n = 2048;
  bool no_torch = false;
  po::options_description desc("ringattn bench --kernel options");
  desc.add_options()("help,h", "show this help")
      ("kernel", "benchmark the CPU kernels on one process")
      ("seq-len", po::value(&L)->default_value(8192)->value_name("L"), "sequence length (queries and keys)")
      ("heads", po::value(&H)->default_value(8)->value_name("H"), "query heads")
      ("kv-heads", po::value(&Hkv)->default_value(0)->value_name("HKV"), "key/value heads (GQA; 0 = --heads)")
      ("head-dims", po::value(&head_dims)->default_value("64,128")->value_name("D1,D2,..."), "head dims to run")
      ("dtypes", po::value(&dtypes)->default_value("fp32")->value_name("fp32,bf16"), "fp32 and/or bf16, comma-separated")
      ("threads", po::value(&threads)->default_value(0)->value_name("N"), "threads (0 = the node's cores shared among its ranks)")
      ("iters", po::value(&iters)->default_value(3)->value_name("N"), "timed runs per repeat (median) after one warm-up")
      ("repeats", po::value(&repeats)->default_value(3)->value_name("N"),
       "repeats of each row, ours and PyTorch's interleaved; the table gives medians over repeats")
      ("sgemm-size", po::value(&sgemm_n)->default_value(2048)->value_name("N"), "size of the square sgemm yardstick")
      ("no-torch", po::bool_switch(&no_torch), "skip the PyTorch comparison")
      ("json", po::value(&json_path)->value_name("FILE"), "write the table as JSON");
  std::vector<int64_t> dims;
  std::vector<DType> types;
  const po::variables_map vm = parse_and_agree(ctx.world, desc, args, "bench --kernel");
  const bool help = vm.count("help") > 0;
  agreed_phase(ctx.world, [&] {
    dims = parse_int_list(head_dims, "--head-dims");
    for (int64_t d : dims)
      if (!kernels::cpu_supports_head_dim(d)) throw usage_error("--head-dims: " + std::to_string(d) + " is not supported");
    types = parse_dtype_list(dtypes, "--dtypes");
    if (L < 1 || H < 1 || iters < 1 || repeats < 1 || sgemm_n < 1 || threads < 0)
      throw usage_error("--seq-len, --heads, --iters, --repeats, --sgemm-size must be positive");
    if (Hkv < 0 || (Hkv > 0 && H % Hkv != 0)) throw usage_error("--kv-heads must divide --heads (or be 0)");
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
  if (!Hkv) Hkv = H;

  const double peak = kernels::measure_fma_peak_gflops(threads);
  const double peak16 = kernels::measure_bf16_dot_peak_gflops(threads);
  const double tile_peak = kernels::measure_tile_peak_gflops(threads);
  const double sgemm_start = sgemm_gflops(threads, sgemm_n);
  std::unique_ptr<TorchServer> torch;
  if (!no_torch) torch = std::make_unique<TorchServer>(L, threads, iters);
  const std::string torch_note =
      no_torch ? "PyTorch comparison skipped (--no-torch)"
      : torch->available() ? "PyTorch " + torch->version() + ", CPU scaled_dot_product_attention, same shapes and dtypes, interleaved row by row"
                           : "PyTorch not available (install torch, or point RINGATTN_PYTHON at a Python that has it)";
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");

  std::printf("# ringattn kernel benchmark: CPU attention vs sgemm and peak on the same cores, same run\n");
  std::printf("# cpu: %s, isa %s, %d thread%s\n", cpu_model().c_str(), kernels::cpu_isa(), threads, threads > 1 ? "s" : "");
  char dot_note[64] = "n/a (bf16 inputs run on the FMA)";  // the kernels' bf16 path does not use the dot product
  if (peak16 > 0) std::snprintf(dot_note, sizeof dot_note, "%.1f GFLOP/s", peak16);
  if (tile_peak > 0) std::snprintf(dot_note, sizeof dot_note, "n/a (bf16 inputs run on the AMX tiles)");
  std::printf("# fma peak: %.1f GFLOP/s   bf16 dot peak: %s   sgemm (OpenBLAS %s, n = %d): %.1f GFLOP/s%s%s\n", peak,
              dot_note, openblas_get_corename(), sgemm_n, sgemm_start, coretype ? "  [OPENBLAS_CORETYPE=" : "",
              coretype ? (std::string(coretype) + "]").c_str() : "");
  if (tile_peak > 0)
    std::printf("# amx tile peak: %.1f GFLOP/s (TDPBF16PS from registers, 4 accumulators; %.1fx the fma peak)\n",
                tile_peak, tile_peak / peak);
  if (std::string(openblas_get_corename()) == "Prescott")  // its fallback for CPUs it does not know
    std::printf("# [OpenBLAS does not know this CPU and runs its SSE3 kernels: for a fair sgemm set\n"
                "#  OPENBLAS_CORETYPE=SkylakeX (AVX-512) or Haswell (AVX2); PyTorch is started without it]\n");
  std::printf("# shapes: batch 1, seq_len %lld, heads %lld (kv %lld); FLOPs: forward 4*B*H*D*visible pairs, backward 2.5x\n",
              (long long)L, (long long)H, (long long)Hkv);
  std::printf("# backward time includes delta = rowsum(dO * O); %%sgemm: against an sgemm run beside each repeat;\n"
              "# %%peak: %s; medians of %d repeat%s\n",
              tile_peak > 0 ? "fp32 rows against the FMA peak, bf16 rows against the AMX tile peak"
              : peak16 > 0  ? "fp32 rows against the FMA peak, bf16 rows against the bf16 dot peak"
                            : "against the FMA peak",
              repeats, repeats > 1 ? "s" : "");
  std::printf("# torch: %s\n", torch_note.c_str());
  std::printf("#%5s %-7s %-5s %-9s %-10s %9s %9s %7s %7s %10s %8s %7s\n", "D", "mask", "dtype", "pass", "path", "time_s",
              "GFLOP/s", "%sgemm", "%peak", "torch_GF/s", "vs_torch", "#wrong");

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
        const kernels::AttentionDims kd{1, H, Hkv, D, 1.0f / std::sqrt(float(D))};
        const size_t n = size_t(L * H * D), nkv = size_t(L * Hkv * D);
        std::vector<float> q(n), k(nkv), v(nkv), dout(n), o(n), lse(size_t(H * L)), delta(lse.size()), dq(n), dk(nkv),
            dv(nkv);
        random_rows(q.data(), 1, RandomTensor::q, 1, L, H * D, pos.data(), L);
        random_rows(k.data(), 1, RandomTensor::k, 1, L, Hkv * D, pos.data(), L);
        random_rows(v.data(), 1, RandomTensor::v, 1, L, Hkv * D, pos.data(), L);
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
        const std::string path = kernels::cpu_path(dtype);
        const double row_peak = path == "amx" ? tile_peak : dtype == DType::bf16 && peak16 > 0 ? peak16 : peak;

        // Per repeat: ours (median of iters, after a warm-up on the first), PyTorch's, and an sgemm.
        std::vector<double> ours_f, ours_b, torch_f, torch_b, vs_f, vs_b, sg_f, sg_b;
        for (int rep = 0; rep < repeats; ++rep) {
          std::vector<double> tf, tb;
          for (int it = rep ? 1 : 0; it <= iters; ++it) {
            std::fill(o.begin(), o.end(), 0.0f);
            std::fill(lse.begin(), lse.end(), -INFINITY);
            double t0 = now_seconds();
            kernels::attention_forward(kd, qr, kvr, mv, kernels::AttentionState{o.data(), lse.data()}, opt);
            if (it) tf.push_back(now_seconds() - t0);
            std::fill(dq.begin(), dq.end(), 0.0f), std::fill(dk.begin(), dk.end(), 0.0f), std::fill(dv.begin(), dv.end(), 0.0f);
            t0 = now_seconds();  // the backward pass includes delta, as PyTorch's and the ring's do
            kernels::attention_delta(kd, L, o.data(), dp, dtype, delta.data());
            kernels::attention_backward(kd, qr, kvr, dp, lse.data(), delta.data(), dq.data(), dk.data(), dv.data(), mv, opt);
            if (it) tb.push_back(now_seconds() - t0);
          }
          const double gf = flops / median_of(tf) / 1e9, gb = 2.5 * flops / median_of(tb) / 1e9;
          ours_f.push_back(gf), ours_b.push_back(gb);
          const double sg = sgemm_gflops(threads, sgemm_n, 2);
          sg_f.push_back(gf / sg), sg_b.push_back(gb / sg);
          double sf = 0.0, sb = 0.0;
          if (torch && torch->measure(D, dtype, causal, H, Hkv, sf, sb)) {
            torch_f.push_back(flops / sf / 1e9), torch_b.push_back(2.5 * flops / sb / 1e9);
            vs_f.push_back(gf * sf / flops * 1e9), vs_b.push_back(gb * sb / (2.5 * flops) * 1e9);
          }
        }

        // The benchmark is also a test: 8 sampled query rows (O, LSE, dQ) and key rows (dK, dV), judged
        // by kernels/error_rule.hpp against fp64 and the same-precision reference.
        const std::vector<int64_t> sample = {0, 1, L / 3, L / 2, L - 2, L - 1, 7 % L, (L * 5) / 7};
        const kernels::SampledErrors errors = kernels::check_sampled_rows(
            kernels::WholeProblem{kd, L, mv, q.data(), k.data(), v.data(), dout.data(), kernels::cpu_same_precision(dtype)},
            kernels::KernelResults{o.data(), lse.data(), dq.data(), dk.data(), dv.data()}, sample);
        const int fwd_wrong = errors.wrong_forward(), bwd_wrong = errors.wrong_backward();
        total_wrong += fwd_wrong + bwd_wrong;

        const std::string mname = causal ? "causal" : "none";
        for (int pass = 0; pass < 2; ++pass) {
          const double g = median_of(pass ? ours_b : ours_f);
          const double t = (pass ? 2.5 : 1.0) * flops / g / 1e9;
          const std::string pname = pass ? "backward" : "forward";
          const std::vector<double>& tg = pass ? torch_b : torch_f;
          const std::vector<double>& vt = pass ? vs_b : vs_f;
          Row r{D, mname, dtype_name(dtype), pname, path, t, g, median_of(pass ? sg_b : sg_f), g / row_peak,
                tg.empty() ? 0.0 : median_of(tg), vt.empty() ? 0.0 : median_of(vt), pass ? bwd_wrong : fwd_wrong};
          rows.push_back(r);
          char tcol[32] = "n/a", rcol[32] = "n/a";
          if (r.torch_gflops > 0) {
            std::snprintf(tcol, sizeof tcol, "%.1f", r.torch_gflops);
            std::snprintf(rcol, sizeof rcol, "%.2fx", r.vs_torch);
          }
          std::printf(" %5lld %-7s %-5s %-9s %-10s %9.4f %9.1f %6.1f%% %6.1f%% %10s %8s %7d\n", (long long)D,
                      mname.c_str(), dtype_name(dtype), pname.c_str(), path.c_str(), t, g, 100.0 * r.of_sgemm,
                      100.0 * r.of_peak, tcol, rcol, r.wrong);
          std::fflush(stdout);
        }
      }
  std::vector<double> all_vs;
  for (const Row& r : rows)
    if (r.vs_torch > 0) all_vs.push_back(r.vs_torch);
  if (!all_vs.empty())
    std::printf("# vs torch: median row %.2fx, lowest %.2fx\n", median_of(all_vs), *std::min_element(all_vs.begin(), all_vs.end()));
  std::printf("# %s: %d wrong values against the fp64 reference\n", total_wrong ? "FAILED" : "OK", total_wrong);

  if (!json_path.empty()) {
    Json j = Json::object();
    Json cfg = Json::object();
    cfg["seq_len"] = L;
    cfg["heads"] = H;
    cfg["kv_heads"] = Hkv;
    cfg["threads"] = threads;
    cfg["repeats"] = repeats;
    cfg["isa"] = kernels::cpu_isa();
    cfg["cpu"] = cpu_model();
    cfg["fma_peak_gflops"] = peak;
    cfg["bf16_dot_peak_gflops"] = peak16;
    cfg["amx_tile_peak_gflops"] = tile_peak;
    cfg["sgemm_gflops"] = sgemm_start;
    cfg["openblas_core"] = openblas_get_corename();
    if (torch && torch->available()) cfg["torch"] = torch->version();
    j["config"] = cfg;
    Json pts = Json::array();
    for (const Row& r : rows) {
      Json p = Json::object();
      p["head_dim"] = r.head_dim;
      p["mask"] = r.mask;
      p["dtype"] = r.dtype;
      p["pass"] = r.pass;
      p["path"] = r.path;
      p["seconds"] = r.seconds;
      p["gflops"] = r.gflops;
      p["fraction_of_sgemm"] = r.of_sgemm;
      p["fraction_of_peak"] = r.of_peak;
      if (r.torch_gflops > 0) p["torch_gflops"] = r.torch_gflops, p["vs_torch"] = r.vs_torch;
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
