// Element types and the bfloat16 conversions shared by every backend.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RINGATTN_HD __host__ __device__ __forceinline__
#else
#define RINGATTN_HD inline
#endif

namespace ringattn {

// How Q/K/V (and dO) are stored and sent. Accumulation is always fp32 (SPEC.md: --dtype).
enum class DType : uint8_t { f32, bf16 };

inline const char* dtype_name(DType t) { return t == DType::f32 ? "fp32" : "bf16"; }
inline int64_t dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

// bfloat16 is the upper half of an IEEE float32; we store it as raw bits.
using bf16_bits = uint16_t;

RINGATTN_HD float bf16_to_float(bf16_bits b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
#if defined(__CUDA_ARCH__)
  f = __uint_as_float(u);
#else
  std::memcpy(&f, &u, sizeof f);
#endif
  return f;
}

// Round to nearest even, as PyTorch's and the hardware converters do; NaN stays NaN.
RINGATTN_HD bf16_bits float_to_bf16(float f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(f);
#else
  std::memcpy(&u, &f, sizeof u);
#endif
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<bf16_bits>((u >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>((u + rounding) >> 16);
}

}  // namespace ringattn
