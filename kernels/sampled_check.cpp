#include "kernels/sampled_check.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace ringattn::kernels {

namespace {

// Rows `at` of a (B, L, width) tensor, as (B, S, width).
std::vector<float> gather(const float* x, int64_t B, int64_t L, int64_t width, const std::vector<int64_t>& at) {
  const int64_t S = static_cast<int64_t>(at.size());
  std::vector<float> out(static_cast<size_t>(B * S * width));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      std::copy_n(x + (b * L + at[static_cast<size_t>(s)]) * width, width, &out[static_cast<size_t>((b * S + s) * width)]);
  return out;
}

// Compares rows `at` of got (B, L, width) with ref and same (B, S, width).
void compare(TensorError& e, const float* got, const double* ref, const float* same, int64_t B, int64_t L,
             int64_t width, const std::vector<int64_t>& at) {
  const int64_t S = static_cast<int64_t>(at.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t x = 0; x < width; ++x) {
        const size_t i = static_cast<size_t>((b * S + s) * width + x);
        e.add(got[(b * L + at[static_cast<size_t>(s)]) * width + x], same[i], ref[i]);
      }
}

// Forward states of rows at positions `at` in both precisions, and delta when dO is given.
RowStates forward(const WholeProblem& p, const std::vector<float>& qs, const std::vector<float>& ds,
               const std::vector<int64_t>& at, const std::vector<int64_t>& all) {
  const int64_t B = p.dims.batch, H = p.dims.heads, D = p.dims.head_dim, S = static_cast<int64_t>(at.size());
  RowStates st;
  st.o.resize(static_cast<size_t>(B * S * H * D)), st.lse.resize(static_cast<size_t>(B * H * S));
  st.o32.resize(st.o.size()), st.lse32.resize(st.lse.size());
  reference_forward(p.dims, qs.data(), at.data(), S, p.k, p.v, all.data(), p.seq_len, p.mask, st.o.data(),
                    st.lse.data());
  naive_forward_fp32(p.dims, qs.data(), at.data(), S, p.k, p.v, all.data(), p.seq_len, p.mask, st.o32.data(),
                     st.lse32.data(), p.precision);
  if (!ds.empty()) add_deltas(p.dims, S, ds, st, p.precision);
  return st;
}

}  // namespace

void add_deltas(const AttentionDims& dims, int64_t S, const std::vector<float>& dout, RowStates& st,
                SamePrecision precision) {
  const int64_t B = dims.batch, H = dims.heads, D = dims.head_dim;
  st.delta.assign(static_cast<size_t>(B * H * S), 0.0), st.delta32.assign(st.delta.size(), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        double acc = 0.0;
        float acc32 = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
          const size_t e = static_cast<size_t>(((b * S + s) * H + h) * D + d);
          acc += st.o[e] * double(dout[e]);
          acc32 += (precision.backward_step_outputs ? bf16_to_float(float_to_bf16(st.o32[e])) : st.o32[e]) * dout[e];
        }
        st.delta[static_cast<size_t>((b * H + h) * S + s)] = acc;
        st.delta32[static_cast<size_t>((b * H + h) * S + s)] = acc32;
      }
}

int64_t keys_seen(const MaskView& mask, int64_t i, int64_t L) {
  const PosRange r = key_range(mask, i);
  return std::max<int64_t>(0, std::min(r.hi, L - 1) - std::max<int64_t>(r.lo, 0) + 1);
}

KeySplit split_keys_by_cost(const MaskView& mask, int64_t L, const std::vector<int64_t>& keys, double budget,
                            double pair_cost) {
  std::vector<std::pair<double, int64_t>> cost;
  for (int64_t j : keys) {
    const PosRange r = query_range(mask, j);
    double c = 0.0;  // stops once over the budget: such a key is not recomputed anyway
    for (int64_t i = std::max<int64_t>(r.lo, 0); i <= std::min(r.hi, L - 1) && c <= budget; ++i)
      c += double(keys_seen(mask, i, L)) * pair_cost;
    cost.emplace_back(c, j);
  }
  std::sort(cost.begin(), cost.end());
  KeySplit split;
  double spent = 0.0;
  for (const auto& [c, j] : cost) {
    if (spent + c <= budget) spent += c, split.recomputed.push_back(j);
    else split.trusted.push_back(j);
  }
  std::sort(split.recomputed.begin(), split.recomputed.end());
  std::sort(split.trusted.begin(), split.trusted.end());
  return split;
}

