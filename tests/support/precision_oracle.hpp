// The oracle of the precision sweeps (tests/kernels/test_gradient_precision.cpp, its CUDA and ring
// counterparts): each output's error against fp64 as a multiple of the error of the plain fp32
// computation on the same inputs (kernels/reference.hpp, which sums as an fp32 GEMM does: the
// error of fp32 PyTorch), on sequences long enough that the sums over keys and over queries are
// long. A ratio, not an absolute tolerance: the bound follows the rounding the inputs cause.
//
// Both forwards run over every row (O and LSE are judged on every row, and every query's LSE and
// delta enter dK and dV); dQ is judged on sampled query rows and dK, dV on sampled key rows, each
// summed over every query that sees them. O(L^2) time, no L x L buffer. Batch 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/error_rule.hpp"
#include "kernels/reference.hpp"
#include "kernels/sampled_check.hpp"
#include "tests/support/attention_oracle.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {

struct PrecisionCase {
  int64_t L = 4096, H = 4, Hkv = 2, D = 64;
  bool causal = true;
  DType dtype = DType::f32;
  uint64_t seed = 1;

  std::string describe() const {
    return "L=" + std::to_string(L) + (causal ? " causal" : " full") + " H=" + std::to_string(H) + "/" +
           std::to_string(Hkv) + " D=" + std::to_string(D) + " " + dtype_name(dtype);
  }
  // Random normal inputs (rounded to bf16 for bf16 cases, so that the references see exactly what
  // the kernels see), positions 0..L-1.
  Problem problem() const {
    Problem p(1, H, Hkv, D, iota_positions(L), iota_positions(L), seed);
    p.mask.causal = causal;
    if (dtype == DType::bf16) p.q = round_to_bf16(p.q), p.k = round_to_bf16(p.k), p.v = round_to_bf16(p.v);
    if (dtype == DType::bf16) p.dout = round_to_bf16(p.dout);
    return p;
  }
};

struct PrecisionErrors {
  kernels::TensorError o, lse, dq, dk, dv;
};

// error / same-precision error; a floor of one fp32 unit of the tensor's scale where both are exact.
inline double precision_ratio(const kernels::TensorError& e) {
  return e.error / std::max(e.baseline, e.scale * 0x1p-24 + 1e-30);
}

// "o 0.93 lse 0.99 dq 0.45 dk 0.77 dv 0.57": each output's ratio (the sweep's table).
inline std::string describe_ratios(const PrecisionErrors& e) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "o %.2f lse %.2f dq %.2f dk %.2f dv %.2f", precision_ratio(e.o),
                precision_ratio(e.lse), precision_ratio(e.dq), precision_ratio(e.dk), precision_ratio(e.dv));
  return buf;
}

// The same as a row of the sweeps' Markdown table (docs/kernels.md, "Long sums"):
// | who | L | mask | D | dtype | O | LSE | dQ | dK | dV |
inline std::string table_row(const std::string& who, const PrecisionCase& c, const PrecisionErrors& e) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "| %s | %lld | %s | %lld | %s | %.2f | %.2f | %.2f | %.2f | %.2f |", who.c_str(),
                static_cast<long long>(c.L), c.causal ? "causal" : "none", static_cast<long long>(c.D),
                dtype_name(c.dtype), precision_ratio(e.o), precision_ratio(e.lse), precision_ratio(e.dq),
                precision_ratio(e.dk), precision_ratio(e.dv));
  return buf;
}

// The largest ratio (NaN counts as infinite).
inline double worst_ratio(const PrecisionErrors& e) {
  double w = 0.0;
  for (const kernels::TensorError* t : {&e.o, &e.lse, &e.dq, &e.dk, &e.dv}) {
    const double r = precision_ratio(*t);
    if (!(r <= w)) w = std::isnan(r) ? INFINITY : r;
  }
  return w;
}

class PrecisionOracle {
 public:
  // `same`: how the kernel under test rounds, pass by pass (kernels/attention.hpp; e.g.
  // cpu_same_precision, whose forward never rounds P). `p` must outlive the oracle.
  PrecisionOracle(const Problem& p, kernels::SamePrecision same) : p_(p) {
    const int64_t L = p.rows_q(), H = p.dims.heads, Hkv = p.dims.kv_heads, D = p.dims.head_dim;
    if (p.dims.batch != 1 || p.rows_k() != L) throw std::invalid_argument("PrecisionOracle: batch 1, L x L");
    rows_ = judged_rows(L);
    const MaskView mask = p.mask.view();
    forward_all(same);
    kernels::add_deltas(p.dims, L, p.dout, st_);

    // dQ of the judged query rows, against every key.
    const int64_t S = int64_t(rows_.size());
    const std::vector<float> qs = gather(p.q, H * D), ds = gather(p.dout, H * D);
    std::vector<double> lse(size_t(H * S)), delta(lse.size());
    std::vector<float> lse32(lse.size()), delta32(lse.size());
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) {
        const size_t from = size_t(h * L + rows_[size_t(s)]), to = size_t(h * S + s);
        lse[to] = st_.lse[from], delta[to] = st_.delta[from];
        lse32[to] = st_.lse32[from], delta32[to] = st_.delta32[from];
      }
    dq_.assign(size_t(S * H * D), 0.0), dq32_.assign(dq_.size(), 0.0f);
    kernels::reference_backward(p.dims, qs.data(), rows_.data(), S, p.k.data(), p.v.data(), p.k_pos.data(), L,
                                ds.data(), lse.data(), delta.data(), mask, dq_.data(), nullptr, nullptr);
    kernels::naive_backward_fp32(p.dims, qs.data(), rows_.data(), S, p.k.data(), p.v.data(), p.k_pos.data(), L,
                                 ds.data(), lse32.data(), delta32.data(), mask, dq32_.data(), nullptr, nullptr, same);

