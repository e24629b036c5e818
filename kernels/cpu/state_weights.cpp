// The all-reduce merge's local halves on the CPU (kernels/cpu/state_weights.hpp).
#include "kernels/cpu/state_weights.hpp"

#include <cmath>
#include <limits>

namespace ringattn::kernels {

void weigh_states(const AttentionDims& dims, int64_t rows, const float* o, const float* lse, const float* max_lse,
                  float* sums) {
  const int64_t B = dims.batch, H = dims.heads, D = dims.head_dim;
  const float inf = std::numeric_limits<float>::infinity();
  float* w = sums + B * rows * H * D;
  for (int64_t i = 0; i < B * H * rows; ++i)
    w[i] = max_lse[i] == -inf || lse[i] == -inf ? 0.0f : std::exp(lse[i] - max_lse[i]);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float wi = w[(b * H + h) * rows + i];
        const int64_t base = ((b * rows + i) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) sums[base + d] = o[base + d] * wi;
      }
}

void finish_weighted_states(const AttentionDims& dims, int64_t rows, const float* sums, const float* max_lse, float* o,
                            float* lse) {
  const int64_t B = dims.batch, H = dims.heads, D = dims.head_dim;
  const float* w = sums + B * rows * H * D;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t s = (b * H + h) * rows + i, base = ((b * rows + i) * H + h) * D;
        const float total = w[s];
        for (int64_t d = 0; d < D; ++d) o[base + d] = total > 0 ? sums[base + d] / total : 0.0f;
        lse[s] = total > 0 ? max_lse[s] + std::log(total) : -std::numeric_limits<float>::infinity();
      }
}

}  // namespace ringattn::kernels
