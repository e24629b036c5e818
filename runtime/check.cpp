#include "runtime/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "kernels/reference.hpp"
#include "kernels/sampled_check.hpp"

namespace ringattn {

namespace {

using comm::ReduceOp;
using kernels::add_deltas;
using kernels::keys_seen;
using kernels::RowStates;
using kernels::SamePrecision;
using kernels::TensorError;

// Rows of queries recomputed at once for the dK/dV reference (each chunk is shared with every rank).
constexpr int64_t kChunkRows = 256;
// The dK/dV reference recomputes fp64 LSE and delta within max(kRecomputeFactor x the forward
// check's multiply-adds, kRecomputeFloor).
constexpr double kRecomputeFactor = 16.0;
constexpr double kRecomputeFloor = double(int64_t{1} << 30);

std::vector<int64_t> sample_positions(int64_t L, int samples, uint64_t seed) {
  std::set<int64_t> s{0, L - 1};
  std::mt19937_64 gen(seed ^ 0xc0ffeeull);
  while (static_cast<int64_t>(s.size()) < std::min<int64_t>(samples, L)) s.insert(static_cast<int64_t>(gen() % L));
  return {s.begin(), s.end()};
}

// Every rank gets the rows at `pos` of a (B, rows, width) tensor: owners fill, the rest add zeros.
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
  comm.allreduce(out.data(), out.size(), DType::f32, ReduceOp::sum);
  return out;
}

// Merges every rank's partial state (O normalised over its keys, LSE) of S rows, in T arithmetic:
// the fp64 reference in double, the same-precision one in float, as the ring merges.
template <class T>
void merge_partial_states(comm::Communicator& comm, int64_t B, int64_t S, int64_t H, int64_t D, std::vector<T>& o,
                          std::vector<T>& lse) {
  const DType type = sizeof(T) == 8 ? DType::f64 : DType::f32;
  std::vector<T> m = lse;
  comm.allreduce(m.data(), m.size(), type, ReduceOp::max);
  std::vector<T> weight(lse.size());
  for (size_t i = 0; i < lse.size(); ++i) weight[i] = std::isinf(m[i]) ? T(0) : std::exp(lse[i] - m[i]);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(((b * S + s) * H + h) * D + d)] *= weight[static_cast<size_t>((b * H + h) * S + s)];
  comm.allreduce(o.data(), o.size(), type, ReduceOp::sum);
  comm.allreduce(weight.data(), weight.size(), type, ReduceOp::sum);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) {
        const size_t li = static_cast<size_t>((b * H + h) * S + s);
        const T w = weight[li];
        lse[li] = w > T(0) ? m[li] + std::log(w) : -std::numeric_limits<T>::infinity();
        for (int64_t d = 0; d < D; ++d) {
          T& x = o[static_cast<size_t>(((b * S + s) * H + h) * D + d)];
          x = w > T(0) ? x / w : T(0);
        }
      }
}

struct Shard {
  const ShardLayout& layout;
  const MaskView& mask;
  const kernels::AttentionDims& dims;
  const CheckTensors& local;
  std::vector<int64_t> positions;
  int64_t rows;
  SamePrecision precision;
};

// Forward results of shared query rows `qs` at `pos` over the whole sequence, in fp64 and in the
// same precision; every rank ends with both (max_score: over ranks).
RowStates forward_states(comm::Communicator& comm, const Shard& sh, const std::vector<float>& qs,
                         const std::vector<int64_t>& pos) {
  const int64_t B = sh.dims.batch, H = sh.dims.heads, D = sh.dims.head_dim, S = static_cast<int64_t>(pos.size());
  RowStates r;
  r.o.resize(static_cast<size_t>(B * S * H * D)), r.lse.resize(static_cast<size_t>(B * H * S));
  r.o32.resize(r.o.size()), r.lse32.resize(r.lse.size());
  kernels::reference_forward(sh.dims, qs.data(), pos.data(), S, sh.local.k, sh.local.v, sh.positions.data(), sh.rows,
                             sh.mask, r.o.data(), r.lse.data(), &r.max_score);
  comm.allreduce(&r.max_score, 1, DType::f64, ReduceOp::max);
  kernels::naive_forward_fp32(sh.dims, qs.data(), pos.data(), S, sh.local.k, sh.local.v, sh.positions.data(),
                              sh.rows, sh.mask, r.o32.data(), r.lse32.data(), sh.precision);
  merge_partial_states(comm, B, S, H, D, r.o, r.lse);
  merge_partial_states(comm, B, S, H, D, r.o32, r.lse32);
  return r;
}

