#include "tests/runtime/lora/lora_reference.hpp"

#include <cmath>
#include <limits>

namespace ringattn::testing {

namespace {

// c (n, m) = op(a) op(b) with op(a) (n, k) and op(b) (k, m); a transposed operand is stored
// as its transpose: a (k, n), b (m, k).
std::vector<double> matmul(const std::vector<double>& a, bool ta, const std::vector<double>& b, bool tb, int64_t n,
                           int64_t k, int64_t m) {
  std::vector<double> c(size_t(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < k; ++t) {
      const double x = ta ? a[size_t(t * n + i)] : a[size_t(i * k + t)];
      for (int64_t j = 0; j < m; ++j) c[size_t(i * m + j)] += x * (tb ? b[size_t(j * k + t)] : b[size_t(t * m + j)]);
    }
  return c;
}
// The three products the layer needs: a b^T (y = x W^T), a b, and a^T b (weight gradients).
std::vector<double> times_transposed(const std::vector<double>& a, const std::vector<double>& b, int64_t n, int64_t k,
                                     int64_t m) {
  return matmul(a, false, b, true, n, k, m);
}
std::vector<double> times(const std::vector<double>& a, const std::vector<double>& b, int64_t n, int64_t k, int64_t m) {
  return matmul(a, false, b, false, n, k, m);
}
// c (k, m) = a^T b for a (n, k), b (n, m).
std::vector<double> transposed_times(const std::vector<double>& a, const std::vector<double>& b, int64_t n, int64_t k,
                                     int64_t m) {
  return matmul(a, true, b, false, k, n, m);
}

// Rotates t (B, L, heads, D) in place by each row's angles: position x theta^(-2i / rd) for plane i;
// by the opposite angles when `inverse` (the transpose, for gradients).
void rotate(const RefLayer& l, std::vector<double>& t, int64_t heads, bool inverse) {
  if (l.rope_theta == 0.0) return;
  const int64_t D = l.head_dim(), rd = l.rope_dims ? l.rope_dims : D, half = rd / 2;
  for (int64_t b = 0; b < l.batch; ++b)
    for (int64_t i = 0; i < l.seq_len; ++i) {
      int64_t pos = i;
      if (l.rope_per_document)
        for (int64_t start : l.doc_offsets)
          if (start <= i) pos = i - start;
      for (int64_t h = 0; h < heads; ++h) {
        double* v = &t[size_t(((b * l.seq_len + i) * heads + h) * D)];
        for (int64_t j = 0; j < half; ++j) {
          const double angle = (inverse ? -1.0 : 1.0) * double(pos) * std::pow(l.rope_theta, -2.0 * double(j) / double(rd));
          const int64_t first = l.rope_interleaved ? 2 * j : j, second = l.rope_interleaved ? 2 * j + 1 : j + half;
          const double x1 = v[first], x2 = v[second];
          v[first] = x1 * std::cos(angle) - x2 * std::sin(angle);
          v[second] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
      }
    }
}

// Adds bias (width,) to every row of t (rows, width); no-op when empty.
void add_bias(std::vector<double>& t, const std::vector<double>& bias) {
  if (bias.empty()) return;
  for (size_t i = 0; i < t.size(); ++i) t[i] += bias[i % bias.size()];
}

struct Activations {
  std::vector<double> q, k, v, o, p;  // p: softmax probabilities (B, H, L, L), 0 where masked
};

Activations attention_forward(const RefLayer& l, const std::vector<double>& x) {
  const int64_t B = l.batch, L = l.seq_len, d = l.d_model, H = l.heads, Hkv = l.kv_heads, D = l.head_dim();
  const double scale = 1.0 / std::sqrt(double(D));
  Activations a;
  a.q = times_transposed(x, l.effective(0), B * L, d, H * D);
  a.k = times_transposed(x, l.effective(1), B * L, d, Hkv * D);
  a.v = times_transposed(x, l.effective(2), B * L, d, Hkv * D);
  add_bias(a.q, l.bias[0]);
  add_bias(a.k, l.bias[1]);
  add_bias(a.v, l.bias[2]);
  rotate(l, a.q, H, false);
  rotate(l, a.k, Hkv, false);
  a.o.assign(size_t(B * L * H * D), 0.0);
  a.p.assign(size_t(B * H * L * L), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < L; ++i) {
        double* p = &a.p[size_t(((b * H + h) * L + i) * L)];
        double top = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < L; ++j) {
          if (!visible(l.mask, i, j)) continue;
          double s = 0;
          for (int64_t e = 0; e < D; ++e)
            s += a.q[size_t(((b * L + i) * H + h) * D + e)] * a.k[size_t(((b * L + j) * Hkv + g) * D + e)];
          p[j] = scale * s;
          top = std::max(top, p[j]);
        }
        if (top == -std::numeric_limits<double>::infinity()) continue;  // sees no key: O = 0
        double sum = 0;
        for (int64_t j = 0; j < L; ++j)
          if (visible(l.mask, i, j)) sum += (p[j] = std::exp(p[j] - top));
        for (int64_t j = 0; j < L; ++j) {
          if (!visible(l.mask, i, j)) continue;
          p[j] /= sum;
          for (int64_t e = 0; e < D; ++e)
            a.o[size_t(((b * L + i) * H + h) * D + e)] += p[j] * a.v[size_t(((b * L + j) * Hkv + g) * D + e)];
        }
      }
    }
  return a;
}

}  // namespace

std::vector<double> RefLayer::effective(int p) const {
  const RefProjection& r = proj[size_t(p)];
  std::vector<double> w = r.w0;
  if (r.rank == 0) return w;
  const std::vector<double> ba = times(r.b, r.a, r.out, r.rank, r.in);
  for (size_t i = 0; i < w.size(); ++i) w[i] += scaling * ba[i];
  return w;
}

std::vector<double> reference_layer_forward(const RefLayer& l, const std::vector<double>& x) {
  const Activations a = attention_forward(l, x);
  std::vector<double> y = times_transposed(a.o, l.effective(3), l.batch * l.seq_len, l.heads * l.head_dim(), l.d_model);
  add_bias(y, l.bias[3]);
  return y;
}

RefGrads reference_layer_backward(const RefLayer& l, const std::vector<double>& x, const std::vector<double>& dy) {
  const int64_t B = l.batch, L = l.seq_len, d = l.d_model, H = l.heads, Hkv = l.kv_heads, D = l.head_dim();
  const int64_t N = B * L;
  const double scale = 1.0 / std::sqrt(double(D));
  const Activations a = attention_forward(l, x);
  std::array<std::vector<double>, 4> dw;  // full weight gradients (out, in)
  dw[3] = transposed_times(dy, a.o, N, d, H * D);
  const std::vector<double> d_o = times(dy, l.effective(3), N, d, H * D);
  std::vector<double> dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < L; ++i) {
        const double* p = &a.p[size_t(((b * H + h) * L + i) * L)];
        const double* doi = &d_o[size_t(((b * L + i) * H + h) * D)];
        std::vector<double> dp(size_t(L), 0.0);
        double row = 0;
        for (int64_t j = 0; j < L; ++j) {
          if (p[j] == 0.0) continue;
          for (int64_t e = 0; e < D; ++e) dp[size_t(j)] += doi[e] * a.v[size_t(((b * L + j) * Hkv + g) * D + e)];
          row += p[j] * dp[size_t(j)];
        }
        for (int64_t j = 0; j < L; ++j) {
          if (p[j] == 0.0) continue;
          const double ds = p[j] * (dp[size_t(j)] - row) * scale;
          for (int64_t e = 0; e < D; ++e) {
            const size_t qi = size_t(((b * L + i) * H + h) * D + e), kj = size_t(((b * L + j) * Hkv + g) * D + e);
            dq[qi] += ds * a.k[kj];
            dk[kj] += ds * a.q[qi];
            dv[kj] += p[j] * doi[e];
          }
        }
      }
    }
  rotate(l, dq, H, true);  // gradients of the rotated q, k -> of the projections' outputs
  rotate(l, dk, Hkv, true);
  dw[0] = transposed_times(dq, x, N, H * D, d);
  dw[1] = transposed_times(dk, x, N, Hkv * D, d);
  dw[2] = transposed_times(dv, x, N, Hkv * D, d);
  RefGrads g;
  g.dx = times(dq, l.effective(0), N, H * D, d);
  const std::vector<double> dxk = times(dk, l.effective(1), N, Hkv * D, d);
  const std::vector<double> dxv = times(dv, l.effective(2), N, Hkv * D, d);
  for (size_t i = 0; i < g.dx.size(); ++i) g.dx[i] += dxk[i] + dxv[i];
  for (int p = 0; p < 4; ++p) {
    const RefProjection& r = l.proj[size_t(p)];
    if (r.rank == 0) continue;
    // dA = s B^T dW (rank, in); dB = s dW A^T (out, rank).
    g.da[size_t(p)] = transposed_times(r.b, dw[size_t(p)], r.out, r.rank, r.in);
    g.db[size_t(p)] = times_transposed(dw[size_t(p)], r.a, r.out, r.in, r.rank);
    for (double& v : g.da[size_t(p)]) v *= l.scaling;
    for (double& v : g.db[size_t(p)]) v *= l.scaling;
  }
  return g;
}

void reference_step(RefLayer& layer, const RefGrads& g, RefOptimizer kind, double lr, double weight_decay) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto update = [&](std::vector<double>& w, const std::vector<double>& grad) {
    for (size_t i = 0; i < w.size(); ++i) {
      if (kind == RefOptimizer::sgd) {
        w[i] -= lr * grad[i];
        continue;
      }
      const double m = (1 - b1) * grad[i], v = (1 - b2) * grad[i] * grad[i];  // from zero state, step 1
      w[i] *= 1 - lr * weight_decay;
      w[i] -= lr * (m / (1 - b1)) / (std::sqrt(v / (1 - b2)) + eps);
    }
  };
  for (int p = 0; p < 4; ++p) {
    RefProjection& r = layer.proj[size_t(p)];
    if (r.rank == 0) continue;
    update(r.a, g.da[size_t(p)]);
    update(r.b, g.db[size_t(p)]);
  }
}

}  // namespace ringattn::testing
