// The few vector operations the CPU attention kernels need, for one instruction set.
//
// Each kernel translation unit defines exactly one of RINGATTN_ISA_AVX512, RINGATTN_ISA_AVX2 or
// RINGATTN_ISA_SCALAR and is compiled with the matching -m flags. Everything here lives in a
// namespace named after the ISA, so no inline function compiled for AVX-512 can be picked by
// the linker for a caller running on an AVX2-only CPU (the one-definition-rule trap of
// multi-ISA builds).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "util/dtype.hpp"

#if defined(RINGATTN_ISA_AVX512) || defined(RINGATTN_ISA_AVX2)
#include <immintrin.h>
#endif

namespace ringattn::kernels::cpu {

#if defined(RINGATTN_ISA_AVX512)
#if defined(RINGATTN_AMX)
namespace amx {  // the AVX-512 code again, beside the AMX tiles of attention_amx.cpp
#elif defined(RINGATTN_BF16_DOT)
namespace avx512bf16 {
#else
namespace avx512 {
#endif
struct Isa {
  using V = __m512;
  static constexpr int W = 16;           // fp32 lanes
  static constexpr int kQueryVecs = 4;   // query tile = 64 rows, one lane each
  static constexpr int kKeyBlock = 64;   // keys per block (forward)
  // Keys per backward work item (when the shape leaves enough items): a larger block reuses each
  // query tile's Q, dO and dQ over more keys, 1-5% faster backward calls in interleaved runs here;
  // the forward keeps 64, where 128 was no faster and adds masked work on causal diagonals.
  static constexpr int kBackwardKeyBlock = 128;
  static constexpr int kRows = 6;        // broadcast rows per micro-kernel step (6 x 4 accumulators)
  static constexpr int kGradVecs = 4;    // dK/dV micro-kernel: 6 rows x 64 head-dim lanes
#if defined(RINGATTN_BF16_DOT)
  static constexpr const char* kName = "avx512bf16";
  // acc[i] += a[i].lo * b[i].lo + a[i].hi * b[i].hi over lanes holding bf16 pairs: two exact
  // products of bf16 inputs per instruction, accumulated in fp32 (VDPBF16PS).
  static constexpr bool kHasBf16Dot = true;
  using Pairs = __m512i;
  static Pairs load_pairs(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static Pairs set1_pair(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static V dot_pairs(V acc, Pairs a, Pairs b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
  // The W lanes of v rounded to bf16 (nearest even), stored as W consecutive bf16 values.
  static void store_bf16(bf16_bits* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
  }
  // Lane i of lo and of hi rounded to bf16 and paired (lo in the low half): the operand layout
  // of dot_pairs when the reduction runs over two rows of vectors.
  static Pairs pair_bf16(V lo, V hi) {
    const __m512i a = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(lo));
    const __m512i b = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(hi));
    return _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
  }
  static void store_pairs(uint32_t* p, Pairs x) { _mm512_storeu_si512(p, x); }
#elif defined(RINGATTN_AMX)
  static constexpr const char* kName = "amx";
  static constexpr bool kHasBf16Dot = false;  // bf16 products run on the tiles instead
#else
  static constexpr const char* kName = "avx512";
  static constexpr bool kHasBf16Dot = false;
#endif

  static V load(const float* p) { return _mm512_loadu_ps(p); }
  // W bf16 values widened exactly to fp32 (bf16 is the upper half of an fp32).
  static V load_bf16(const bf16_bits* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  // 2W bf16 values from p as fp32 without a widening shuffle: even (elements 0, 2, ...: each
  // 32-bit pair shifted up) and odd (1, 3, ...: the pair's upper half, masked). interleave()
  // puts such a split back in element order.
  static void load_bf16_split(const bf16_bits* p, V& even, V& odd) {
    const __m512i x = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(int(0xFFFF0000u))));
  }
  static void interleave(V even, V odd, V& lo, V& hi) {
    lo = _mm512_permutex2var_ps(even, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), odd);
    hi = _mm512_permutex2var_ps(even, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), odd);
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static bool any_greater(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
  // r[k][j] <- r[j][k]: a 16 x 16 block transposed in registers (packing tiles between rows and
  // lanes). Unpacks interleave pairs of rows, then 64-bit pairs, then 128-bit quarters twice.
  static void transpose(V (&r)[W]) {
    V t[W], u[W];
    for (int k = 0; k < 8; ++k) {
      t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int g = 0; g < 4; ++g) {  // u[4g + m], quarter q: rows 4g..4g+3 of column 4q + m
      const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
      const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
      u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
      u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
      u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
      u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    for (int m = 0; m < 4; ++m) {
      const V lo01 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44), hi01 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
      const V lo23 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44), hi23 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
      r[m] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);
      r[4 + m] = _mm512_shuffle_f32x4(lo01, lo23, 0xDD);
      r[8 + m] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);
      r[12 + m] = _mm512_shuffle_f32x4(hi01, hi23, 0xDD);
    }
  }
  // Lane j of the result: the sum of r[j]'s lanes (W dot products' partial sums reduced together
  // in 45 unpacks, shuffles and adds, where W horizontal sums would take 4W shuffles and adds more).
  static V sum_lanes(V (&r)[W]) {
    V t[8], u[4];
    for (int k = 0; k < 8; ++k)  // per 128-bit quarter: r[2k]'s partial sums at 0 and 2, r[2k+1]'s at 1 and 3
      t[k] = _mm512_add_ps(_mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]), _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]));
    for (int m = 0; m < 4; ++m)  // per quarter: the partial sums of r[4m .. 4m + 3]
      u[m] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * m], t[2 * m + 1], 0x44), _mm512_shuffle_ps(t[2 * m], t[2 * m + 1], 0xEE));
    const V v01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    const V v23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, 0x88), _mm512_shuffle_f32x4(v01, v23, 0xDD));
  }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  static float first(V v) { return _mm512_cvtss_f32(v); }
  // 2^x within 2.1 ulp (measured over every fp32 f in [-0.5, 0.5]); exactly 0 below 2^-126 and
  // for -inf, +inf above 2^128, NaN for NaN (a NaN score makes its row NaN, as in PyTorch, rather
  // than dropping the key or emptying the row). A degree-5 fit of 2^f with its constant term
  // exactly 1 (the degree-6 one it replaces was no more exact, 2.7 ulp, and took an FMA more); no
  // upper clamp, as scalef overflows to +inf by itself. The lower clamp keeps -inf out of the reduction
  // (-inf - -inf would raise the invalid flag, a trap where a caller enabled FP traps).
  static V exp2(V x) {
    x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);  // -inf to -150; NaN stays (max returns its 2nd operand)
    const V n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = _mm512_sub_ps(x, n);  // in [-0.5, 0.5]
    V p = _mm512_set1_ps(1.3264816953e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6715129912e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5507335812e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022242427e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314700365e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    // p * 2^n; lanes below 2^-126 are 0 instead of subnormal (a subnormal result costs a
    // microcode assist: masked keys, -inf, come here on every causal diagonal block)
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ), p, n);
  }
};
}  // namespace avx512 / avx512bf16 / amx
#endif

