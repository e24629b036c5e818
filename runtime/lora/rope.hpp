// Rotary position embeddings (RoPE) of the LoRA layer's q and k (docs/layer.md).
//
// For a head vector x of D values, the first `dims` (rd) of them are rotated in rd/2 planes; plane
// i turns by the angle  position * inv_freq[i],  inv_freq[i] = theta^(-2i / rd). The pairing is
//   rotate_half (HF Llama, GPT-NeoX):  plane i = (x[i], x[i + rd/2])
//   interleaved (GPT-J):               plane i = (x[2i], x[2i + 1])
// and (a, b) -> (a cos - b sin, b cos + a sin). The position is the row's global position in the
// sequence (never its index on the rank), or its offset in its document with per_document.
// The backward pass rotates gradients by the opposite angle (the rotation is orthogonal).
//
// Llama 3 rope scaling (config.json rope_scaling, type "llama3") rescales inv_freq: wavelengths
// longer than original_max_positions / low_freq_factor are divided by `factor`, those shorter
// than original_max_positions / high_freq_factor are kept, and the band between is interpolated.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/rotary.hpp"

namespace ringattn {

struct RopeConfig {
  double theta = 0.0;          // 0: no rotary embedding
  bool interleaved = false;    // GPT-J pairing instead of rotate_half
  int64_t dims = 0;            // rotated dims of each head (even); 0 = the whole head
  bool per_document = false;   // positions restart at each document of the mask
  // Llama 3 scaling; factor 0 = none.
  double llama3_factor = 0.0, llama3_low_freq_factor = 1.0, llama3_high_freq_factor = 4.0;
  int64_t llama3_original_max_positions = 8192;

  bool enabled() const { return theta > 0.0; }
  int64_t rotary_dims(int64_t head_dim) const { return dims > 0 ? dims : head_dim; }
  // Throws ArgumentError naming the field (rope_theta, rope_dims, rope_per_document).
  void validate(int64_t head_dim, bool has_documents) const;
};

// inv_freq[i] for i < rd / 2, Llama 3 scaling applied.
std::vector<double> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim);

// The positions RoPE uses for rows at these global positions: themselves, or with per_document
// their offset from the start of their document (`doc_offsets`: 0, ends of each document).
std::vector<int64_t> rope_positions(std::span<const int64_t> global, std::span<const int64_t> doc_offsets,
                                    bool per_document);

// Rotates x (batch, table.rows, heads, head_dim), in host memory, in place by the table's angles;
// inverse = by the opposite angles (backward).
void rotate_rows(const kernels::RotaryTable& table, float* x, int64_t batch, int64_t heads, bool inverse);

// cos and sin of every (row, plane) of this rank's rows, and the rotation applied to activations
// laid out (batch, rows, heads, D).
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(const RopeConfig& rope, int64_t head_dim, std::span<const int64_t> positions);

  bool enabled() const { return planes_ > 0; }
  // Rotates x (batch, rows, heads, D) in place; inverse = by the opposite angles (backward).
  void apply(float* x, int64_t batch, int64_t heads, bool inverse) const {
    rotate_rows(table(), x, batch, heads, inverse);
  }
  // The angles, in host memory; `cos`/`sin` replaced by device copies of cos() and sin() serve a GPU.
  kernels::RotaryTable table() const {
    return kernels::RotaryTable{cos_.data(), sin_.data(), rows_, planes_, head_dim_, interleaved_};
  }
  std::span<const float> cos() const { return cos_; }
  std::span<const float> sin() const { return sin_; }

 private:
  int64_t head_dim_ = 0, planes_ = 0, rows_ = 0;
  bool interleaved_ = false;
  std::vector<float> cos_, sin_;  // (rows, planes)
};

}  // namespace ringattn
