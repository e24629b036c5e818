// ringattn_gpu_bench: forward and backward throughput of the CUDA attention kernels on one GPU,
// the numbers launch/gpu-check.sh sets beside PyTorch's FlashAttention (bench_torch_sdpa.py).
// Needs no MPI: the kernels are called directly, on one (B, L, H, D) problem per point.
//
// Like nccl-tests, the benchmark is also a test: inputs are seeded, sampled rows of O, LSE, dQ, dK
// and dV are judged on the host by kernels/error_rule.hpp (against fp64 and the same-precision
// reference), each row of the table carries a #wrong count (tensors over their bound),
// and a wrong result makes the run exit 3. Times are CUDA-event medians after warm-up; FLOPs are
// counted as docs/reference.md says (forward 4 B H D x visible pairs, backward 2.5 x that), never masked work.
//
//   ringattn_gpu_bench [--json FILE] [--dtype bf16|fp16] [--heads 16] [--batch 1]
//                      [--head-dims 64,128] [--lengths 4096,8192,16384,32768] [--causal both|yes|no]
//                      (head dims 64, 96, 128 and 256 run on tensor cores)
//                      [--warmup 2] [--iters 5] [--kernel auto|tensor_core|simple] [--no-backward]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/sampled_check.hpp"
#include "util/dtype.hpp"
#include "launch/cli/statistics.hpp"

namespace {

using namespace ringattn;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Options {
  std::string json;
  DType type = DType::bf16;
  int64_t heads = 16, batch = 1;
  std::vector<int64_t> head_dims{64, 128};
  std::vector<int64_t> lengths{4096, 8192, 16384, 32768};
  std::vector<bool> causal{false, true};
  int warmup = 2, iters = 5;
  kernels::CudaKernel kernel = kernels::CudaKernel::automatic;
  bool backward = true;
};

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--json")
      o.json = value();
    else if (a == "--dtype") {
      const std::string v = value();
      if (v == "bf16")
        o.type = DType::bf16;
      else if (v == "fp16")
        o.type = DType::f16;
      else
        throw std::invalid_argument("--dtype " + v + ": expected bf16 or fp16");
    } else if (a == "--heads")
      o.heads = std::stoll(value());
    else if (a == "--batch")
      o.batch = std::stoll(value());
    else if (a == "--head-dims")
      o.head_dims = parse_list(value());
    else if (a == "--lengths")
      o.lengths = parse_list(value());
    else if (a == "--causal") {
      const std::string v = value();
      o.causal = v == "yes"  ? std::vector<bool>{true}
                 : v == "no" ? std::vector<bool>{false}
                             : std::vector<bool>{false, true};
    } else if (a == "--warmup")
      o.warmup = std::stoi(value());
    else if (a == "--iters")
      o.iters = std::max(1, std::stoi(value()));
    else if (a == "--kernel") {
      const std::string v = value();
      o.kernel = v == "simple"        ? kernels::CudaKernel::simple
                 : v == "tensor_core" ? kernels::CudaKernel::tensor_core
                                      : kernels::CudaKernel::automatic;
    } else if (a == "--no-backward")
      o.backward = false;
    else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: ringattn_gpu_bench [--json FILE] [--dtype bf16|fp16] [--heads N] [--batch N]\n"
          "  [--head-dims 64,128] [--lengths 4096,8192,16384,32768] [--causal both|yes|no]\n"
          "  [--warmup 2] [--iters 5] [--kernel auto|tensor_core|simple] [--no-backward]\n");
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown option " + a);
    }
  }
  return o;
}

// A value rounded to the 16-bit element type, as bits, and back.
uint16_t element_bits(float x, DType t) { return t == DType::bf16 ? float_to_bf16(x) : float_to_fp16(x); }

float bits_value(uint16_t b, DType t) { return t == DType::bf16 ? bf16_to_float(b) : fp16_to_float(b); }

// Deterministic values in [-sqrt(3), sqrt(3)) (unit variance), rounded to the element type.
std::vector<uint16_t> random_tensor(size_t n, uint64_t seed, DType t) {
  std::vector<uint16_t> out(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float u = float(s >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = element_bits((2.0f * u - 1.0f) * 1.7320508f, t);
  }
  return out;
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct Point {
  int64_t head_dim, seq_len;
  bool causal;
  double forward_ms = 0, backward_ms = 0, forward_tflops = 0, backward_tflops = 0, max_abs_err = 0;
  int wrong = 0;
  std::string kernel;
};

// Times fn() with CUDA events: warm-up runs, then the median of `iters` runs, in milliseconds.
template <class Prepare, class Fn>
double time_ms(const Options& o, cudaStream_t stream, Prepare prepare, Fn fn) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> times;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    prepare();
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i >= o.warmup) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median_of(times);
}

