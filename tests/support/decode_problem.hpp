// A decode kernel's test problem (the CPU and CUDA decode kernels' tests): T new tokens ending at
// the last of `rows` cached rows at positions 1, 1 + stride, ... (one rank's share of a round-robin
// placement), seeded q, k, v (rounded to bf16 for bf16), the cache's head-major copies of K and V,
// and the check of a result against fp64 by the error rule.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/error_rule.hpp"
#include "kernels/attention.hpp"
#include "kernels/mask/mask.hpp"
#include "kernels/reference.hpp"
#include "tests/support/gtest_or_mini.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {

// A case of the decode kernels' tests, and what a run gives.
struct DecodeCase {
  int64_t heads, kv_heads, head_dim, rows, tokens, window_left;
  DType dtype;
  int64_t stride = 3;  // cached positions 1, 4, 7, ...: one rank's share of a round-robin placement
};
struct DecodeRun {
  std::vector<float> o, lse;  // (T, H, D), (H, T)
};

struct DecodeProblem {
  kernels::AttentionDims dims;
  int64_t tokens, rows, capacity, window_left;
  DType dtype;
  std::vector<int64_t> k_pos, q_pos;
  std::vector<float> q, k, v;           // row-major: q (T, H, D), k and v (rows, Hkv, D)
  std::vector<float> k_cache, v_cache;  // head-major: head g's row j at (g * capacity + j) * D

  DecodeProblem(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rows_, int64_t tokens_,
                int64_t window_left_, DType dtype_, int64_t stride, int64_t capacity_, uint64_t seed)
      : dims{1, heads, kv_heads, head_dim, 1.0f / std::sqrt(float(head_dim))},
        tokens(tokens_),
        rows(rows_),
        capacity(capacity_),
        window_left(window_left_),
        dtype(dtype_) {
    const int64_t H = heads, Hkv = kv_heads, D = head_dim, T = tokens;
    for (int64_t j = 0; j < rows; ++j) k_pos.push_back(1 + j * stride);
    for (int64_t t = 0; t < T; ++t) q_pos.push_back(k_pos.back() - (T - 1) + t);
    q = random_vector(size_t(T * H * D), seed), k = random_vector(size_t(rows * Hkv * D), seed + 1);
    v = random_vector(size_t(rows * Hkv * D), seed + 2);
    if (dtype == DType::bf16) q = round_to_bf16(q), k = round_to_bf16(k), v = round_to_bf16(v);
    k_cache.assign(size_t(Hkv * capacity * D), 0.0f), v_cache.assign(k_cache.size(), 0.0f);
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t g = 0; g < Hkv; ++g)
        for (int64_t d = 0; d < D; ++d) {
          k_cache[size_t((g * capacity + j) * D + d)] = k[size_t((j * Hkv + g) * D + d)];
          v_cache[size_t((g * capacity + j) * D + d)] = v[size_t((j * Hkv + g) * D + d)];
        }
  }

  DecodeProblem(const DecodeCase& c, int64_t capacity_, uint64_t seed)
      : DecodeProblem(c.heads, c.kv_heads, c.head_dim, c.rows, c.tokens, c.window_left, c.dtype, c.stride, capacity_,
                      seed) {}

  // EXPECTs o (T, H, D) and lse (H, T) within the error rule of fp64 (causal, the window), against
  // the same computation rounded as `precision` says (kernels::decode_same_precision).
  void expect_exact(const std::vector<float>& o, const std::vector<float>& lse, const std::string& what = "",
                    kernels::SamePrecision precision = kernels::SamePrecision::fp32()) const {
    Mask mask;
    mask.causal = true;
    if (window_left >= 0) mask.window_left = window_left;
    std::vector<double> ro(o.size()), rlse(lse.size());
    kernels::reference_forward(dims, q.data(), q_pos.data(), tokens, k.data(), v.data(), k_pos.data(), rows,
                               mask.view(), ro.data(), rlse.data());
    std::vector<float> so(o.size()), slse(lse.size());
    kernels::naive_forward_fp32(dims, q.data(), q_pos.data(), tokens, k.data(), v.data(), k_pos.data(), rows,
                                mask.view(), so.data(), slse.data(), precision);
    kernels::TensorError eo, el;
    for (size_t i = 0; i < ro.size(); ++i) eo.add(o[i], so[i], ro[i]);
    for (size_t i = 0; i < rlse.size(); ++i) el.add(lse[i], slse[i], rlse[i]);
    EXPECT_TRUE(eo.passed()) << what << ": O error " << eo.error << " bound " << eo.bound();
    EXPECT_TRUE(el.passed()) << what << ": LSE error " << el.error << " bound " << el.bound();
  }
};

}  // namespace ringattn::testing