// The rule's inputs over the rows at `pos` this rank owns, reduced over ranks; ref and same are
// (B, S, width), got (B, rows, width).
TensorError owned_error(comm::Communicator& comm, const ShardLayout& layout, const float* got, const double* ref,
                        const float* same, int64_t B, int64_t rows, int64_t width, const std::vector<int64_t>& pos) {
  const int64_t S = static_cast<int64_t>(pos.size());
  TensorError e;
  for (int64_t s = 0; s < S; ++s) {
    const ShardLayout::Location at = layout.locate(pos[s]);
    if (at.rank != comm.rank()) continue;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t x = 0; x < width; ++x) {
        const size_t i = static_cast<size_t>((b * S + s) * width + x);
        e.add(got[(b * rows + at.row) * width + x], same[i], ref[i]);
      }
  }
  double v[3] = {e.error, e.baseline, e.scale};
  comm.allreduce(v, 3, DType::f64, ReduceOp::max);
  e.error = v[0], e.baseline = v[1], e.scale = v[2];
  return e;
}

double max_of(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x) m = std::max(m, e);
  return m;
}

// dK, dV of the sampled keys at `keys` (B, K, Hkv, D), in fp64 and the same precision, summed over
// every query that sees them, their LSE and delta recomputed in chunks of kChunkRows queries
// (each chunk's rows shared, its states merged, then each rank takes every P-th row).
struct KeyGrads {
  std::vector<double> dk, dv, dk_terms, dv_terms;  // terms: the sums of |terms| (reference.hpp)
  std::vector<float> dk32, dv32;
};

