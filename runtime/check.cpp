#include "runtime/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "kernels/reference.hpp"

namespace ringattn {

namespace {

// Tolerances, relative to the largest reference magnitude of each tensor. fp32 arithmetic
// rounds each score s by about |s| * 2^-24, and the softmax turns that into a relative error of
// the same size in every probability, so the bound grows with the largest |score| (|s| ~ 1e4
// gives errors ~1e-3 in any fp32 implementation); kRelTol covers ordinary inputs.
constexpr double kRelTol = 1e-4;
constexpr double kScoreRounding = 4.0 * 5.96e-8;  // 4 x fp32 epsilon (2^-24) per unit of |score|
constexpr double kAbsTol = 1e-6;
// Rounding P and dS to bf16 moves each term of a gradient by at most 2^-9 of itself (nearest
// even); twice that, times the sum of |terms|, bounds the error it can add.
constexpr double kBf16Rounding = 1.0 / 256.0;

using comm::DataType;
using comm::ReduceOp;

std::vector<int64_t> sample_positions(int64_t L, int samples, uint64_t seed) {
  std::set<int64_t> s{0, L - 1};
  std::mt19937_64 gen(seed ^ 0xc0ffeeull);
  while (static_cast<int64_t>(s.size()) < std::min<int64_t>(samples, L)) s.insert(static_cast<int64_t>(gen() % L));
  return {s.begin(), s.end()};
}

// Every rank gets the sampled rows of a (B, rows, width) tensor: owners fill, the rest add zeros.
std::vector<float> share_rows(comm::Communicator& comm, const ShardLayout& layout, const float* local, int64_t B,
                              int64_t rows, int64_t width, const std::vector<int64_t>& pos) {
  const int64_t S = static_cast<int64_t>(pos.size());
  std::vector<float> out(static_cast<size_t>(B * S * width), 0.0f);
  for (int64_t s = 0; s < S; ++s) {
    const ShardLayout::Location at = layout.locate(pos[s]);
    if (at.rank != comm.rank()) continue;
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(local + (b * rows + at.row) * width, width, &out[static_cast<size_t>((b * S + s) * width)]);
  }
  comm.allreduce(out.data(), out.size(), DataType::f32, ReduceOp::sum);
  return out;
}

// Max |got - ref| over the sampled rows this rank owns; ref is (B, S, width), got (B, rows, width).
double owned_error(comm::Communicator& comm, const ShardLayout& layout, const float* got, const double* ref,
                   int64_t B, int64_t rows, int64_t width, const std::vector<int64_t>& pos) {
  const int64_t S = static_cast<int64_t>(pos.size());
  double err = 0.0;
  for (int64_t s = 0; s < S; ++s) {
    const ShardLayout::Location at = layout.locate(pos[s]);
    if (at.rank != comm.rank()) continue;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < width; ++e) {
        const double g = got[(b * rows + at.row) * width + e], r = ref[(b * S + s) * width + e];
        if (std::isinf(r) && g == r) continue;  // both -inf: a row that sees no key
        err = std::max(err, std::isfinite(g) ? std::abs(g - r) : std::numeric_limits<double>::infinity());
      }
  }
  comm.allreduce(&err, 1, DataType::f64, ReduceOp::max);
  return err;
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x)
    if (std::isfinite(e)) m = std::max(m, std::abs(e));
  return m;
}

// kRelTol of the reference's size, plus the score rounding carried by terms of size `terms`
// (the sum of |terms| that make up each value: a value that cancels to ~0 keeps their rounding).
double tolerance(const std::vector<double>& ref, double terms, double max_abs_score) {
  return kRelTol * max_abs(ref) + kScoreRounding * max_abs_score * terms + kAbsTol;
}

}  // namespace

bool CheckReport::passed() const {
  bool ok = err_o <= tol_o && err_lse <= tol_lse;
  if (backward) ok = ok && err_dq <= tol_dq && err_dk <= tol_dk && err_dv <= tol_dv;
  return ok;
}

double CheckReport::max_abs_err() const {
  double m = std::max(err_o, err_lse);
  if (backward) m = std::max({m, err_dq, err_dk, err_dv});
  return m;
}

std::string CheckReport::describe() const {
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, "o %.2e (tol %.1e), lse %.2e (tol %.1e)", err_o, tol_o, err_lse, tol_lse);
  if (backward)
    std::snprintf(buf + n, sizeof buf - n, ", dq %.2e (tol %.1e), dk %.2e (tol %.1e), dv %.2e (tol %.1e)", err_dq,
                  tol_dq, err_dk, tol_dk, err_dv, tol_dv);
  return buf;
}