SampledErrors check_sampled_rows(const WholeProblem& p, const KernelResults& got, const std::vector<int64_t>& sample) {
  const int64_t B = p.dims.batch, H = p.dims.heads, Hkv = p.dims.kv_heads, D = p.dims.head_dim, L = p.seq_len;
  const int64_t S = static_cast<int64_t>(sample.size());
  std::vector<int64_t> all(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) all[static_cast<size_t>(i)] = i;
  SampledErrors r;
  const bool backward = got.dq && p.dout;
  const std::vector<float> qs = gather(p.q, B, L, H * D, sample);
  const std::vector<float> ds = backward ? gather(p.dout, B, L, H * D, sample) : std::vector<float>();
  const RowStates st = forward(p, qs, ds, sample, all);
  compare(r.o, got.o, st.o.data(), st.o32.data(), B, L, H * D, sample);
  compare(r.lse, got.lse, st.lse.data(), st.lse32.data(), B * H, L, 1, sample);  // (B, H, L) as (B*H, L, 1)
  if (!backward) return r;

  std::vector<double> dq(static_cast<size_t>(B * S * H * D), 0.0);
  std::vector<float> dq32(dq.size(), 0.0f);
  reference_backward(p.dims, qs.data(), sample.data(), S, p.k, p.v, all.data(), L, ds.data(), st.lse.data(),
                     st.delta.data(), p.mask, dq.data(), nullptr, nullptr);
  naive_backward_fp32(p.dims, qs.data(), sample.data(), S, p.k, p.v, all.data(), L, ds.data(), st.lse32.data(),
                      st.delta32.data(), p.mask, dq32.data(), nullptr, nullptr, p.precision);
  compare(r.dq, got.dq, dq.data(), dq32.data(), B, L, H * D, sample);

  // dK, dV: the keys whose queries' LSE fits the budget (multiply-adds), cheapest first, with fp64
  // LSE and delta.
  const KeySplit split = split_keys_by_cost(p.mask, L, sample, kRecomputeMacs, double(B * H * D));
  r.keys_recomputed = static_cast<int>(split.recomputed.size());
  auto judge = [&](const std::vector<int64_t>& keys, bool recompute) {
    if (keys.empty()) return;
    const int64_t K = static_cast<int64_t>(keys.size());
    const std::vector<float> ks = gather(p.k, B, L, Hkv * D, keys), vs = gather(p.v, B, L, Hkv * D, keys);
    std::vector<double> dk(static_cast<size_t>(B * K * Hkv * D), 0.0), dv(dk.size(), 0.0);
    std::vector<float> dk32(dk.size(), 0.0f), dv32(dk.size(), 0.0f);
    std::vector<int64_t> users;  // the queries that see any of the keys
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j : keys)
        if (visible(p.mask, i, j)) {
          users.push_back(i);
          break;
        }
    if (users.empty()) return;
    const int64_t U = static_cast<int64_t>(users.size());
    const std::vector<float> qu = gather(p.q, B, L, H * D, users), du = gather(p.dout, B, L, H * D, users);
    RowStates su;
    if (recompute) {
      su = forward(p, qu, du, users, all);
    } else {  // the kernel's LSE, and delta from its O
      su.lse.resize(static_cast<size_t>(B * H * U)), su.lse32.resize(su.lse.size());
      su.delta.assign(su.lse.size(), 0.0), su.delta32.assign(su.lse.size(), 0.0f);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t u = 0; u < U; ++u) {
            const int64_t i = users[static_cast<size_t>(u)];
            const size_t li = static_cast<size_t>((b * H + h) * U + u);
            su.lse32[li] = got.lse[(b * H + h) * L + i], su.lse[li] = su.lse32[li];
            for (int64_t d = 0; d < D; ++d) {
              const int64_t e = ((b * L + i) * H + h) * D + d;
              su.delta[li] += double(got.o[e]) * double(p.dout[e]);
              su.delta32[li] += got.o[e] * p.dout[e];
            }
          }
    }
    reference_backward(p.dims, qu.data(), users.data(), U, ks.data(), vs.data(), keys.data(), K, du.data(),
                       su.lse.data(), su.delta.data(), p.mask, nullptr, dk.data(), dv.data());
    naive_backward_fp32(p.dims, qu.data(), users.data(), U, ks.data(), vs.data(), keys.data(), K, du.data(),
                        su.lse32.data(), su.delta32.data(), p.mask, nullptr, dk32.data(), dv32.data(), p.precision);
    compare(r.dk, got.dk, dk.data(), dk32.data(), B, L, Hkv * D, keys);
    compare(r.dv, got.dv, dv.data(), dv32.data(), B, L, Hkv * D, keys);
  };
  judge(split.recomputed, true);
  judge(split.trusted, false);
  return r;
}

}  // namespace ringattn::kernels