KeyGrads recomputed_key_grads(comm::Communicator& comm, const Shard& sh, const std::vector<int64_t>& keys,
                              const std::vector<float>& ks, const std::vector<float>& vs) {
  const int64_t B = sh.dims.batch, H = sh.dims.heads, Hkv = sh.dims.kv_heads, D = sh.dims.head_dim;
  const int64_t L = sh.layout.seq_len(), K = static_cast<int64_t>(keys.size());
  KeyGrads g;
  g.dk.assign(static_cast<size_t>(B * K * Hkv * D), 0.0), g.dv.assign(g.dk.size(), 0.0);
  g.dk32.assign(g.dk.size(), 0.0f), g.dv32.assign(g.dk.size(), 0.0f);
  g.dk_terms.assign(g.dk.size(), 0.0), g.dv_terms.assign(g.dk.size(), 0.0);
  const kernels::GradientMagnitudes terms{nullptr, g.dk_terms.data(), g.dv_terms.data()};
  // The queries that see any of the keys: a union of intervals.
  std::vector<PosRange> spans;
  for (int64_t j : keys) {
    const PosRange r = query_range(sh.mask, j);
    if (std::max<int64_t>(r.lo, 0) <= std::min(r.hi, L - 1)) spans.push_back({std::max<int64_t>(r.lo, 0), std::min(r.hi, L - 1)});
  }
  std::sort(spans.begin(), spans.end(), [](PosRange a, PosRange b) { return a.lo < b.lo; });
  std::vector<int64_t> chunk;
  size_t next_span = 0;
  int64_t next = spans.empty() ? 0 : spans[0].lo;
  auto fill_chunk = [&] {
    chunk.clear();
    while (next_span < spans.size() && static_cast<int64_t>(chunk.size()) < kChunkRows) {
      if (next > spans[next_span].hi) {
        if (++next_span < spans.size()) next = std::max(next, spans[next_span].lo);
        continue;
      }
      chunk.push_back(next++);
    }
  };
  // Every rank walks the same chunks (the spans are computed alike everywhere).
  for (fill_chunk(); !chunk.empty(); fill_chunk()) {
    const int64_t C = static_cast<int64_t>(chunk.size());
    const std::vector<float> qc = share_rows(comm, sh.layout, sh.local.q, B, sh.rows, H * D, chunk);
    const std::vector<float> dc = share_rows(comm, sh.layout, sh.local.dout, B, sh.rows, H * D, chunk);
    RowStates st = forward_states(comm, sh, qc, chunk);
    add_deltas(sh.dims, C, dc, st, sh.precision);
    // This rank's share of the chunk's rows, packed.
    std::vector<int64_t> mine;
    for (int64_t c = comm.rank(); c < C; c += comm.size()) mine.push_back(c);
    const int64_t n = static_cast<int64_t>(mine.size());
    if (n == 0) continue;
    std::vector<int64_t> p(static_cast<size_t>(n));
    std::vector<float> q(static_cast<size_t>(B * n * H * D)), d(q.size()), lse32(static_cast<size_t>(B * H * n)),
        delta32(lse32.size());
    std::vector<double> lse(lse32.size()), delta(lse32.size());
    for (int64_t t = 0; t < n; ++t) {
      const int64_t c = mine[static_cast<size_t>(t)];
      p[static_cast<size_t>(t)] = chunk[static_cast<size_t>(c)];
      for (int64_t b = 0; b < B; ++b) {
        std::copy_n(&qc[static_cast<size_t>((b * C + c) * H * D)], H * D, &q[static_cast<size_t>((b * n + t) * H * D)]);
        std::copy_n(&dc[static_cast<size_t>((b * C + c) * H * D)], H * D, &d[static_cast<size_t>((b * n + t) * H * D)]);
        for (int64_t h = 0; h < H; ++h) {
          const size_t from = static_cast<size_t>((b * H + h) * C + c), to = static_cast<size_t>((b * H + h) * n + t);
          lse[to] = st.lse[from], delta[to] = st.delta[from];
          lse32[to] = st.lse32[from], delta32[to] = st.delta32[from];
        }
      }
    }
    kernels::reference_backward(sh.dims, q.data(), p.data(), n, ks.data(), vs.data(), keys.data(), K, d.data(),
                                lse.data(), delta.data(), sh.mask, nullptr, g.dk.data(), g.dv.data(), &terms);
    kernels::naive_backward_fp32(sh.dims, q.data(), p.data(), n, ks.data(), vs.data(), keys.data(), K, d.data(),
                                 lse32.data(), delta32.data(), sh.mask, nullptr, g.dk32.data(), g.dv32.data(),
                                 sh.precision);
  }
  return g;
}

