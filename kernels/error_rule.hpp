// The one rule by which every check in ringattn judges a result (the job's --check, `bench`,
// `bench --kernel`, the GPU benchmark), FlashAttention's: the same quantity is computed in fp64
// and again in the kernel's own precision (fp32; bf16 inputs with fp32 accumulation; bf16-rounded
// P and dS for the tensor-core kernels), and the kernel passes when its error against fp64 is at
// most kErrorFactor times that same-precision error, plus a floor of a few fp32 units of the
// tensor's size (for tensors that both compute exactly). A wrong mask, scale or head mapping
// moves every affected row by far more than rounding does, so the bound must follow rounding.
//
// Errors are maxima over the checked elements of one tensor (O, LSE, dQ, dK or dV), as in
// FlashAttention's tests; a NaN, or an infinity where fp64 has none, always fails.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace ringattn::kernels {

// Measured (docs/kernels.md, "Precision contract"): over 10 shapes and masks x fp32/bf16, the
// kernels' error is 0.45x to 2.6x that of the plain sequential fp32 computation (per tensor, max
// over 32 sampled rows). 8x
// leaves 3x for other seeds and summation orders, while at 4096 keys one output off by 1.2e-4 is
// still 12x over the bound, and a window, document boundary or diagonal one key off 100x to 1000x.
inline constexpr double kErrorFactor = 8.0;
// 2^-20 (16 fp32 units of rounding) of the tensor's largest |fp64 value|.
inline constexpr double kErrorFloor = 1.0 / (1 << 20);

// Scores rounded in fp32 (|s| 2^-24 each, a few times over) move every probability by that much
// relative: with |scores| ~ 1e4 two equally good fp32 implementations differ by ~1e-3, and
// the plain one, which rounds each score the same way in every pass, can be luckier than a
// kernel that scales into exp2. Where the caller knows the largest |score| and the size of the
// terms each value sums, the bound adds this rounding (negligible for ordinary scores).
inline constexpr double kScoreRounding = 4.0 / (1 << 24);

struct TensorError {
  double error = 0.0;     // max |kernel - fp64|
  double baseline = 0.0;  // max |same precision - fp64|
  double scale = 0.0;     // max |fp64|, finite values
  double rounding = 0.0;  // optional: kScoreRounding x max |score| x the terms' size

  // One element: the kernel's value, the same-precision value and the fp64 value. A row that
  // sees no key has LSE -inf in fp64; the others must say so too.
  void add(double kernel, double same_precision, double reference) {
    if (std::isinf(reference)) {
      if (kernel != reference) error = std::numeric_limits<double>::infinity();
      return;
    }
    scale = std::max(scale, std::abs(reference));
    error = std::max(error, std::isfinite(kernel) ? std::abs(kernel - reference) : std::numeric_limits<double>::infinity());
    if (std::isfinite(same_precision)) baseline = std::max(baseline, std::abs(same_precision - reference));
  }
  void merge(const TensorError& other) {
    error = std::max(error, other.error);
    baseline = std::max(baseline, other.baseline);
    scale = std::max(scale, other.scale);
    rounding = std::max(rounding, other.rounding);
  }
  double bound() const { return kErrorFactor * baseline + kErrorFloor * scale + rounding + 1e-30; }
  bool passed() const { return error <= bound(); }  // false for NaN
  // error / bound: above 1 fails.
  double ratio() const { return error / bound(); }
};

}  // namespace ringattn::kernels
