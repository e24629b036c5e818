#include "runtime/random_inputs.hpp"

#include <cmath>

namespace ringattn {

namespace {
uint64_t mix(uint64_t z) {  // splitmix64 finaliser: a strong 64-bit hash of a counter
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

float random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t h = mix(mix(seed ^ (stream << 48)) ^ index);
  // Box-Muller from the two 32-bit halves (u1 in (0, 1], u2 in [0, 1)).
  const double u1 = (double(h >> 32) + 1.0) / 4294967296.0;
  const double u2 = double(h & 0xffffffffu) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void random_rows(float* out, uint64_t seed, RandomTensor tensor, int64_t batch, int64_t seq_len, int64_t row_elems,
                 const int64_t* pos, int64_t count, float scale) {
  const uint64_t stream = static_cast<uint64_t>(tensor);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < count; ++r) {
      const uint64_t base = static_cast<uint64_t>((b * seq_len + pos[r]) * row_elems);
      float* row = out + (b * count + r) * row_elems;
      for (int64_t e = 0; e < row_elems; ++e) row[e] = scale * random_normal(seed, stream, base + uint64_t(e));
    }
}

}  // namespace ringattn
