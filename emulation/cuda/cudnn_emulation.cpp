// cuDNN's fused attention on the CPU emulation of CUDA (kernels/cudnn/sdpa_engine.hpp): each call
// computed on the host, with cuDNN's own conventions rather than our kernels' — the keep-predicate
// of its diagonal band, padding mask, ragged offsets and tile mask (cudnn-frontend's reference,
// test/python/sdpa/fp16_ref.py), P rounded to bf16 before P V and dS, P before their products (its
// tensor cores), O, dQ, dK, dV written in bf16, Stats the natural-log LSE in fp32, the backward's
// delta from O in bf16 — and with the checks cudnn-frontend's validation makes of the attributes,
// so that the emulated build runs the ring's cuDNN path (--kernel cudnn) end to end.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/cudnn/sdpa_engine.hpp"

namespace ringattn::kernels::cudnn {
namespace {

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// Where sequence n's row r of a (rows of `width` elements) tensor starts, and its lengths.
struct Sequence {
  int64_t q_base, k_base;  // element offsets of rows 0
  int64_t len_q, len_kv;
};

Sequence sequence(const SdpaGraphShape& g, int64_t n, const int32_t* seq_q, const int32_t* seq_kv,
                  const int32_t* ragged_q, const int32_t* ragged_kv) {
  Sequence s;
  const int64_t q_row = g.heads * g.head_dim, k_row = g.kv_heads * g.head_dim;
  s.q_base = g.ragged ? ragged_q[n] : n * (g.q_rows ? g.q_rows : g.s_q) * q_row;
  s.k_base = g.ragged ? ragged_kv[n] : n * (g.k_rows ? g.k_rows : g.s_kv) * k_row;
  s.len_q = g.padding ? seq_q[n] : g.s_q;
  s.len_kv = g.padding ? seq_kv[n] : g.s_kv;
  return s;
}

// The keep-predicate (fp16_ref.py): right bound R keeps c <= r + shift + R, left bound W keeps
// c > r + shift - W, shift = s_kv - s_q of the sequence (bottom-right) or 0; the tile mask's bit
// (c / 128) % 8 of byte (c / 128) / 8 in tile row r / 128.
bool keeps(const SdpaGraphShape& g, const Sequence& s, const uint8_t* tiles, int64_t r, int64_t c) {
  const int64_t shift = g.alignment == DiagonalAlignment::bottom_right ? s.len_kv - s.len_q : 0;
  if (g.right_bound >= 0 && c > r + shift + g.right_bound) return false;
  if (g.left_bound >= 0 && c <= r + shift - g.left_bound) return false;
  if (g.tiles_q > 0) {
    const int64_t bytes = (g.tiles_k + 7) / 8, tc = c / kMaskTile;
    if (!((tiles[(r / kMaskTile) * bytes + tc / 8] >> (tc % 8)) & 1)) return false;
  }
  return true;
}

[[noreturn]] void refuse(const SdpaGraphShape& g, const std::string& why) {
  throw std::invalid_argument("cuDNN (emulated): " + g.describe() + ": " + why);
}

// The attribute checks of cudnn-frontend 1.32's SDPA validation that the planner must respect.
void validate(const SdpaGraphShape& g) {
  if (g.dtype != DType::bf16) refuse(g, "the stand-in runs bf16 only");
  if (g.s_q == 1 && g.s_kv == 1) refuse(g, "s_q = s_kv = 1 is not supported");
  if (g.head_dim % 8 != 0 || g.head_dim > 256) refuse(g, "hidden_dim must be a multiple of 8, at most 256");
  if (g.heads % g.kv_heads != 0) refuse(g, "query heads must be a multiple of key heads");
  if (g.left_bound == 0 || g.left_bound < -1) refuse(g, "left bound must be at least 1");
  if (g.right_bound < -1) refuse(g, "right bound must be at least 0");
  if (g.ragged && !g.padding) refuse(g, "ragged offsets are only supported with padding mask");
  if (!g.padding && g.s_q > g.s_kv &&
      (g.left_bound >= 0 || (g.right_bound >= 0 && g.alignment == DiagonalAlignment::bottom_right)))
    refuse(g, "sliding window and bottom-right masks need max_s_q <= max_s_kv without padding");
  if (g.tiles_q > 0 && (g.pass != SdpaPass::forward || g.ragged)) refuse(g, "block masks: dense forward only");
  if (g.tiles_q > 0 && (g.left_bound >= 0 || g.right_bound >= 0))  // the unified node before 9.21
    refuse(g, "left bound or right bound for unified SDPA node requires cuDNN 9.21.0 or above");
}

class EmulatedEngine final : public SdpaEngine {
 public:
  int version() const override { return 91900; }
  std::string describe() const override { return "cuDNN 9.19.0 stand-in (CPU emulation)"; }
  int sm_version() const override { return 90; }

