// The shapes and partial states every attention kernel (CPU and CUDA) works on.
//
// Tensors are row-major with positions as the second-slowest axis:
//   Q, dO, O, dQ: (B, rows_q, H, D);  K, V, dK, dV: (B, rows_k, Hkv, D);  LSE, delta: (B, H, rows_q).
// Every row carries its global position (pos[], strictly increasing), so a rank can attend its
// queries to any set of key rows (its own shard, a received block, the halo of a window) and
// the mask of SPEC.md applies exactly. Query head h reads key/value head h / (H / Hkv).
#pragma once

#include <cstdint>

#include "util/dtype.hpp"

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

// How a kernel rounds, for the same-precision reference its results are judged against
// (kernels/error_rule.hpp): every product in fp32 (bf16 inputs converted exactly), or P and dS
// rounded to bf16 (fp16) before their products (FlashAttention-2's bf16 and fp16 contracts).
enum class SamePrecision { fp32, bf16_products, fp16_products };

}  // namespace ringattn::kernels
