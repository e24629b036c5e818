// The shapes and partial states every attention kernel (CPU and CUDA) works on.
//
// Tensors are row-major with positions as the second-slowest axis:
//   Q, dO, O, dQ: (B, rows_q, H, D);  K, V, dK, dV: (B, rows_k, Hkv, D);  LSE, delta: (B, H, rows_q).
// Every row carries its global position (pos[], strictly increasing), so a rank can attend its
// queries to any set of key rows (its own shard, a received block, the halo of a window) and
// the mask of docs/reference.md applies exactly. Query head h reads key/value head h / (H / Hkv).
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
  int step = -1;  // the id a backend's prepare() gave this step of a ring (-1: none)
};

// Partial result of the queries against the keys seen so far: O normalised by its own softmax
// denominator and LSE = log(denominator) (natural log, of the scaled scores). An empty state
// has O = 0 and LSE = -inf. Two states over disjoint key sets merge exactly (merge_states).
struct AttentionState {
  float* o = nullptr;    // (B, rows, H, D)
  float* lse = nullptr;  // (B, H, rows)
};

// How the kernels that ran round, for the same-precision reference their results are judged
// against (kernels/error_rule.hpp), pass by pass: every product in fp32 (bf16 inputs converted
// exactly), or P (forward: P V) and P, dS (backward) rounded to bf16 or fp16 before their products
// (FlashAttention-2's bf16 and fp16 contracts: the tensor cores, the CPU's bf16 dot product in the
// backward); and with *_step_outputs, each ring step's result rounded to bf16 before the fp32 sums
// across steps (cuDNN's fused attention writes O, dQ, dK, dV in the input type), the backward's
// delta = rowsum(dO * O) from O rounded to bf16.
struct SamePrecision {
  DType forward_products = DType::f32;   // the type P is rounded to before P V (f32: not rounded)
  DType backward_products = DType::f32;  // the type P and dS are rounded to before their products
  bool forward_step_outputs = false;
  bool backward_step_outputs = false;

  // (C++17: the CUDA sources include this.)
  bool operator==(const SamePrecision& o) const {
    return forward_products == o.forward_products && backward_products == o.backward_products &&
           forward_step_outputs == o.forward_step_outputs && backward_step_outputs == o.backward_step_outputs;
  }
  bool operator<(const SamePrecision& o) const {  // (an order, for maps)
    auto key = [](const SamePrecision& p) {
      return int(p.forward_products) << 10 | int(p.backward_products) << 2 | int(p.forward_step_outputs) << 1 |
             int(p.backward_step_outputs);
    };
    return key(*this) < key(o);
  }
  static constexpr SamePrecision fp32() { return {}; }
  static constexpr SamePrecision bf16_products() { return {DType::bf16, DType::bf16, false, false}; }
  static constexpr SamePrecision fp16_products() { return {DType::f16, DType::f16, false, false}; }
  // The union of two paths' rounding (some steps on one, some on the other): the looser bound.
  SamePrecision operator|(const SamePrecision& o) const {
    return {coarser(forward_products, o.forward_products), coarser(backward_products, o.backward_products),
            forward_step_outputs || o.forward_step_outputs, backward_step_outputs || o.backward_step_outputs};
  }
  // bf16 (8 bits of mantissa) rounds more than fp16 (11), which rounds more than fp32.
  static constexpr DType coarser(DType a, DType b) {
    return a == DType::bf16 || b == DType::bf16 ? DType::bf16 : a == DType::f16 || b == DType::f16 ? DType::f16 : DType::f32;
  }
};

}  // namespace ringattn::kernels
