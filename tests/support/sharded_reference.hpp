// What the distributed attention tests judge a rank's rows by: the fp64 reference of the whole
// (small) problem, and the same problem in plain fp32 arithmetic, whose error against fp64 sets
// the tolerance (FlashAttention-style: a few times that error). Inputs are the seeded
// random_rows tensors, so every rank generates its own rows of the same tensors and the
// references see them whole.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_cpu.hpp"
#include "runtime/random_inputs.hpp"
#include "tests/support/attention_oracle.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {

// Rows `pos` of the seeded tensor (B, L, width), rounded to bf16 for bf16 cases.
inline std::vector<float> seeded_rows(uint64_t seed, RandomTensor t, int64_t B, int64_t L, int64_t width,
                                      const std::vector<int64_t>& pos, DType dtype) {
  std::vector<float> x(static_cast<size_t>(B * int64_t(pos.size()) * width));
  random_rows(x.data(), seed, t, B, L, width, pos.data(), int64_t(pos.size()));
  return dtype == DType::bf16 ? round_to_bf16(x) : x;
}

// x as the backend holds it in `dtype` (fp32, or bf16 bits).
inline std::vector<uint8_t> stored(const std::vector<float>& x, DType dtype) {
  std::vector<uint8_t> b;
  if (dtype == DType::f32) {
    b.resize(x.size() * sizeof(float));
    std::memcpy(b.data(), x.data(), b.size());
  } else {
    const std::vector<bf16_bits> h = to_bf16(x);
    b.resize(h.size() * sizeof(bf16_bits));
    std::memcpy(b.data(), h.data(), b.size());
  }
  return b;
}

class ShardedReference {
 public:
  // The problem: q, dout (B, L, H, D) and k, v (B, L, Hkv, D) seeded by `seed`, this mask.
  ShardedReference(const kernels::AttentionDims& dims, const Mask& mask, int64_t L, uint64_t seed, DType dtype)
      : dims_(dims), L_(L), problem_(dims.batch, dims.heads, dims.kv_heads, dims.head_dim, iota_positions(L),
                                     iota_positions(L)) {
    problem_.dims = dims;
    problem_.mask = mask;
    const std::vector<int64_t>& all = problem_.q_pos;
    const int64_t H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim, B = dims.batch;
    problem_.q = seeded_rows(seed, RandomTensor::q, B, L, H * D, all, dtype);
    problem_.k = seeded_rows(seed, RandomTensor::k, B, L, Hkv * D, all, dtype);
    problem_.v = seeded_rows(seed, RandomTensor::v, B, L, Hkv * D, all, dtype);
    problem_.dout = seeded_rows(seed, RandomTensor::dout, B, L, H * D, all, dtype);
    exact_ = run_reference(problem_);
    // Plain fp32; bf16 inputs on the bf16 dot-product kernels round P and dS to bf16 in the
    // backward (FlashAttention-2's contract), and so does this baseline.
    const Problem& p = problem_;
    const MaskView mv = mask.view();
    plain_.o.assign(p.q_elems(), 0.0f);
    plain_.lse.assign(p.lse_elems(), 0.0f);
    kernels::naive_forward_fp32(dims, p.q.data(), all.data(), L, p.k.data(), p.v.data(), all.data(), L, mv,
                                plain_.o.data(), plain_.lse.data());
    std::vector<float> delta(p.lse_elems());
    kernels::attention_delta(dims, L, plain_.o.data(), p.dout.data(), DType::f32, delta.data());
    plain_.dq.assign(p.q_elems(), 0.0f);
    plain_.dk.assign(p.k_elems(), 0.0f);
    plain_.dv.assign(p.k_elems(), 0.0f);
    kernels::naive_backward_fp32(dims, p.q.data(), all.data(), L, p.k.data(), p.v.data(), all.data(), L,
                                 p.dout.data(), plain_.lse.data(), delta.data(), mv, plain_.dq.data(),
                                 plain_.dk.data(), plain_.dv.data(), kernels::cpu_same_precision(dtype));
  }

  struct Errors {
    double o, lse, dq, dk, dv;
  };
  // Checks (EXPECT) a rank's outputs, its rows at `pos`: o, dq (B, rows, H, D), lse (B, H, rows),
  // dk, dv (B, rows, Hkv, D); returns the errors against fp64.
  Errors check(const std::vector<int64_t>& pos, const std::vector<float>& o, const std::vector<float>& lse,
               const std::vector<float>& dq, const std::vector<float>& dk, const std::vector<float>& dv) const {
    const int64_t H = dims_.heads, Hkv = dims_.kv_heads, D = dims_.head_dim;
    Errors e{};
    e.o = check_one("o", o, rows_at(exact_.o, pos, H * D), rows_at(plain_.o, pos, H * D));
    e.lse = check_one("lse", lse, lse_at(exact_.lse, pos), lse_at(plain_.lse, pos));
    e.dq = check_one("dq", dq, rows_at(exact_.dq, pos, H * D), rows_at(plain_.dq, pos, H * D));
    e.dk = check_one("dk", dk, rows_at(exact_.dk, pos, Hkv * D), rows_at(plain_.dk, pos, Hkv * D));
    e.dv = check_one("dv", dv, rows_at(exact_.dv, pos, Hkv * D), rows_at(plain_.dv, pos, Hkv * D));
    return e;
  }

 private:
  // Rows `pos` of (B, L, width), and of LSE (B, H, L), as doubles.
  template <class T>
  std::vector<double> rows_at(const std::vector<T>& full, const std::vector<int64_t>& pos, int64_t width) const {
    const int64_t rows = int64_t(pos.size());
    std::vector<double> out(size_t(dims_.batch * rows * width));
    for (int64_t b = 0; b < dims_.batch; ++b)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < width; ++e)
          out[size_t((b * rows + r) * width + e)] = double(full[size_t((b * L_ + pos[size_t(r)]) * width + e)]);
    return out;
  }
  template <class T>
  std::vector<double> lse_at(const std::vector<T>& full, const std::vector<int64_t>& pos) const {
    const int64_t rows = int64_t(pos.size());
    std::vector<double> out(size_t(dims_.batch * dims_.heads * rows));
    for (int64_t bh = 0; bh < dims_.batch * dims_.heads; ++bh)
      for (int64_t r = 0; r < rows; ++r) out[size_t(bh * rows + r)] = double(full[size_t(bh * L_ + pos[size_t(r)])]);
    return out;
  }
  static double check_one(const char* what, const std::vector<float>& got, const std::vector<double>& exact,
                          const std::vector<double>& plain) {
    const double err = max_abs_diff(got, exact), base = max_abs_diff(plain, exact);
    EXPECT_LE(err, 4.0 * base + 2e-6) << what << ": error " << err << " vs fp32 naive " << base;
    return err;
  }

  kernels::AttentionDims dims_;
  int64_t L_;
  Problem problem_;
  RefOutputs exact_;
  Outputs plain_;
};

}  // namespace ringattn::testing
