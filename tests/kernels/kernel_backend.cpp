#include "tests/kernels/kernel_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>

#include "kernels/error_rule.hpp"
#include "kernels/reference.hpp"
#include "kernels/sampled_check.hpp"
#include "tests/support/gtest_or_mini.hpp"

namespace ringattn::testing {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float round_to(float x, DType t) {
  if (t == DType::bf16) return bf16_to_float(float_to_bf16(x));
  if (t == DType::f16) return fp16_to_float(float_to_fp16(x));
  return x;
}

// The plain fp32 computation with the variant's rounding of P and dS (kernels/reference.hpp),
// delta = rowsum(dO * O) summed in fp32 too.
Outputs same_precision(const Problem& p, const std::vector<double>& ref_o, kernels::SamePrecision precision) {
  Outputs r;
  r.o.assign(p.q_elems(), 0.0f);
  r.lse.assign(p.lse_elems(), kNegInf);
  const MaskView mask = p.mask.view();
  kernels::naive_forward_fp32(p.dims, p.q.data(), p.q_pos.data(), p.rows_q(), p.k.data(), p.v.data(), p.k_pos.data(),
                              p.rows_k(), mask, r.o.data(), r.lse.data(), precision);
  kernels::RowStates st;
  st.o = ref_o, st.o32 = r.o;
  kernels::add_deltas(p.dims, p.rows_q(), p.dout, st);
  r.dq.assign(p.q_elems(), 0.0f);
  r.dk.assign(p.k_elems(), 0.0f);
  r.dv.assign(p.k_elems(), 0.0f);
  kernels::naive_backward_fp32(p.dims, p.q.data(), p.q_pos.data(), p.rows_q(), p.k.data(), p.v.data(), p.k_pos.data(),
                               p.rows_k(), p.dout.data(), r.lse.data(), st.delta32.data(), mask, r.dq.data(),
                               r.dk.data(), r.dv.data(), precision);
  return r;
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

// One tensor by the rule; `rounding`: what the scores' fp32 rounding moves it by (error_rule.hpp).
void judge_tensor(const std::string& what, const std::vector<float>& got, const std::vector<float>& same,
                  const std::vector<double>& ref, double rounding) {
  kernels::TensorError e;
  e.rounding = rounding;
  for (size_t i = 0; i < got.size(); ++i) e.add(got[i], same[i], ref[i]);
  EXPECT_TRUE(e.passed()) << what << ": error " << e.error << " over the bound " << e.bound()
                          << " (same-precision error " << e.baseline << ", scale " << e.scale << ")";
  if (std::getenv("RINGATTN_TEST_VERBOSE"))
    std::printf("  %-28s error %.3e  same-precision error %.3e  error/bound %.2f\n", what.c_str(), e.error,
                e.baseline, e.ratio());
}

void judge_variant(const std::string& tag, const Problem& p, const Outputs& got, const Outputs& same,
                   const RefOutputs& ref, RowRange empty) {
  for (float x : got.lse) ASSERT_FALSE(std::isnan(x)) << tag << "lse is NaN";
  for (size_t i = 0; i < got.lse.size(); ++i)
    ASSERT_EQ(std::isinf(got.lse[i]), std::isinf(ref.lse[i])) << tag << "empty-row status differs at lse " << i;
  // Rows that see no key: O = 0 and dQ = 0 exactly.
  const int64_t H = p.dims.heads, D = p.dims.head_dim, L = p.rows_q();
  for (int64_t b = 0; b < p.dims.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        if (i >= empty.first && i < empty.last) {
          ASSERT_EQ(got.lse[size_t((b * H + h) * L + i)], kNegInf) << tag << "row " << i << " sees no key";
        }
        if (got.lse[size_t((b * H + h) * L + i)] != kNegInf) continue;
        for (int64_t d = 0; d < D; ++d) {
          const size_t e = size_t(((b * L + i) * H + h) * D + d);
          ASSERT_EQ(got.o[e], 0.0f) << tag << "O of an empty row";
          ASSERT_EQ(got.dq[e], 0.0f) << tag << "dQ of an empty row";
        }
      }
  for (auto [name, x] : {std::pair{"o", &got.o}, {"dq", &got.dq}, {"dk", &got.dk}, {"dv", &got.dv}})
    ASSERT_TRUE(all_finite(*x)) << tag << name << " has NaN/Inf";
  // Score rounding (as the distributed check, runtime/check.cpp): O averages V rows, LSE carries
  // it once, each gradient element in proportion to its terms.
  const double score_rounding = kernels::kScoreRounding * ref.max_score;
  double max_v = 0.0;
  for (float x : p.v) max_v = std::max(max_v, double(std::abs(x)));
  judge_tensor(tag + "o", got.o, same.o, ref.o, score_rounding * max_v);
  judge_tensor(tag + "lse", got.lse, same.lse, ref.lse, score_rounding);
  judge_tensor(tag + "dq", got.dq, same.dq, ref.dq, score_rounding * max_abs(ref.dq_terms));
  judge_tensor(tag + "dk", got.dk, same.dk, ref.dk, score_rounding * max_abs(ref.dk_terms));
  judge_tensor(tag + "dv", got.dv, same.dv, ref.dv, score_rounding * max_abs(ref.dv_terms));
}

}  // namespace

std::vector<float> rounded(const std::vector<float>& x, DType t) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = round_to(x[i], t);
  return y;
}

Problem rounded(const Problem& p, DType t) {
  Problem r = p;
  r.q = rounded(p.q, t), r.k = rounded(p.k, t), r.v = rounded(p.v, t), r.dout = rounded(p.dout, t);
  return r;
}

std::vector<uint8_t> encode(const std::vector<float>& x, DType t) {
  std::vector<uint8_t> out(x.size() * size_t(dtype_bytes(t)));
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[4 * i], &x[i], 4);
    } else {
      const uint16_t bits = t == DType::bf16 ? float_to_bf16(x[i]) : float_to_fp16(x[i]);
      std::memcpy(&out[2 * i], &bits, 2);
    }
  }
  return out;
}

Outputs run_kernels(const KernelBackend& backend, const Problem& p, const KernelVariant& v, bool backward) {
  Outputs r;
  r.o.assign(p.q_elems(), 0.0f);
  r.lse.assign(p.lse_elems(), kNegInf);
  backend.forward(p, v, 0, p.rows_k(), r.o, r.lse);
  if (!backward) return r;
  r.dq.assign(p.q_elems(), 0.0f);
  r.dk.assign(p.k_elems(), 0.0f);
  r.dv.assign(p.k_elems(), 0.0f);
  backend.backward(p, v, 0, p.rows_k(), r.o, r.lse, r.dq, r.dk, r.dv);
  return r;
}

int check_problem(const KernelBackend& backend, const Problem& original, const std::vector<DType>& dtypes,
                  RowRange empty) {
  int ran = 0;
  for (DType t : dtypes) {
    const std::vector<KernelVariant> variants = backend.variants(original.dims, t);
    if (variants.empty()) continue;
    const Problem p = rounded(original, t);
    const RefOutputs ref = run_reference(p);
    std::map<kernels::SamePrecision, Outputs> same;  // one per rounding model, shared by its variants
    for (const KernelVariant& v : variants) {
      if (!same.count(v.precision)) same.emplace(v.precision, same_precision(p, ref.o, v.precision));
      judge_variant(v.tag() + " ", p, run_kernels(backend, p, v), same.at(v.precision), ref, empty);
      ++ran;
    }
  }
  return ran;
}

}  // namespace ringattn::testing
