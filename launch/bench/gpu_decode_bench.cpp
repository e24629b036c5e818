// ringattn_gpu_decode_bench: the CUDA decode kernel (kernels/cuda/decode_cuda.hpp) on one GPU, its
// read rate against the device's copy bandwidth measured in the same run (a device-to-device copy
// of a buffer as large as the cache, bytes read plus written per second, interleaved with the
// kernel's calls: copy, kernel, copy, kernel...). Decode reads every cached row once per step, so
// the ratio says how near the kernel comes to the memory system; FlashDecoding's goal is near 1.
//
// Also a test: the cache is seeded, and two query heads' O and LSE are judged against fp64 by the
// error rule (kernels/error_rule.hpp, the plain sequential fp32 computation as the baseline); a
// result off its bound makes the run exit 3. Times are CUDA-event medians after a warm-up.
//
//   ringattn_gpu_decode_bench [--keys 1048576] [--heads 32] [--kv-heads 8] [--head-dim 128]
//                             [--dtype bf16|fp32] [--tokens 1] [--iters 20] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/decode_cuda.hpp"
#include "kernels/error_rule.hpp"
#include "launch/cli/statistics.hpp"
#include "util/dtype.hpp"

namespace {

using namespace ringattn;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Options {
  int64_t keys = 1 << 20, heads = 32, kv_heads = 8, head_dim = 128, tokens = 1;
  DType dtype = DType::bf16;
  int iters = 20;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--keys") o.keys = std::stoll(value());
    else if (a == "--heads") o.heads = std::stoll(value());
    else if (a == "--kv-heads") o.kv_heads = std::stoll(value());
    else if (a == "--head-dim") o.head_dim = std::stoll(value());
    else if (a == "--tokens") o.tokens = std::stoll(value());
    else if (a == "--iters") o.iters = std::stoi(value());
    else if (a == "--json") o.json = value();
    else if (a == "--dtype") {
      const std::string d = value();
      if (d != "bf16" && d != "fp32") throw std::invalid_argument("--dtype " + d + ": expected bf16 or fp32");
      o.dtype = d == "bf16" ? DType::bf16 : DType::f32;
    } else {
      throw std::invalid_argument("unknown option " + a);
    }
  }
  if (o.keys < o.tokens || o.heads % o.kv_heads != 0 || o.iters < 1 ||
      !kernels::cuda_decode_supports_head_dim(o.head_dim))
    throw std::invalid_argument("need --keys >= --tokens, --kv-heads dividing --heads, --iters >= 1, and a head dim "
                                "the decode kernel supports (multiples of 16 up to 256)");
  return o;
}

// A cheap seeded value in [-1, 1) (a hash of the index: the cache is gigabytes).
float seeded(uint64_t i, uint64_t seed) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
  return float(double(x >> 40) / double(1ull << 23) - 1.0);
}

