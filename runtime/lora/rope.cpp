#include "runtime/lora/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "runtime/errors.hpp"

namespace ringattn {

void RopeConfig::validate(int64_t head_dim, bool has_documents) const {
  if (!enabled()) {
    if (dims != 0 || interleaved || per_document)
      throw ArgumentError("rope_theta", "{rope_dims}, {rope_interleaved} and {rope_per_document} need {rope_theta}");
    return;
  }
  if (!std::isfinite(theta) || theta <= 1.0)
    throw ArgumentError("rope_theta", "{rope_theta} " + std::to_string(theta) + " must be a finite number above 1");
  if (dims < 0 || dims > head_dim || dims % 2 != 0)
    throw ArgumentError("rope_dims", "{rope_dims} " + std::to_string(dims) + " must be even and at most the head dim " +
                                         std::to_string(head_dim));
  if (per_document && !has_documents)
    throw ArgumentError("rope_per_document", "{rope_per_document} needs documents: {doc_lens}");
  if (llama3_factor != 0.0 &&
      (!(llama3_factor > 0.0) || !(llama3_high_freq_factor > llama3_low_freq_factor) ||
       !(llama3_low_freq_factor > 0.0) || llama3_original_max_positions < 1))
    throw ArgumentError("rope_scaling", "rope_scaling (llama3) needs factor > 0, high_freq_factor > low_freq_factor > 0 "
                                        "and original_max_position_embeddings >= 1");
}

std::vector<double> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim) {
  const int64_t rd = rope.rotary_dims(head_dim);
  std::vector<double> inv(static_cast<size_t>(rd / 2));
  for (int64_t i = 0; i < rd / 2; ++i) inv[size_t(i)] = std::pow(rope.theta, -double(2 * i) / double(rd));
  if (rope.llama3_factor == 0.0) return inv;
  const double old = double(rope.llama3_original_max_positions);
  const double low_wavelen = old / rope.llama3_low_freq_factor, high_wavelen = old / rope.llama3_high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f /= rope.llama3_factor;
    } else if (wavelen >= high_wavelen) {  // the band between: interpolated
      const double smooth = (old / wavelen - rope.llama3_low_freq_factor) /
                            (rope.llama3_high_freq_factor - rope.llama3_low_freq_factor);
      f = (1.0 - smooth) * f / rope.llama3_factor + smooth * f;
    }
  }
  return inv;
}

std::vector<int64_t> rope_positions(std::span<const int64_t> global, std::span<const int64_t> doc_offsets,
                                    bool per_document) {
  std::vector<int64_t> pos(global.begin(), global.end());
  if (!per_document || doc_offsets.empty()) return pos;
  for (int64_t& t : pos) {
    // The document holding t: the last offset <= t (empty documents share their offset).
    const auto it = std::upper_bound(doc_offsets.begin(), doc_offsets.end(), t);
    t -= *(it - 1);
  }
  return pos;
}

RopeTable::RopeTable(const RopeConfig& rope, int64_t head_dim, std::span<const int64_t> positions)
    : head_dim_(head_dim), rows_(static_cast<int64_t>(positions.size())), interleaved_(rope.interleaved) {
  if (!rope.enabled()) return;
  const std::vector<double> inv = rope_inverse_frequencies(rope, head_dim);
  planes_ = static_cast<int64_t>(inv.size());
  cos_.resize(static_cast<size_t>(rows_ * planes_));
  sin_.resize(cos_.size());
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t i = 0; i < planes_; ++i) {
      const double angle = double(positions[size_t(r)]) * inv[size_t(i)];  // in fp64: exact for long sequences
      cos_[size_t(r * planes_ + i)] = float(std::cos(angle));
      sin_[size_t(r * planes_ + i)] = float(std::sin(angle));
    }
}

void rotate_rows(const kernels::RotaryTable& table, float* x, int64_t batch, int64_t heads, bool inverse) {
  if (table.planes == 0) return;
  const float sign = inverse ? -1.0f : 1.0f;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < table.rows; ++r) {
      float* row = x + (b * table.rows + r) * heads * table.head_dim;
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < table.planes; ++i) kernels::rotate_plane(table, r, row + h * table.head_dim, i, sign);
    }
}

}  // namespace ringattn