  bool prepare(const SdpaGraphShape& shape, std::string* why) override {
    try {
      validate(shape);
    } catch (const std::invalid_argument& e) {
      if (why) *why = e.what();
      return false;
    }
    prepared_.insert(shape.hash());
    return true;
  }
  // A workspace of its own size, so that the backend's sizing and hand-over are exercised.
  size_t workspace_bytes(const SdpaGraphShape& shape) const override {
    return size_t(shape.batch * shape.heads * shape.s_q) * sizeof(float);
  }

  void run_forward(const SdpaGraphShape& g, const SdpaForwardArgs& a) override {
    check_prepared(g, a.workspace);
    cudaStreamSynchronize(static_cast<cudaStream_t>(a.stream));  // work queued before (emulated NCCL)
    const int64_t H = g.heads, D = g.head_dim, group = g.heads / g.kv_heads;
    const auto* q = static_cast<const bf16_bits*>(a.q);
    const auto* k = static_cast<const bf16_bits*>(a.k);
    const auto* v = static_cast<const bf16_bits*>(a.v);
    auto* o = static_cast<bf16_bits*>(a.o);
    std::vector<float> s(static_cast<size_t>(g.s_kv)), acc(static_cast<size_t>(D));
    for (int64_t n = 0; n < g.batch; ++n) {
      const Sequence sq = sequence(g, n, a.seq_len_q, a.seq_len_kv, a.ragged_q, a.ragged_kv);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t r = 0; r < sq.len_q; ++r) {
          const bf16_bits* qr = q + sq.q_base + r * H * D + h * D;
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t c = 0; c < sq.len_kv; ++c) {
            s[size_t(c)] = -std::numeric_limits<float>::infinity();
            if (!keeps(g, sq, a.tile_mask, r, c)) continue;
            const bf16_bits* kc = k + sq.k_base + c * g.kv_heads * D + (h / group) * D;
            float dot = 0.0f;
            for (int64_t d = 0; d < D; ++d) dot += bf16_to_float(qr[d]) * bf16_to_float(kc[d]);
            s[size_t(c)] = dot * g.scale;
            m = std::max(m, s[size_t(c)]);
          }
          float sum = 0.0f;
          std::fill(acc.begin(), acc.end(), 0.0f);
          if (m > -std::numeric_limits<float>::infinity())
            for (int64_t c = 0; c < sq.len_kv; ++c) {
              if (s[size_t(c)] == -std::numeric_limits<float>::infinity()) continue;
              const float p = std::exp(s[size_t(c)] - m);
              sum += p;
              const float pb = round_bf16(p);  // P V on the tensor cores
              const bf16_bits* vc = v + sq.k_base + c * g.kv_heads * D + (h / group) * D;
              for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += pb * bf16_to_float(vc[d]);
            }
          bf16_bits* orow = o + sq.q_base + r * H * D + h * D;
          for (int64_t d = 0; d < D; ++d) orow[d] = float_to_bf16(sum > 0.0f ? acc[size_t(d)] / sum : 0.0f);
          a.stats[(n * H + h) * g.s_q + r] = sum > 0.0f ? m + std::log(sum) : -std::numeric_limits<float>::infinity();
        }
    }
  }

