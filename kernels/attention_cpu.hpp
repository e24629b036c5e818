// Blockwise exact attention on the CPU (FlashAttention-2), as partial states that merge.
//
// Tensors are row-major with positions as the second-slowest axis:
//   Q, dO, O, dQ: (B, rows_q, H, D);  K, V, dK, dV: (B, rows_k, Hkv, D);  LSE, delta: (B, H, rows_q).
// Every row carries its global position (pos[], strictly increasing), so a rank can attend its
// queries to any set of key rows (its own shard, a received block, the halo of a window) and
// the mask of SPEC.md applies exactly. Query head h reads key/value head h / (H / Hkv).
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/mask.hpp"
#include "kernels/types.hpp"

namespace ringattn::kernels {

struct AttentionDims {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 64;
  float scale = 0.125f;  // softmax scale, 1/sqrt(D) by default
};

struct QueryRows {
  const void* data = nullptr;  // Q (or dO for backward), dtype below
  DType dtype = DType::f32;
  int64_t rows = 0;
  const int64_t* pos = nullptr;
};

struct KeyValueRows {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  const int64_t* pos = nullptr;
};

// Partial result of the queries against the keys seen so far: O normalised by its own softmax
// denominator and LSE = log(denominator) (natural log, of the scaled scores). An empty state
// has O = 0 and LSE = -inf. Two states over disjoint key sets merge exactly (merge_states).
struct AttentionState {
  float* o = nullptr;    // (B, rows, H, D)
  float* lse = nullptr;  // (B, H, rows)
};

struct CpuOptions {
  int threads = 1;
  // Called now and then from the calling thread while the kernel runs, so a communicator can
  // drive transfers that overlap the compute. May be empty.
  std::function<void()> progress;
};

// The instruction set the CPU kernels run with: "avx512", "avx2" or "scalar". Chosen once from
// the CPU's features; RINGATTN_ISA=avx2|scalar forces a narrower one (tests use this).
const char* cpu_isa();
// Rows per query tile and per key block of the selected ISA.
int cpu_query_tile();
int cpu_key_block();

// Peak fp32 FMA rate of this machine with the selected ISA, measured now on `threads` threads
// (independent FMA chains; GFLOP/s, 2 FLOPs per lane per FMA). The yardstick of the benchmark.
double measure_fma_peak_gflops(int threads, double seconds = 0.3);

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

}  // namespace ringattn::kernels