CheckReport check_sampled_rows(comm::Communicator& comm, const ShardLayout& layout, const Mask& mask,
                               const kernels::AttentionDims& dims, const CheckTensors& local, bool backward,
                               int samples, uint64_t seed) {
  const MaskView mv = mask.view();
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim;
  const int64_t rows = layout.rows(comm.rank());
  const std::vector<int64_t> local_pos = layout.positions(comm.rank());
  const std::vector<int64_t> pos = sample_positions(layout.seq_len(), samples, seed);
  const int64_t S = static_cast<int64_t>(pos.size());
  CheckReport rep;
  rep.samples = static_cast<int>(S);
  rep.backward = backward;

  // Forward: fp64 partial states of the sampled queries against this rank's keys, merged.
  const std::vector<float> qs = share_rows(comm, layout, local.q, B, rows, H * D, pos);
  std::vector<double> o(static_cast<size_t>(B * S * H * D)), lse(static_cast<size_t>(B * H * S));
  double max_score = 0.0;
  kernels::reference_forward(dims, qs.data(), pos.data(), S, local.k, local.v, local_pos.data(), rows, mv, o.data(),
                             lse.data(), &max_score);
  comm.allreduce(&max_score, 1, DataType::f64, ReduceOp::max);
  // O is a weighted mean of V rows: its terms are bounded by max |V|.
  double max_v = 0.0;
  for (int64_t e = 0; e < B * rows * Hkv * D; ++e) max_v = std::max(max_v, double(std::abs(local.v[e])));
  comm.allreduce(&max_v, 1, DataType::f64, ReduceOp::max);
  std::vector<double> m = lse;
  comm.allreduce(m.data(), m.size(), DataType::f64, ReduceOp::max);
  std::vector<double> weight(lse.size());
  for (size_t i = 0; i < lse.size(); ++i) weight[i] = std::isinf(m[i]) ? 0.0 : std::exp(lse[i] - m[i]);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(((b * S + s) * H + h) * D + d)] *= weight[static_cast<size_t>((b * H + h) * S + s)];
  comm.allreduce(o.data(), o.size(), DataType::f64, ReduceOp::sum);
  comm.allreduce(weight.data(), weight.size(), DataType::f64, ReduceOp::sum);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) {
        const size_t li = static_cast<size_t>((b * H + h) * S + s);
        const double w = weight[li];
        lse[li] = w > 0.0 ? m[li] + std::log(w) : -std::numeric_limits<double>::infinity();
        for (int64_t d = 0; d < D; ++d) {
          double& x = o[static_cast<size_t>(((b * S + s) * H + h) * D + d)];
          x = w > 0.0 ? x / w : 0.0;
        }
      }
  rep.err_o = owned_error(comm, layout, local.o, o.data(), B, rows, H * D, pos);
  rep.tol_o = tolerance(o, max_v, max_score);
  // LSE (B, H, rows) compared as (B*H, rows, 1).
  rep.err_lse = owned_error(comm, layout, local.lse, lse.data(), B * H, rows, 1, pos);
  rep.tol_lse = tolerance(lse, 1.0, max_score);
  if (!backward) return rep;

  // dQ of the sampled queries: fp64 gradients through this rank's keys, summed over ranks.
  const std::vector<float> dos = share_rows(comm, layout, local.dout, B, rows, H * D, pos);
  std::vector<double> delta(static_cast<size_t>(B * H * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        double acc = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          const size_t e = static_cast<size_t>(((b * S + s) * H + h) * D + d);
          acc += o[e] * double(dos[e]);
        }
        delta[static_cast<size_t>((b * H + h) * S + s)] = acc;
      }
  std::vector<double> dq(static_cast<size_t>(B * S * H * D), 0.0), dq_terms(dq.size(), 0.0);
  {
    const kernels::GradientMagnitudes terms{dq_terms.data(), nullptr, nullptr};
    kernels::reference_backward(dims, qs.data(), pos.data(), S, local.k, local.v, local_pos.data(), rows,
                                dos.data(), lse.data(), delta.data(), mv, dq.data(), nullptr, nullptr, &terms);
  }
  comm.allreduce(dq.data(), dq.size(), DataType::f64, ReduceOp::sum);
  comm.allreduce(dq_terms.data(), dq_terms.size(), DataType::f64, ReduceOp::sum);
  rep.err_dq = owned_error(comm, layout, local.dq, dq.data(), B, rows, H * D, pos);
  rep.tol_dq = tolerance(dq, max_abs(dq_terms), max_score);
  if (local.bf16_products) rep.tol_dq += kBf16Rounding * max_abs(dq_terms);

  // dK, dV of the sampled keys: every rank's queries contribute, with the run's LSE and delta.
  const std::vector<float> ks = share_rows(comm, layout, local.k, B, rows, Hkv * D, pos);
  const std::vector<float> vs = share_rows(comm, layout, local.v, B, rows, Hkv * D, pos);
  std::vector<double> my_lse(static_cast<size_t>(B * H * rows)), my_delta(my_lse.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < rows; ++i) {
        const size_t li = static_cast<size_t>((b * H + h) * rows + i);
        my_lse[li] = local.lse[li];
        double acc = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          const size_t e = static_cast<size_t>(((b * rows + i) * H + h) * D + d);
          acc += double(local.o[e]) * double(local.dout[e]);
        }
        my_delta[li] = acc;
      }
  std::vector<double> dk(static_cast<size_t>(B * S * Hkv * D), 0.0), dv(dk.size(), 0.0);
  std::vector<double> dk_terms(dk.size(), 0.0), dv_terms(dk.size(), 0.0);
  {
    const kernels::GradientMagnitudes terms{nullptr, dk_terms.data(), dv_terms.data()};
    kernels::reference_backward(dims, local.q, local_pos.data(), rows, ks.data(), vs.data(), pos.data(), S,
                                local.dout, my_lse.data(), my_delta.data(), mv, nullptr, dk.data(), dv.data(),
                                &terms);
  }
  for (std::vector<double>* x : {&dk, &dv, &dk_terms, &dv_terms})
    comm.allreduce(x->data(), x->size(), DataType::f64, ReduceOp::sum);
  rep.err_dk = owned_error(comm, layout, local.dk, dk.data(), B, rows, Hkv * D, pos);
  rep.err_dv = owned_error(comm, layout, local.dv, dv.data(), B, rows, Hkv * D, pos);
  rep.tol_dk = tolerance(dk, max_abs(dk_terms), max_score);
  if (local.bf16_products) rep.tol_dk += kBf16Rounding * max_abs(dk_terms);
  rep.tol_dv = tolerance(dv, max_abs(dv_terms), max_score);
  if (local.bf16_products) rep.tol_dv += kBf16Rounding * max_abs(dv_terms);
  return rep;
}

}  // namespace ringattn
