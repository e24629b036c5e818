// Helpers shared by the tests: seeded inputs, problem setup, error measures.
#pragma once

#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/reference.hpp"
#include "util/dtype.hpp"
#include "kernels/mask/mask.hpp"

namespace ringattn::testing {

inline std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& e : x) e = dist(gen);
  return x;
}

inline std::vector<int64_t> iota_positions(int64_t n, int64_t first = 0, int64_t stride = 1) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = first + i * stride;
  return p;
}

// Rounds every element to bf16 and back, so fp64 references see exactly what bf16 kernels see.
inline std::vector<float> round_to_bf16(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_float(float_to_bf16(x[i]));
  return y;
}

inline std::vector<bf16_bits> to_bf16(const std::vector<float>& x) {
  std::vector<bf16_bits> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float_to_bf16(x[i]);
  return y;
}

template <class A, class B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    if (std::isinf(x) && std::isinf(y) && (x > 0) == (y > 0)) continue;
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    m = std::max(m, std::abs(x - y));
  }
  return m;
}

inline bool all_finite(const std::vector<float>& a) {
  for (float x : a)
    if (!std::isfinite(x)) return false;
  return true;
}

// One attention problem: queries and keys with their positions, inputs, and dO.
struct Problem {
  kernels::AttentionDims dims;
  std::vector<int64_t> q_pos, k_pos;
  std::vector<float> q, k, v, dout;
  Mask mask;

  Problem(int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, std::vector<int64_t> qp,
          std::vector<int64_t> kp, uint64_t seed = 1, float input_scale = 1.0f)
      : q_pos(std::move(qp)), k_pos(std::move(kp)) {
    dims = {batch, heads, kv_heads, head_dim, 1.0f / std::sqrt(float(head_dim))};
    const size_t nq = size_t(batch * rows_q() * heads * head_dim);
    const size_t nk = size_t(batch * rows_k() * kv_heads * head_dim);
    q = random_vector(nq, seed, input_scale);
    k = random_vector(nk, seed + 1, input_scale);
    v = random_vector(nk, seed + 2);
    dout = random_vector(nq, seed + 3);
  }
  int64_t rows_q() const { return int64_t(q_pos.size()); }
  int64_t rows_k() const { return int64_t(k_pos.size()); }
  size_t q_elems() const { return q.size(); }
  size_t k_elems() const { return k.size(); }
  size_t lse_elems() const { return size_t(dims.batch * dims.heads * rows_q()); }
};

}  // namespace ringattn::testing