#if defined(RINGATTN_ISA_AVX2)
namespace avx2 {
struct Isa {
  using V = __m256;
  static constexpr int W = 8;
  static constexpr int kQueryVecs = 2;   // query tile = 16 rows (16 ymm registers in all)
  static constexpr int kKeyBlock = 64;
  static constexpr int kBackwardKeyBlock = 64;
  static constexpr int kRows = 6;        // 6 x 2 accumulators
  static constexpr int kGradVecs = 2;    // dK/dV micro-kernel: 6 rows x 16 head-dim lanes
  static constexpr const char* kName = "avx2";
  static constexpr bool kHasBf16Dot = false;

  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_bf16(const bf16_bits* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  // As the AVX-512 ones.
  static void load_bf16_split(const bf16_bits* p, V& even, V& odd) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(int(0xFFFF0000u))));
  }
  static void interleave(V even, V odd, V& lo, V& hi) {
    const V a = _mm256_unpacklo_ps(even, odd), b = _mm256_unpackhi_ps(even, odd);  // per 128-bit half
    lo = _mm256_permute2f128_ps(a, b, 0x20);
    hi = _mm256_permute2f128_ps(a, b, 0x31);
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static bool any_greater(V a, V b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)) != 0; }
  // r[k][j] <- r[j][k]: an 8 x 8 block transposed in registers.
  static void transpose(V (&r)[W]) {
    V t[W], u[W];
    for (int k = 0; k < 4; ++k) {
      t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int g = 0; g < 2; ++g) {  // u[4g + m], half h: rows 4g..4g+3 of column 4h + m
      u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
      u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
      u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
      u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int m = 0; m < 4; ++m) {
      r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
      r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
    }
  }
  // Lane j of the result: the sum of r[j]'s lanes (see the AVX-512 one).
  static V sum_lanes(V (&r)[W]) {
    V t[4], u[2];
    for (int k = 0; k < 4; ++k)
      t[k] = _mm256_add_ps(_mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]), _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]));
    for (int m = 0; m < 2; ++m)
      u[m] = _mm256_add_ps(_mm256_shuffle_ps(t[2 * m], t[2 * m + 1], 0x44), _mm256_shuffle_ps(t[2 * m], t[2 * m + 1], 0xEE));
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
  }
  static float reduce_max(V v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
  }
  static float reduce_add(V v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
  }
  static float first(V v) { return _mm256_cvtss_f32(v); }
  // 2^x; exactly 0 below 2^-126 (no subnormals) and for -inf, NaN for NaN.
  static V exp2(V x) {
    V keep = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_NLT_UQ);  // false for -inf, true for NaN
    x = _mm256_max_ps(_mm256_set1_ps(-126.0f), x);  // NaN stays (max and min return their 2nd operand)
    x = _mm256_min_ps(_mm256_set1_ps(127.0f), x);
    V n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V f = _mm256_sub_ps(x, n);
    V p = _mm256_set1_ps(1.540353039e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.333355815e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129108e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265070e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471806e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    V r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_and_ps(r, keep);
  }
};
}  // namespace avx2
#endif

