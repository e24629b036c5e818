// Blockwise exact attention on the CPU (FlashAttention-2), as partial states that merge: the
// CPU implementation of kernels/attention.hpp. The arithmetic of one tile is in
// attention_tiles.inl, compiled once per instruction set and chosen at run time.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/attention.hpp"
#include "kernels/mask/mask_view.hpp"

namespace ringattn::kernels {

struct CpuOptions {
  int threads = 1;
  // Called now and then from the calling thread while the kernel runs, so a communicator can
  // drive transfers that overlap the compute. May be empty.
  std::function<void()> progress;
};

// The instruction set the CPU kernels run with: "amx", "avx512bf16", "avx512", "avx2" or "scalar".
// Chosen once from the CPU's features; RINGATTN_ISA=amx|avx512bf16|avx512|avx2|scalar forces one
// (tests use this).
const char* cpu_isa();
// The code inputs of this type run on: cpu_isa(), except on "amx", where fp32 inputs take the
// AVX-512 code ("avx512") and bf16 inputs the tiles ("amx").
const char* cpu_path(DType dtype);
// How the selected CPU kernels round with inputs of this type: bf16 inputs on AMX round P to bf16
// in the forward and P and dS in the backward (SamePrecision::bf16_products()); on an ISA with a
// bf16 dot product P and dS in the backward only; everything else is fp32.
SamePrecision cpu_same_precision(DType dtype);
// Rows per query tile and per key block of the selected ISA.
int cpu_query_tile();
int cpu_key_block();

// Peak fp32 FMA rate of this machine with the selected ISA, measured now on `threads` threads
// (independent FMA chains; GFLOP/s, 2 FLOPs per lane per FMA). The yardstick of the benchmark.
double measure_fma_peak_gflops(int threads, double seconds = 0.3);
// Peak rate of the bf16 dot-product instruction (VDPBF16PS: two products and two sums per fp32
// lane) on `threads` threads, GFLOP/s; 0 when the selected ISA has none. The yardstick of bf16 rows.
double measure_bf16_dot_peak_gflops(int threads, double seconds = 0.3);

// Peak rate of the AMX tile multiply (TDPBF16PS from registers, four independent accumulators) on
// `threads` threads, GFLOP/s; 0 when the selected ISA is not "amx". The yardstick of bf16 rows on AMX.
double measure_tile_peak_gflops(int threads, double seconds = 0.3);

// Head dims the CPU kernels support: multiples of 16 up to 512.
bool cpu_supports_head_dim(int64_t head_dim);

// Attends the queries to the keys/values and merges the result into `state` (which holds the
// queries' result over other keys, or is empty). Blocks the mask hides entirely are skipped.
void attention_forward(const AttentionDims& dims, const QueryRows& q, const KeyValueRows& kv, const MaskView& mask,
                       const AttentionState& state, const CpuOptions& options);

// dst <- merge(dst, src): the state over the union of both key sets. Commutative up to fp32 rounding.
void merge_states(const AttentionDims& dims, int64_t rows, const AttentionState& dst, const float* src_o,
                  const float* src_lse);

// delta = rowsum(dO * O), (B, H, rows): the softmax-gradient term every backward block needs.
void attention_delta(const AttentionDims& dims, int64_t rows, const float* o, const void* dout, DType dout_dtype,
                     float* delta);

// Gradients of the queries' loss through the keys/values `kv` (FA2 recomputation from LSE):
// dq += dL/dQ restricted to these keys, dk += dL/dK, dv += dL/dV (all fp32, accumulated).
// `dout` has the layout and dtype of `q.data`. Results are deterministic for a given thread count.
void attention_backward(const AttentionDims& dims, const QueryRows& q, const KeyValueRows& kv, const void* dout,
                        const float* lse, const float* delta, float* dq, float* dk, float* dv, const MaskView& mask,
                        const CpuOptions& options);

// The kernels keep the large temporaries (2 MiB and more) their calls freed for the next call,
// at most what the largest call used (kernels/cpu/workspace.hpp says why). This hands them back to
// the system; a later call maps afresh.
void release_cpu_workspace_cache();

}  // namespace ringattn::kernels
