// Rotary position embeddings, one plane at a time: the arithmetic that the CPU loop
// (runtime/lora/rope.cpp) and the CUDA kernel (kernels/cuda/layer_kernels.cu) share.
//
// A head vector of head_dim values has `planes` planes (the first 2 * planes dims are rotated);
// plane i of row r turns by the angle whose cosine and sine are cos[r * planes + i] and
// sin[r * planes + i]. The pairing is
//   rotate_half (HF Llama, GPT-NeoX):  plane i = (x[i], x[i + planes])
//   interleaved (GPT-J):               plane i = (x[2i], x[2i + 1])
// and (a, b) -> (a cos - b sin, b cos + a sin); the inverse turns by the opposite angle.
#pragma once

#include <cstdint>

#include "util/dtype.hpp"

namespace ringattn::kernels {

// The angles of `rows` rows, (rows, planes) each, in the memory of whoever applies them.
struct RotaryTable {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t rows = 0, planes = 0, head_dim = 0;
  bool interleaved = false;
};

// Rotates plane `plane` of the head vector `head` of table row `row`; sign -1 is the inverse.
RINGATTN_HD void rotate_plane(const RotaryTable& t, int64_t row, float* head, int64_t plane, float sign) {
  const int64_t first = t.interleaved ? 2 * plane : plane;
  const int64_t second = t.interleaved ? 2 * plane + 1 : plane + t.planes;
  const float c = t.cos[row * t.planes + plane], s = sign * t.sin[row * t.planes + plane];
  const float a = head[first], b = head[second];
  head[first] = a * c - b * s;
  head[second] = b * c + a * s;
}

}  // namespace ringattn::kernels
