// The choice of instruction set for the CPU kernels (once, from the CPU's features or
// RINGATTN_ISA), and the FMA-peak probe the kernel benchmark measures against.
#include "kernels/cpu/dispatch.hpp"

#include <omp.h>
#if defined(RINGATTN_X86_ISAS)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cpu/attention_cpu.hpp"

namespace ringattn::kernels {
namespace cpu {
#if defined(RINGATTN_X86_ISAS)
namespace avx512 { TileKernels tile_kernels(); }
namespace avx512bf16 { TileKernels tile_kernels(); }
#if defined(RINGATTN_AMX_KERNELS)
namespace amx { TileKernels tile_kernels(); }
#endif
namespace avx2 { TileKernels tile_kernels(); }
#endif
namespace scalar { TileKernels tile_kernels(); }
}  // namespace cpu

namespace {

using cpu::TileKernels;

#if defined(RINGATTN_X86_ISAS)
// Whether bf16 inputs run faster on the bf16 dot product (VDPBF16PS: two products per lane per
// instruction, P and dS rounded to bf16) than converted exactly to fp32 on the FMA. On AMD Zen 4
// and 5 the dot product does twice the FMA's FLOPs per cycle; on the Intel Xeon of our
// development machine (AVX512-BF16 without AMX) it measured half (105 vs 213 GFLOP/s on one
// core), and its fp32 path ran bf16 rows 1.4-1.8x faster; other Intel cores are assumed alike.
// Decided by vendor, not by timing, so that a run's arithmetic never depends on the machine's
// load; RINGATTN_ISA=avx512bf16 forces the dot product.
bool bf16_dot_outruns_fma() { return __builtin_cpu_is("amd"); }

// Whether this process may use the AMX tiles: CPUID has AMX-TILE and AMX-BF16, and Linux grants
// the tile data state (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, once per process, for all its
// threads; refused by kernels before 5.16 and where the state is not enabled). Asked once.
bool amx_usable() {
#if !defined(RINGATTN_AMX_KERNELS)
  return false;  // (a compiler without the tile instructions: not built)
#endif
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

TileKernels choose_kernels() {
  const char* forced = std::getenv("RINGATTN_ISA");
  const std::string want = forced ? forced : "";
#if defined(RINGATTN_X86_ISAS)
  const bool has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool has_avx512bf16 = has_avx512 && __builtin_cpu_supports("avx512bf16");
  const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // (The AMX code is compiled with the AVX512-BF16 conversions; every AMX CPU has them.)
  [[maybe_unused]] const auto has_amx = [&] { return has_avx512bf16 && amx_usable(); };
  if (want.empty()) {
    // Not amx yet, though its bf16 products run at 3-4x the FMA path's rate on Sapphire Rapids:
    // it rounds P to bf16 before P V, which the --check model follows (cpu_same_precision) but the
    // ring's, the layer's and the command line's tests, whose bf16 bounds model P unrounded, do
    // not yet. RINGATTN_ISA=amx chooses it (docs/kernels.md, "AMX").
    if (has_avx512bf16 && bf16_dot_outruns_fma()) return cpu::avx512bf16::tile_kernels();
    if (has_avx512) return cpu::avx512::tile_kernels();
    return has_avx2 ? cpu::avx2::tile_kernels() : cpu::scalar::tile_kernels();
  }
#if defined(RINGATTN_AMX_KERNELS)
  if (want == "amx" && has_amx()) return cpu::amx::tile_kernels();
#endif
  if (want == "avx512bf16" && has_avx512bf16) return cpu::avx512bf16::tile_kernels();
  if (want == "avx512" && has_avx512) return cpu::avx512::tile_kernels();
  if (want == "avx2" && has_avx2) return cpu::avx2::tile_kernels();
#else
  if (want.empty()) return cpu::scalar::tile_kernels();
#endif
  if (want == "scalar") return cpu::scalar::tile_kernels();
  throw std::invalid_argument("RINGATTN_ISA=" + want +
                              ": not one of amx, avx512bf16, avx512, avx2, scalar, or not supported by this CPU");
}

}  // namespace

namespace cpu {
const TileKernels& selected_tile_kernels() {
  static const TileKernels k = choose_kernels();
  return k;
}
}  // namespace cpu

const char* cpu_isa() { return cpu::selected_tile_kernels().name; }
SamePrecision cpu_same_precision(DType dtype) {
  const cpu::TileKernels& tk = cpu::selected_tile_kernels();
  // AMX rounds P to bf16 before P V as well as P and dS in the backward (attention_tiles_amx.inl).
  if (dtype == DType::bf16 && tk.amx) return SamePrecision::bf16_products();
  // The bf16 dot product rounds P and dS in the backward only: the forward's P V runs on the fp32
  // FMA with P unrounded (tile_args.hpp, TileKernels::bf16_dot).
  SamePrecision p;
  p.backward_products = dtype == DType::bf16 && tk.bf16_dot ? DType::bf16 : DType::f32;
  return p;
}
const char* cpu_path(DType dtype) {
  const cpu::TileKernels& tk = cpu::selected_tile_kernels();
  if (tk.amx) return dtype == DType::bf16 ? "amx" : "avx512";  // fp32 runs the AVX-512 code
  return tk.name;
}
int cpu_query_tile() { return cpu::selected_tile_kernels().query_tile; }
int cpu_key_block() { return cpu::selected_tile_kernels().key_block; }
namespace {
// The rate of `loop` (flops_per_iter FLOPs per iteration) on `threads` threads at once, GFLOP/s.
double measure_loop_gflops(float (*loop)(int64_t, float), int flops_per_iter, int threads, double seconds) {
  // Calibrate the iteration count on one thread, then run every thread at once.
  int64_t iters = 1 << 16;
  double elapsed = 0.0;
  float sink = 0.0f;
  for (;;) {
    const double t0 = omp_get_wtime();
    sink += loop(iters, 1.0f);
    elapsed = omp_get_wtime() - t0;
    if (elapsed > seconds / 4 || iters > (int64_t{1} << 40)) break;
    iters *= 4;
  }
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    double t0 = 0.0, t1 = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
#pragma omp barrier
#pragma omp single
      t0 = omp_get_wtime();
      sink += loop(iters, float(omp_get_thread_num()));
#pragma omp barrier
#pragma omp single
      t1 = omp_get_wtime();
    }
    best = std::max(best, double(iters) * flops_per_iter * threads / (t1 - t0) / 1e9);
  }
  volatile float observed = sink;  // keeps the loops from being optimised away
  (void)observed;
  return best;
}
}  // namespace

double measure_fma_peak_gflops(int threads, double seconds) {
  const cpu::TileKernels& tk = cpu::selected_tile_kernels();
  return measure_loop_gflops(tk.fma_loop, tk.fma_flops_per_iter, threads, seconds);
}

double measure_bf16_dot_peak_gflops(int threads, double seconds) {
  const cpu::TileKernels& tk = cpu::selected_tile_kernels();
  if (!tk.bf16_dot) return 0.0;
  return measure_loop_gflops(tk.bf16_dot_loop, tk.bf16_dot_flops_per_iter, threads, seconds);
}

double measure_tile_peak_gflops(int threads, double seconds) {
  const cpu::TileKernels& tk = cpu::selected_tile_kernels();
  if (!tk.amx) return 0.0;
  return measure_loop_gflops(tk.tile_loop, tk.tile_flops_per_iter, threads, seconds);
}

bool cpu_supports_head_dim(int64_t head_dim) { return head_dim > 0 && head_dim <= 512 && head_dim % 16 == 0; }

}  // namespace ringattn::kernels