  void run_backward(const SdpaGraphShape& g, const SdpaBackwardArgs& a) override {
    check_prepared(g, a.workspace);
    cudaStreamSynchronize(static_cast<cudaStream_t>(a.stream));
    const int64_t H = g.heads, Hkv = g.kv_heads, D = g.head_dim, group = H / Hkv;
    const auto* q = static_cast<const bf16_bits*>(a.q);
    const auto* k = static_cast<const bf16_bits*>(a.k);
    const auto* v = static_cast<const bf16_bits*>(a.v);
    const auto* o = static_cast<const bf16_bits*>(a.o);
    const auto* dout = static_cast<const bf16_bits*>(a.dout);
    for (int64_t n = 0; n < g.batch; ++n) {
      const Sequence sq = sequence(g, n, a.seq_len_q, a.seq_len_kv, a.ragged_q, a.ragged_kv);
      std::vector<float> dq(size_t(sq.len_q * H * D), 0.0f), dk(size_t(sq.len_kv * Hkv * D), 0.0f), dv(dk.size(), 0.0f);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kvh = h / group;
        for (int64_t r = 0; r < sq.len_q; ++r) {
          const int64_t qe = sq.q_base + r * H * D + h * D;
          const float lse = a.stats[(n * H + h) * g.s_q + r];
          if (!(lse > -std::numeric_limits<float>::infinity())) continue;
          float delta = 0.0f;  // rowsum(dO * O), O as cuDNN reads it (bf16)
          for (int64_t d = 0; d < D; ++d) delta += bf16_to_float(dout[qe + d]) * bf16_to_float(o[qe + d]);
          for (int64_t c = 0; c < sq.len_kv; ++c) {
            if (!keeps(g, sq, nullptr, r, c)) continue;
            const int64_t ke = sq.k_base + c * Hkv * D + kvh * D;
            float dot = 0.0f, dp = 0.0f;
            for (int64_t d = 0; d < D; ++d) {
              dot += bf16_to_float(q[qe + d]) * bf16_to_float(k[ke + d]);
              dp += bf16_to_float(dout[qe + d]) * bf16_to_float(v[ke + d]);
            }
            const float p = std::exp(dot * g.scale - lse);
            const float ds = round_bf16(p * (dp - delta) * g.scale), pb = round_bf16(p);
            float* dqr = &dq[size_t((r * H + h) * D)];
            float* dkc = &dk[size_t((c * Hkv + kvh) * D)];
            float* dvc = &dv[size_t((c * Hkv + kvh) * D)];
            for (int64_t d = 0; d < D; ++d) {
              dqr[d] += ds * bf16_to_float(k[ke + d]);
              dkc[d] += ds * bf16_to_float(q[qe + d]);
              dvc[d] += pb * bf16_to_float(dout[qe + d]);
            }
          }
        }
      }
      auto* dqo = static_cast<bf16_bits*>(a.dq);
      auto* dko = static_cast<bf16_bits*>(a.dk);
      auto* dvo = static_cast<bf16_bits*>(a.dv);
      for (int64_t e = 0; e < sq.len_q * H * D; ++e) dqo[sq.q_base + e] = float_to_bf16(dq[size_t(e)]);
      for (int64_t e = 0; e < sq.len_kv * Hkv * D; ++e) {
        dko[sq.k_base + e] = float_to_bf16(dk[size_t(e)]);
        dvo[sq.k_base + e] = float_to_bf16(dv[size_t(e)]);
      }
    }
  }

 private:
  // A call of a graph never prepared, or without its workspace, is the backend's bug.
  void check_prepared(const SdpaGraphShape& g, const void* workspace) const {
    if (!prepared_.count(g.hash()))
      throw std::logic_error("cuDNN (emulated): a call of an unprepared graph: " + g.describe());
    if (!workspace && workspace_bytes(g) > 0) throw std::logic_error("cuDNN (emulated): a call without its workspace");
  }
  std::unordered_set<size_t> prepared_;
};

}  // namespace

std::unique_ptr<SdpaEngine> make_sdpa_engine() { return std::make_unique<EmulatedEngine>(); }

std::string validate_graph_offline(const SdpaGraphShape& shape, int, int) {
  try {
    validate(shape);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace ringattn::kernels::cudnn
