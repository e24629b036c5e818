// The one vocabulary of element types, for every layer: the tensors the kernels read (fp32,
// bf16, fp16), what the communicators move and reduce (the integers and fp64 too), and the
// conversions of the 16-bit floats. One enum, as NCCL's ncclDataType_t and torch.dtype are one;
// each layer says which members it accepts. The public API's ElementType maps to it in one place
// (runtime/api/arguments.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RINGATTN_HD __host__ __device__ __forceinline__
#else
#define RINGATTN_HD inline
#endif

namespace ringattn {

enum class DType : uint8_t { u8, i32, i64, f16, bf16, f32, f64 };

// "fp32", "bf16", "fp16" (the command line's --dtype words), "u8", "i32", "i64", "fp64".
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::f32: return "fp32";
    case DType::f64: return "fp64";
  }
  return "?";
}

inline int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::u8: return 1;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::i32:
    case DType::f32: return 4;
    case DType::i64:
    case DType::f64: return 8;
  }
  return 0;
}

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

// IEEE binary16 as raw bits, on the host (device code has cuda_fp16.h). Round to nearest even,
// subnormals kept, overflow to infinity, NaN stays NaN.
using fp16_bits = uint16_t;

inline fp16_bits float_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return uint16_t(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));  // NaN, inf
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to 65520 or more: inf
  if (abs < 0x38800000u) {                                   // below 2^-14: a subnormal
    // |f| * 2^24 is exact; adding and removing 2^23 rounds it to an integer, nearest even.
    float v;
    std::memcpy(&v, &abs, 4);
    const float scaled = v * 16777216.0f;
    const float rounded = (scaled + 8388608.0f) - 8388608.0f;
    return uint16_t(sign | uint16_t(rounded));
  }
  uint32_t h = (((abs >> 23) - 127 + 15) << 10) | ((abs >> 13) & 0x3ffu);
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

inline float fp16_to_float(fp16_bits h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t u;
  if (exponent == 31) {
    u = sign | 0x7f800000u | (mantissa << 13);  // inf, or NaN with its payload
  } else if (exponent != 0) {
    u = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else {
    // zero or a subnormal: mantissa x 2^-24, exact in fp32
    float f = float(mantissa) * (1.0f / 16777216.0f);
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace ringattn