    // dK, dV of the judged key rows, over every query.
    const std::vector<float> ks = gather(p.k, Hkv * D), vs = gather(p.v, Hkv * D);
    dk_.assign(size_t(S * Hkv * D), 0.0), dv_.assign(dk_.size(), 0.0);
    dk32_.assign(dk_.size(), 0.0f), dv32_.assign(dk_.size(), 0.0f);
    kernels::reference_backward(p.dims, p.q.data(), p.q_pos.data(), L, ks.data(), vs.data(), rows_.data(), S,
                                p.dout.data(), st_.lse.data(), st_.delta.data(), mask, nullptr, dk_.data(),
                                dv_.data());
    kernels::naive_backward_fp32(p.dims, p.q.data(), p.q_pos.data(), L, ks.data(), vs.data(), rows_.data(), S,
                                 p.dout.data(), st_.lse32.data(), st_.delta32.data(), mask, nullptr, dk32_.data(),
                                 dv32_.data(), same);
  }

  // The errors of `got` (whole tensors in the layouts of kernels/attention.hpp, batch 1).
  PrecisionErrors judge(const Outputs& got) const {
    const int64_t H = p_.dims.heads, Hkv = p_.dims.kv_heads, D = p_.dims.head_dim;
    PrecisionErrors e;
    for (size_t i = 0; i < st_.o.size(); ++i) e.o.add(got.o[i], st_.o32[i], st_.o[i]);
    for (size_t i = 0; i < st_.lse.size(); ++i) e.lse.add(got.lse[i], st_.lse32[i], st_.lse[i]);
    for (size_t s = 0; s < rows_.size(); ++s) {
      for (int64_t x = 0; x < H * D; ++x) {
        const size_t at = size_t(s * H * D + x);
        e.dq.add(got.dq[size_t(rows_[s] * H * D + x)], dq32_[at], dq_[at]);
      }
      for (int64_t x = 0; x < Hkv * D; ++x) {
        const size_t at = size_t(s * Hkv * D + x), row = size_t(rows_[s] * Hkv * D + x);
        e.dk.add(got.dk[row], dk32_[at], dk_[at]);
        e.dv.add(got.dv[row], dv32_[at], dv_[at]);
      }
    }
    return e;
  }

 private:
  // First and last rows (causal: the keys whose gradients sum over the most queries, the queries
  // that sum over the most keys) and rows spread between them.
  static std::vector<int64_t> judged_rows(int64_t L) {
    std::vector<int64_t> r;
    for (int64_t i = 0; i < std::min<int64_t>(L, 24); ++i) r.push_back(i);
    for (int64_t i = std::max<int64_t>(0, L - 8); i < L; ++i) r.push_back(i);
    for (int64_t k = 1; k <= 32; ++k) r.push_back(k * (L - 1) / 33);
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
    return r;
  }
  // Rows rows_ of a (L, width) tensor.
  std::vector<float> gather(const std::vector<float>& x, int64_t width) const {
    std::vector<float> out(rows_.size() * size_t(width));
    for (size_t s = 0; s < rows_.size(); ++s)
      std::copy_n(&x[size_t(rows_[s] * width)], width, &out[s * size_t(width)]);
    return out;
  }
  // Both forwards over every row, in chunks of query rows on the available threads (rows are
  // independent; each row's sums are the same whatever the chunks).
  void forward_all(kernels::SamePrecision same) {
    const int64_t L = p_.rows_q(), H = p_.dims.heads, D = p_.dims.head_dim;
    st_.o.assign(size_t(L * H * D), 0.0), st_.lse.assign(size_t(H * L), 0.0);
    st_.o32.assign(st_.o.size(), 0.0f), st_.lse32.assign(st_.lse.size(), 0.0f);
    const MaskView mask = p_.mask.view();
    constexpr int64_t kChunk = 128;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t r0 = 0; r0 < L; r0 += kChunk) {
      const int64_t n = std::min(kChunk, L - r0);
      std::vector<double> lse(size_t(H * n));
      std::vector<float> lse32(lse.size());
      kernels::reference_forward(p_.dims, &p_.q[size_t(r0 * H * D)], &p_.q_pos[size_t(r0)], n, p_.k.data(),
                                 p_.v.data(), p_.k_pos.data(), L, mask, &st_.o[size_t(r0 * H * D)], lse.data());
      kernels::naive_forward_fp32(p_.dims, &p_.q[size_t(r0 * H * D)], &p_.q_pos[size_t(r0)], n, p_.k.data(),
                                  p_.v.data(), p_.k_pos.data(), L, mask, &st_.o32[size_t(r0 * H * D)], lse32.data(),
                                  same);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < n; ++i) {
          st_.lse[size_t(h * L + r0 + i)] = lse[size_t(h * n + i)];
          st_.lse32[size_t(h * L + r0 + i)] = lse32[size_t(h * n + i)];
        }
    }
  }

  const Problem& p_;
  std::vector<int64_t> rows_;
  kernels::RowStates st_;  // O, LSE and delta of every row, fp64 and plain fp32
  std::vector<double> dq_, dk_, dv_;
  std::vector<float> dq32_, dk32_, dv32_;
};

}  // namespace ringattn::testing