// n elements of the bench's dtype on the device, seeded; `host` gets their float values.
void* seeded_device(size_t n, uint64_t seed, DType t, std::vector<float>& host) {
  host.resize(n);
  std::vector<bf16_bits> b16;
  if (t == DType::bf16) b16.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = seeded(i, seed);
    if (t == DType::bf16) b16[i] = float_to_bf16(x), host[i] = bf16_to_float(b16[i]);
    else host[i] = x;
  }
  void* p = nullptr;
  const size_t bytes = n * size_t(dtype_bytes(t));
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  check(cudaMemcpy(p, t == DType::bf16 ? static_cast<const void*>(b16.data()) : host.data(), bytes,
                   cudaMemcpyHostToDevice), "upload");
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const int64_t L = o.keys, H = o.heads, Hkv = o.kv_heads, D = o.head_dim, T = o.tokens, G = H / Hkv;
    const kernels::AttentionDims dims{1, H, Hkv, D, 1.0f / std::sqrt(float(D))};
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    // The cache is head-major (the KV cache's layout): head g's key j at (g L + j) D. The new
    // tokens are the last T positions, every key at its index.
    std::vector<float> kh, vh, qh;
    void* k = seeded_device(size_t(Hkv * L * D), 1, o.dtype, kh);
    void* v = seeded_device(size_t(Hkv * L * D), 2, o.dtype, vh);
    void* q = seeded_device(size_t(T * H * D), 3, o.dtype, qh);
    std::vector<int64_t> pos(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) pos[size_t(j)] = j;
    int64_t* dpos = nullptr;
    float *o_dev = nullptr, *lse_dev = nullptr;
    void* workspace = nullptr;
    check(cudaMalloc(&dpos, sizeof(int64_t) * size_t(L)), "cudaMalloc");
    check(cudaMemcpy(dpos, pos.data(), sizeof(int64_t) * size_t(L), cudaMemcpyHostToDevice), "upload");
    check(cudaMalloc(&o_dev, sizeof(float) * size_t(T * H * D)), "cudaMalloc");
    check(cudaMalloc(&lse_dev, sizeof(float) * size_t(H * T)), "cudaMalloc");
    const size_t ws = kernels::cuda_decode_workspace_bytes(D);
    check(cudaMalloc(&workspace, ws), "cudaMalloc");
    const size_t cache_bytes = 2 * size_t(Hkv * L * D) * size_t(dtype_bytes(o.dtype));
    void *copy_src = nullptr, *copy_dst = nullptr;  // the yardstick: a copy as large as the cache
    check(cudaMalloc(&copy_src, cache_bytes), "cudaMalloc");
    check(cudaMalloc(&copy_dst, cache_bytes), "cudaMalloc");
    check(cudaMemset(copy_src, 0, cache_bytes), "cudaMemset");

    const kernels::CudaDecodeQueries queries{q, o.dtype, T, L - T};
    const kernels::CudaCachedRows rows{k, v, o.dtype, L, dpos, 0, L};
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    auto decode = [&] {
      kernels::cuda_decode_forward(dims, queries, rows, -1, kernels::AttentionState{o_dev, lse_dev}, workspace, ws,
                                   nullptr);
    };
    auto copy = [&] { check(cudaMemcpyAsync(copy_dst, copy_src, cache_bytes, cudaMemcpyDeviceToDevice), "copy"); };
    auto timed = [&](auto&& work) {
      check(cudaEventRecord(start), "cudaEventRecord");
      work();
      check(cudaEventRecord(stop), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      return double(ms) * 1e-3;
    };
    decode(), copy();  // warm-up
    check(cudaDeviceSynchronize(), "warm-up");
    std::vector<double> kernel_s, copy_s;
    for (int i = 0; i < o.iters; ++i) copy_s.push_back(timed(copy)), kernel_s.push_back(timed(decode));
    const double t_kernel = median_of(kernel_s), t_copy = median_of(copy_s);
    const double kernel_rate = double(cache_bytes) / t_kernel, copy_rate = 2.0 * double(cache_bytes) / t_copy;

    // Two query heads of the last token against fp64 (and the plain fp32 sums, the baseline).
    std::vector<float> out(size_t(T * H * D)), lse(size_t(H * T));
    check(cudaMemcpy(out.data(), o_dev, sizeof(float) * out.size(), cudaMemcpyDeviceToHost), "download");
    check(cudaMemcpy(lse.data(), lse_dev, sizeof(float) * lse.size(), cudaMemcpyDeviceToHost), "download");
    kernels::TensorError eo, el;
    for (const int64_t h : {int64_t(0), H - 1}) {
      const int64_t t = T - 1, g = h / G;
      const float* qrow = qh.data() + (t * H + h) * D;
      std::vector<double> s64(static_cast<size_t>(L));
      std::vector<float> s32(static_cast<size_t>(L));
      double m64 = -INFINITY;
      float m32 = -INFINITY;
      for (int64_t j = 0; j < L; ++j) {
        const float* krow = kh.data() + (g * L + j) * D;
        double a = 0.0;
        float b = 0.0f;
        for (int64_t d = 0; d < D; ++d) a += double(qrow[d]) * krow[d], b += qrow[d] * krow[d];
        s64[size_t(j)] = a * dims.scale, s32[size_t(j)] = b * dims.scale;
        m64 = std::max(m64, s64[size_t(j)]), m32 = std::max(m32, s32[size_t(j)]);
      }
      // fp32 sums in panels of 256 keys, each from zero, as the plain computation of the rule forms them.
      std::vector<double> o64(static_cast<size_t>(D), 0.0);
      std::vector<float> o32(static_cast<size_t>(D), 0.0f), panel(static_cast<size_t>(D));
      double l64 = 0.0;
      float l32 = 0.0f;
      for (int64_t j0 = 0; j0 < L; j0 += 256) {
        float pl = 0.0f;
        std::fill(panel.begin(), panel.end(), 0.0f);
        for (int64_t j = j0; j < std::min(L, j0 + 256); ++j) {
          const double p = std::exp(s64[size_t(j)] - m64);
          const float p32 = std::exp(s32[size_t(j)] - m32);
          l64 += p, pl += p32;
          const float* vrow = vh.data() + (g * L + j) * D;
          for (int64_t d = 0; d < D; ++d) o64[size_t(d)] += p * vrow[d], panel[size_t(d)] += p32 * vrow[d];
        }
        l32 += pl;
        for (int64_t d = 0; d < D; ++d) o32[size_t(d)] += panel[size_t(d)];
      }
      for (int64_t d = 0; d < D; ++d)
        eo.add(out[size_t((t * H + h) * D + d)], o32[size_t(d)] / l32, o64[size_t(d)] / l64);
      el.add(lse[size_t(h * T + t)], m32 + std::log(l32), m64 + std::log(l64));
    }
    const bool passed = eo.passed() && el.passed();
    const int64_t splits = kernels::cuda_decode_splits(dims, T, L);
    std::printf("decode kernel on %s: %lld keys, H %lld, Hkv %lld, D %lld, %s, %lld token(s), %lld splits\n", prop.name,
                (long long)L, (long long)H, (long long)Hkv, (long long)D, dtype_name(o.dtype), (long long)T,
                (long long)splits);
    std::printf("  kernel %.3f ms: %.0f GB/s read; copy of the same bytes %.0f GB/s (read + written): %.0f%%\n",
                t_kernel * 1e3, kernel_rate / 1e9, copy_rate / 1e9, 100.0 * kernel_rate / copy_rate);
    std::printf("  check %s: O error %.2e (bound %.2e), LSE error %.2e (bound %.2e), heads 0 and %lld\n",
                passed ? "passed" : "FAILED", eo.error, eo.bound(), el.error, el.bound(), (long long)(H - 1));
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << "{\"device\": \"" << prop.name << "\", \"keys\": " << L << ", \"heads\": " << H << ", \"kv_heads\": " << Hkv
        << ", \"head_dim\": " << D << ", \"dtype\": \"" << dtype_name(o.dtype) << "\", \"tokens\": " << T
        << ", \"kernel_s\": " << t_kernel << ", \"kernel_bytes_per_s\": " << kernel_rate
        << ", \"copy_bytes_per_s\": " << copy_rate << ", \"fraction\": " << kernel_rate / copy_rate
        << ", \"check_passed\": " << (passed ? "true" : "false") << "}\n";
    }
    for (void* p : {k, v, q, static_cast<void*>(dpos), static_cast<void*>(o_dev), static_cast<void*>(lse_dev),
                    workspace, copy_src, copy_dst})
      cudaFree(p);
    return passed ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringattn_gpu_decode_bench: %s\n", e.what());
    return 2;
  }
}