// The same sums over this rank's own queries with the run's LSE and delta (for keys seen by more
// queries than the check recomputes).
KeyGrads run_lse_key_grads(const Shard& sh, const std::vector<int64_t>& keys, const std::vector<float>& ks,
                           const std::vector<float>& vs) {
  const int64_t B = sh.dims.batch, H = sh.dims.heads, Hkv = sh.dims.kv_heads, D = sh.dims.head_dim;
  const int64_t K = static_cast<int64_t>(keys.size()), rows = sh.rows;
  KeyGrads g;
  g.dk.assign(static_cast<size_t>(B * K * Hkv * D), 0.0), g.dv.assign(g.dk.size(), 0.0);
  g.dk32.assign(g.dk.size(), 0.0f), g.dv32.assign(g.dk.size(), 0.0f);
  g.dk_terms.assign(g.dk.size(), 0.0), g.dv_terms.assign(g.dk.size(), 0.0);
  const kernels::GradientMagnitudes terms{nullptr, g.dk_terms.data(), g.dv_terms.data()};
  std::vector<double> lse(static_cast<size_t>(B * H * rows)), delta(lse.size());
  std::vector<float> delta32(lse.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < rows; ++i) {
        const size_t li = static_cast<size_t>((b * H + h) * rows + i);
        lse[li] = sh.local.lse[li];
        double acc = 0.0;
        float acc32 = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
          const size_t e = static_cast<size_t>(((b * rows + i) * H + h) * D + d);
          acc += double(sh.local.o[e]) * double(sh.local.dout[e]);
          const float o = sh.precision.backward_step_outputs ? bf16_to_float(float_to_bf16(sh.local.o[e])) : sh.local.o[e];
          acc32 += o * sh.local.dout[e];
        }
        delta[li] = acc, delta32[li] = acc32;
      }
  kernels::reference_backward(sh.dims, sh.local.q, sh.positions.data(), rows, ks.data(), vs.data(), keys.data(), K,
                              sh.local.dout, lse.data(), delta.data(), sh.mask, nullptr, g.dk.data(), g.dv.data(),
                              &terms);
  kernels::naive_backward_fp32(sh.dims, sh.local.q, sh.positions.data(), rows, ks.data(), vs.data(), keys.data(), K,
                               sh.local.dout, sh.local.lse, delta32.data(), sh.mask, nullptr, g.dk32.data(),
                               g.dv32.data(), sh.precision);
  return g;
}

}  // namespace

bool CheckReport::passed() const { return wrong() == 0; }

int CheckReport::wrong() const {
  int n = !o.passed() + !lse.passed();
  if (backward) n += !dq.passed() + !dk.passed() + !dv.passed();
  return n;
}

double CheckReport::max_abs_err() const {
  double m = std::max(o.error, lse.error);
  if (backward) m = std::max({m, dq.error, dk.error, dv.error});
  return m;
}

std::string CheckReport::describe() const {
  std::string out;
  auto one = [&](const char* name, const TensorError& e) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.2e (bound %.1e)", out.empty() ? "" : ", ", name, e.error, e.bound());
    out += buf;
  };
  one("o", o), one("lse", lse);
  if (backward) {
    one("dq", dq), one("dk", dk), one("dv", dv);
    char buf[96];
    std::snprintf(buf, sizeof buf, "; dk, dv of %d keys, %d with fp64 LSE", samples, keys_recomputed);
    out += buf;
  }
  return out;
}

