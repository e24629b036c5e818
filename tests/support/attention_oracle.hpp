// The oracles every kernel test compares against: the fp64 reference of a whole Problem
// (forward, and backward from the reference's own LSE and delta), and the CPU kernels run on it.
#pragma once

#include <limits>
#include <vector>

#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/reference.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
};

struct RefOutputs {
  std::vector<double> o, lse, dq, dk, dv;
  // What the rounding of the scores costs any implementation (kernels/error_rule.hpp): the largest
  // |scaled score| of a visible pair, and per gradient element the sum of its terms' magnitudes.
  double max_score = 0.0;
  std::vector<double> dq_terms, dk_terms, dv_terms;
};

// fp64 forward and backward of the problem (the problem's inputs as they are).
inline RefOutputs run_reference(const Problem& p) {
  RefOutputs r;
  r.o.assign(p.q_elems(), 0.0);
  r.lse.assign(p.lse_elems(), 0.0);
  const MaskView mask = p.mask.view();
  kernels::reference_forward(p.dims, p.q.data(), p.q_pos.data(), p.rows_q(), p.k.data(), p.v.data(), p.k_pos.data(),
                             p.rows_k(), mask, r.o.data(), r.lse.data(), &r.max_score);
  std::vector<double> delta(p.lse_elems(), 0.0);
  const int64_t H = p.dims.heads, D = p.dims.head_dim, L = p.rows_q();
  for (int64_t b = 0; b < p.dims.batch; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t h = 0; h < H; ++h) {
        double s = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          const size_t e = size_t(((b * L + i) * H + h) * D + d);
          s += r.o[e] * double(p.dout[e]);
        }
        delta[size_t((b * H + h) * L + i)] = s;
      }
  r.dq.assign(p.q_elems(), 0.0);
  r.dk.assign(p.k_elems(), 0.0);
  r.dv.assign(p.k_elems(), 0.0);
  r.dq_terms.assign(p.q_elems(), 0.0);
  r.dk_terms.assign(p.k_elems(), 0.0);
  r.dv_terms.assign(p.k_elems(), 0.0);
  const kernels::GradientMagnitudes terms{r.dq_terms.data(), r.dk_terms.data(), r.dv_terms.data()};
  kernels::reference_backward(p.dims, p.q.data(), p.q_pos.data(), p.rows_q(), p.k.data(), p.v.data(), p.k_pos.data(),
                              p.rows_k(), p.dout.data(), r.lse.data(), delta.data(), mask, r.dq.data(), r.dk.data(),
                              r.dv.data(), &terms);
  return r;
}

// The CPU kernels on the problem; with bf16, the inputs are stored as bf16 (they must already be
// bf16-representable for comparisons with the reference to be exact).
inline Outputs run_cpu_kernels(const Problem& p, DType dtype = DType::f32, int threads = 2, bool backward = true) {
  Outputs r;
  r.o.assign(p.q_elems(), 0.0f);
  r.lse.assign(p.lse_elems(), -std::numeric_limits<float>::infinity());
  const MaskView mask = p.mask.view();
  std::vector<bf16_bits> qb, kb, vb, db;
  const void *qd = p.q.data(), *kd = p.k.data(), *vd = p.v.data(), *dd = p.dout.data();
  if (dtype == DType::bf16) {
    qb = to_bf16(p.q), kb = to_bf16(p.k), vb = to_bf16(p.v), db = to_bf16(p.dout);
    qd = qb.data(), kd = kb.data(), vd = vb.data(), dd = db.data();
  }
  kernels::QueryRows q{qd, dtype, p.rows_q(), p.q_pos.data()};
  kernels::KeyValueRows kv{kd, vd, dtype, p.rows_k(), p.k_pos.data()};
  kernels::CpuOptions opt;
  opt.threads = threads;
  kernels::attention_forward(p.dims, q, kv, mask, kernels::AttentionState{r.o.data(), r.lse.data()}, opt);
  if (!backward) return r;
  std::vector<float> delta(p.lse_elems());
  kernels::attention_delta(p.dims, p.rows_q(), r.o.data(), dd, dtype, delta.data());
  r.dq.assign(p.q_elems(), 0.0f);
  r.dk.assign(p.k_elems(), 0.0f);
  r.dv.assign(p.k_elems(), 0.0f);
  kernels::attention_backward(p.dims, q, kv, dd, r.lse.data(), delta.data(), r.dq.data(), r.dk.data(), r.dv.data(),
                              mask, opt);
  return r;
}

}  // namespace ringattn::testing