#if defined(RINGATTN_ISA_SCALAR)
namespace scalar {
// Portable fallback (and a check of the generic tile code): one lane, plain C++.
struct Isa {
  using V = float;
  static constexpr int W = 1;
  static constexpr int kQueryVecs = 8;
  static constexpr int kKeyBlock = 32;
  static constexpr int kBackwardKeyBlock = 32;
  static constexpr int kRows = 4;
  static constexpr int kGradVecs = 8;
  static constexpr const char* kName = "scalar";
  static constexpr bool kHasBf16Dot = false;

  static V load(const float* p) { return *p; }
  static V load_bf16(const bf16_bits* p) { return bf16_to_float(*p); }
  static void load_bf16_split(const bf16_bits* p, V& even, V& odd) { even = bf16_to_float(p[0]), odd = bf16_to_float(p[1]); }
  static void interleave(V even, V odd, V& lo, V& hi) { lo = even, hi = odd; }
  static void store(float* p, V v) { *p = v; }
  static V set1(float x) { return x; }
  static V zero() { return 0.0f; }
  static V fmadd(V a, V b, V c) { return std::fma(a, b, c); }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V max(V a, V b) { return a > b ? a : b; }
  static bool any_greater(V a, V b) { return a > b; }
  static void transpose(V (&)[W]) {}  // a 1 x 1 block
  static V sum_lanes(V (&r)[W]) { return r[0]; }
  static float reduce_max(V v) { return v; }
  static float reduce_add(V v) { return v; }
  static float first(V v) { return v; }
  static V exp2(V x) { return x == -INFINITY ? 0.0f : std::exp2(x); }
};
}  // namespace scalar
#endif

}  // namespace ringattn::kernels::cpu