Point run_point(const Options& o, int64_t D, int64_t L, bool causal, cudaStream_t stream) {
  const int64_t B = o.batch, H = o.heads;
  const size_t n = size_t(B * L * H * D), nl = size_t(B * H * L);
  const kernels::AttentionDims dims{B, H, H, D, 1.0f / std::sqrt(float(D))};
  const std::vector<uint16_t> q = random_tensor(n, 1 + D, o.type), k = random_tensor(n, 2 + D, o.type),
                              v = random_tensor(n, 3 + D, o.type), dout = random_tensor(n, 4 + D, o.type);
  DeviceBuffer dq_in(2 * n), dk_in(2 * n), dv_in(2 * n), ddo(2 * n), pos(sizeof(int64_t) * size_t(L));
  check(cudaMemcpy(dq_in.p, q.data(), 2 * n, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(dk_in.p, k.data(), 2 * n, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(dv_in.p, v.data(), 2 * n, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(ddo.p, dout.data(), 2 * n, cudaMemcpyHostToDevice), "upload");
  std::vector<int64_t> positions(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) positions[size_t(i)] = i;
  check(cudaMemcpy(pos.p, positions.data(), sizeof(int64_t) * size_t(L), cudaMemcpyHostToDevice), "upload");
  // A pageable cudaMemcpy may return before its DMA lands, and the kernels run on a non-blocking
  // stream that does not wait for the legacy stream: the uploads are complete before first use.
  check(cudaDeviceSynchronize(), "upload");
  DeviceBuffer o_buf(4 * n), lse(4 * nl), delta(4 * nl), dq(4 * n), dk(4 * n), dv(4 * n);

  MaskView mask;
  mask.causal = causal;
  const kernels::CudaQueryRows qr{dq_in.p, o.type, L, pos.as<int64_t>()};
  const kernels::CudaKeyValueRows kv{dk_in.p, dv_in.p, o.type, L, pos.as<int64_t>()};
  // The backward kernel's workspace, allocated once as a prepared ring does (each call zeroes it).
  const size_t workspace_bytes = kernels::cuda_attention_backward_workspace_bytes(dims, L);
  DeviceBuffer workspace(workspace_bytes);
  kernels::CudaOptions opt;
  opt.stream = stream;
  opt.kernel = o.kernel;
  opt.workspace = workspace.p;
  opt.workspace_bytes = workspace_bytes;
  const std::vector<float> neg_inf(nl, -std::numeric_limits<float>::infinity());

  Point p;
  p.head_dim = D, p.seq_len = L, p.causal = causal;
  p.kernel = kernels::cuda_kernel_name(dims, o.type, dq_in.p, dk_in.p, dv_in.p, opt);
  const double pairs = causal ? double(L) * double(L + 1) / 2.0 : double(L) * double(L);
  const double flops_fwd = 4.0 * double(B * H * D) * pairs;
  auto reset_state = [&] {
    check(cudaMemsetAsync(o_buf.p, 0, 4 * n, stream), "cudaMemsetAsync");
    check(cudaMemcpyAsync(lse.p, neg_inf.data(), 4 * nl, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  };
  p.forward_ms = time_ms(o, stream, reset_state, [&] {
    kernels::cuda_attention_forward(dims, qr, kv, mask, kernels::AttentionState{o_buf.as<float>(), lse.as<float>()},
                                    opt);
  });
  p.forward_tflops = flops_fwd / (p.forward_ms * 1e-3) / 1e12;

  // The forward results, for the check at the end.
  reset_state();
  kernels::cuda_attention_forward(dims, qr, kv, mask, kernels::AttentionState{o_buf.as<float>(), lse.as<float>()}, opt);
  check(cudaStreamSynchronize(stream), "forward");
  std::vector<float> o_host(n), lse_host(nl);
  check(cudaMemcpy(o_host.data(), o_buf.p, 4 * n, cudaMemcpyDeviceToHost), "download");
  check(cudaMemcpy(lse_host.data(), lse.p, 4 * nl, cudaMemcpyDeviceToHost), "download");

  if (o.backward) {
    kernels::cuda_attention_delta(dims, L, o_buf.as<float>(), ddo.p, o.type, delta.as<float>(), stream);
    auto reset_grads = [&] {
      for (const DeviceBuffer* b : {&dq, &dk, &dv}) check(cudaMemsetAsync(b->p, 0, 4 * n, stream), "cudaMemsetAsync");
    };
    p.backward_ms = time_ms(o, stream, reset_grads, [&] {
      kernels::cuda_attention_delta(dims, L, o_buf.as<float>(), ddo.p, o.type, delta.as<float>(), stream);
      kernels::cuda_attention_backward(dims, qr, kv, ddo.p, lse.as<float>(), delta.as<float>(), dq.as<float>(),
                                       dk.as<float>(), dv.as<float>(), mask, opt);
    });
    p.backward_tflops = 2.5 * flops_fwd / (p.backward_ms * 1e-3) / 1e12;
  }

  // Sampled rows by kernels/error_rule.hpp: O, LSE, dQ of 6 queries and dK, dV of 6 keys against
  // fp64 and the same-precision reference (the tensor-core kernels round P and dS to the input
  // type: modelled as bf16, the coarser of bf16 and fp16).
  {
    std::vector<float> qf(n), kf(n), vf(n), df(n), dq_host, dk_host, dv_host;
    for (size_t i = 0; i < n; ++i)
      qf[i] = bits_value(q[i], o.type), kf[i] = bits_value(k[i], o.type), vf[i] = bits_value(v[i], o.type),
      df[i] = bits_value(dout[i], o.type);
    kernels::KernelResults got{o_host.data(), lse_host.data()};
    if (o.backward) {
      for (auto [buf, host] : {std::pair{&dq, &dq_host}, std::pair{&dk, &dk_host}, std::pair{&dv, &dv_host}}) {
        host->resize(n);
        check(cudaMemcpy(host->data(), buf->p, 4 * n, cudaMemcpyDeviceToHost), "download");
      }
      got.dq = dq_host.data(), got.dk = dk_host.data(), got.dv = dv_host.data();
    }
    const kernels::SamePrecision precision = std::string(p.kernel) != "tensor_core" ? kernels::SamePrecision::fp32()
                                             : o.type == DType::f16 ? kernels::SamePrecision::fp16_products()
                                                                    : kernels::SamePrecision::bf16_products();
    const kernels::SampledErrors e = kernels::check_sampled_rows(
        kernels::WholeProblem{dims, L, mask, qf.data(), kf.data(), vf.data(), o.backward ? df.data() : nullptr,
                              precision},
        got, {0, 1, L / 3, L / 2 + 7, L - 2, L - 1});
    p.wrong = e.wrong_forward() + (o.backward ? e.wrong_backward() : 0);
    p.max_abs_err = std::max(e.o.error, e.lse.error);
    if (o.backward) p.max_abs_err = std::max({p.max_abs_err, e.dq.error, e.dk.error, e.dv.error});
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::fprintf(stderr, "ringattn_gpu_bench: no CUDA device visible\n");
      return 4;
    }
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    std::printf("# ringattn_gpu_bench on %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount);
    std::printf("# %s, batch %lld, heads %lld, median of %d after %d warm-up; TFLOP/s as docs/reference.md "
                "counts them\n",
                dtype_name(o.type), (long long)o.batch, (long long)o.heads, o.iters, o.warmup);
    std::printf("# %4s %7s %6s %12s %10s %10s %10s %10s %10s %6s\n", "D", "L", "causal", "kernel", "fwd_ms", "fwd_TF/s",
                "bwd_ms", "bwd_TF/s", "max_err", "#wrong");
    std::vector<Point> points;
    int wrong = 0;
    // The JSON is rewritten after every point, so that a run stopped by a timeout keeps its results.
    auto write_json = [&] {
      if (o.json.empty()) return;
      std::ofstream f(o.json);
      f << "{\"config\": {\"device\": \"" << prop.name << "\", \"dtype\": \"" << dtype_name(o.type)
        << "\", \"batch\": " << o.batch << ", \"heads\": " << o.heads << ", \"warmup\": " << o.warmup
        << ", \"iters\": " << o.iters << "},\n \"points\": [";
      for (size_t i = 0; i < points.size(); ++i) {
        const Point& p = points[i];
        f << (i ? ",\n  " : "\n  ") << "{\"head_dim\": " << p.head_dim << ", \"seq_len\": " << p.seq_len
          << ", \"causal\": " << (p.causal ? "true" : "false") << ", \"kernel\": \"" << p.kernel
          << "\", \"forward_ms\": " << p.forward_ms << ", \"forward_tflops\": " << p.forward_tflops
          << ", \"backward_ms\": " << p.backward_ms << ", \"backward_tflops\": " << p.backward_tflops
          << ", \"max_abs_err\": " << (std::isfinite(p.max_abs_err) ? p.max_abs_err : 1e30)
          << ", \"wrong\": " << p.wrong << "}";
      }
      f << "\n ]}\n";
    };
    write_json();
    for (int64_t D : o.head_dims)
      for (int64_t L : o.lengths)
        for (bool causal : o.causal) {
          const Point p = run_point(o, D, L, causal, stream);
          wrong += p.wrong;
          std::printf("  %4lld %7lld %6s %12s %10.3f %10.1f %10.3f %10.1f %10.2e %6d\n", (long long)D, (long long)L,
                      causal ? "yes" : "no", p.kernel.c_str(), p.forward_ms, p.forward_tflops, p.backward_ms,
                      p.backward_tflops, p.max_abs_err, p.wrong);
          std::fflush(stdout);
          points.push_back(p);
          write_json();
        }
    std::printf("# %s\n", wrong ? "WRONG RESULTS" : "all sampled rows correct");
    cudaStreamDestroy(stream);
    return wrong ? 3 : 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ringattn_gpu_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringattn_gpu_bench: %s\n", e.what());
    return 4;
  }
}
