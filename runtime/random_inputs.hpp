// Seeded random inputs that depend only on (seed, tensor, batch, position, element), never on the
// number of ranks or the layout: each rank generates exactly its own rows, and a job run on any P
// sees the same global tensors (so results can be compared across P and with files).
#pragma once

#include <cstdint>

namespace ringattn {

enum class RandomTensor : uint32_t { q = 1, k = 2, v = 3, dout = 4, x = 5, dy = 6 };

// out (batch, count, row_elems) <- standard normal values of rows pos[0..count) of a
// (batch, seq_len, row_elems) tensor, times `scale`.
void random_rows(float* out, uint64_t seed, RandomTensor tensor, int64_t batch, int64_t seq_len, int64_t row_elems,
                 const int64_t* pos, int64_t count, float scale = 1.0f);

// One standard normal value per index, the generator behind random_rows.
float random_normal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace ringattn
