// Naive fp64 LoRA attention layer: the oracle of the layer tests. One process, whole sequence,
// written independently of the runtime from docs/layer.md's formula
//   Y = Attn(rope(X Wq^T + bq), rope(X Wk^T + bk), X Wv^T + bv) Wo^T + bo:
// effective weights W = W0 + s B A formed explicitly, rotary angles computed per (position, plane),
// full (L x L) attention per head with the mask applied element by element, and the gradients of
// A and B taken from the full weight gradient (dA = s B^T dW, dB = s dW A^T).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/mask/mask_view.hpp"

namespace ringattn::testing {

// One projection in the file layouts: W0 (out, in), A (rank, in), B (out, rank); rank 0 = none.
struct RefProjection {
  int64_t out = 0, in = 0, rank = 0;
  std::vector<double> w0, a, b;
};

struct RefLayer {
  int64_t batch = 1, seq_len = 0, d_model = 0, heads = 1, kv_heads = 1;
  double scaling = 1.0;  // alpha / r
  MaskView mask;
  std::array<RefProjection, 4> proj;  // q, k, v, o
  std::array<std::vector<double>, 4> bias;  // (out,) each; empty = none
  // Rotary embeddings: theta 0 = none; rope_dims 0 = the whole head; rotate_half pairing (i, i + rd/2)
  // or interleaved (2i, 2i + 1); positions restart at each of doc_offsets with rope_per_document.
  double rope_theta = 0.0;
  bool rope_interleaved = false, rope_per_document = false;
  int64_t rope_dims = 0;
  std::vector<int64_t> doc_offsets;

  int64_t head_dim() const { return d_model / heads; }
  std::vector<double> effective(int p) const;  // W0 + s B A, (out, in)
};

struct RefGrads {
  std::vector<double> dx;                     // (B, L, d_model)
  std::array<std::vector<double>, 4> da, db;  // like A and B, summed over batch and sequence
};

// y (B, L, d_model) of x (B, L, d_model).
std::vector<double> reference_layer_forward(const RefLayer& layer, const std::vector<double>& x);
RefGrads reference_layer_backward(const RefLayer& layer, const std::vector<double>& x, const std::vector<double>& dy);

// One optimizer step on every A and B (fp64), from zero AdamW state at step `step` = 1.
enum class RefOptimizer { sgd, adamw };
void reference_step(RefLayer& layer, const RefGrads& g, RefOptimizer kind, double lr, double weight_decay = 0.01);

}  // namespace ringattn::testing