CheckReport check_sampled_rows(comm::Communicator& comm, const ShardLayout& layout, const Mask& mask,
                               const kernels::AttentionDims& dims, const CheckTensors& local, bool backward,
                               int samples, uint64_t seed, SamePrecision precision) {
  const MaskView mv = mask.view();
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim, L = layout.seq_len();
  const Shard sh{layout, mv, dims, local, layout.positions(comm.rank()), layout.rows(comm.rank()), precision};
  const int64_t rows = sh.rows;
  const std::vector<int64_t> pos = sample_positions(L, samples, seed);
  const int64_t S = static_cast<int64_t>(pos.size());
  CheckReport rep;
  rep.samples = static_cast<int>(S);
  rep.backward = backward;

  // Forward: partial states of the sampled queries against this rank's keys, merged.
  const std::vector<float> qs = share_rows(comm, layout, local.q, B, rows, H * D, pos);
  RowStates st = forward_states(comm, sh, qs, pos);
  rep.o = owned_error(comm, layout, local.o, st.o.data(), st.o32.data(), B, rows, H * D, pos);
  // LSE (B, H, rows) compared as (B*H, rows, 1).
  rep.lse = owned_error(comm, layout, local.lse, st.lse.data(), st.lse32.data(), B * H, rows, 1, pos);
  // Score rounding: O averages V rows (terms up to max |V|); LSE carries it once.
  double max_v = 0.0;
  for (int64_t e = 0; e < B * rows * Hkv * D; ++e) max_v = std::max(max_v, double(std::abs(local.v[e])));
  comm.allreduce(&max_v, 1, DType::f64, ReduceOp::max);
  const double score_rounding = kernels::kScoreRounding * st.max_score;
  rep.o.rounding = score_rounding * max_v, rep.lse.rounding = score_rounding;
  if (!backward) return rep;

  // dQ of the sampled queries: gradients through this rank's keys, summed over ranks.
  const std::vector<float> dos = share_rows(comm, layout, local.dout, B, rows, H * D, pos);
  add_deltas(dims, S, dos, st, precision);
  std::vector<double> dq(static_cast<size_t>(B * S * H * D), 0.0), dq_terms(dq.size(), 0.0);
  std::vector<float> dq32(dq.size(), 0.0f);
  const kernels::GradientMagnitudes terms{dq_terms.data(), nullptr, nullptr};
  kernels::reference_backward(dims, qs.data(), pos.data(), S, local.k, local.v, sh.positions.data(), rows, dos.data(),
                              st.lse.data(), st.delta.data(), mv, dq.data(), nullptr, nullptr, &terms);
  kernels::naive_backward_fp32(dims, qs.data(), pos.data(), S, local.k, local.v, sh.positions.data(), rows,
                               dos.data(), st.lse32.data(), st.delta32.data(), mv, dq32.data(), nullptr, nullptr,
                               precision);
  comm.allreduce(dq.data(), dq.size(), DType::f64, ReduceOp::sum);
  comm.allreduce(dq32.data(), dq32.size(), DType::f32, ReduceOp::sum);
  comm.allreduce(dq_terms.data(), dq_terms.size(), DType::f64, ReduceOp::sum);
  rep.dq = owned_error(comm, layout, local.dq, dq.data(), dq32.data(), B, rows, H * D, pos);
  rep.dq.rounding = score_rounding * max_of(dq_terms);

  // dK, dV of the sampled keys. Those whose queries' LSE the budget allows to recompute, cheapest
  // first (the cost of a key: the keys seen by each query that sees it).
  double forward_pairs = 0.0;
  for (int64_t i : pos) forward_pairs += double(keys_seen(mv, i, L));
  const double budget = std::max(kRecomputeFactor * forward_pairs, kRecomputeFloor / double(B * H * D));
  const kernels::KeySplit split = kernels::split_keys_by_cost(mv, L, pos, budget, 1.0);  // budget in pairs
  rep.keys_recomputed = static_cast<int>(split.recomputed.size());
  auto judge = [&](const std::vector<int64_t>& keys, bool recompute) {
    if (keys.empty()) return;
    const std::vector<float> ks = share_rows(comm, layout, local.k, B, rows, Hkv * D, keys);
    const std::vector<float> vs = share_rows(comm, layout, local.v, B, rows, Hkv * D, keys);
    KeyGrads g = recompute ? recomputed_key_grads(comm, sh, keys, ks, vs) : run_lse_key_grads(sh, keys, ks, vs);
    for (std::vector<double>* x : {&g.dk, &g.dv, &g.dk_terms, &g.dv_terms}) comm.allreduce(x->data(), x->size(), DType::f64, ReduceOp::sum);
    for (std::vector<float>* x : {&g.dk32, &g.dv32}) comm.allreduce(x->data(), x->size(), DType::f32, ReduceOp::sum);
    TensorError dk = owned_error(comm, layout, local.dk, g.dk.data(), g.dk32.data(), B, rows, Hkv * D, keys);
    TensorError dv = owned_error(comm, layout, local.dv, g.dv.data(), g.dv32.data(), B, rows, Hkv * D, keys);
    dk.rounding = score_rounding * max_of(g.dk_terms), dv.rounding = score_rounding * max_of(g.dv_terms);
    rep.dk.merge(dk), rep.dv.merge(dv);
  };
  judge(split.recomputed, true);
  judge(split.trusted, false);
  return rep;
}

}  // namespace ringattn
