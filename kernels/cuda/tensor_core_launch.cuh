// What the tensor-core forward and backward launchers share: the choice of kernel instance for
// the inputs (element type, head dim) and the GPU's architecture.
//
// Tile shapes are chosen per (head dim, architecture family) by occupancy (docs/gpu.md, "The
// tensor-core kernels"): a kernel template takes a Shape type, and each launcher maps (D, family)
// to one. Where sm_80 and sm_90 get the same shape it is one instance, compiled for both; where
// they differ, each instance names its family (Shape::kArch) and its body is compiled only for
// that family's architectures (kDeviceArch below), so per-architecture shapes cost no compile time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/params.cuh"

namespace ringattn::kernels::gpu {

// The architecture family the device code being compiled is for: 90 (sm_90 and newer), 80
// (sm_80 to sm_89), or 0 in host code and on the CPU emulation, which runs every family's shape.
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 900
inline constexpr int kDeviceArch = 90;
#else
inline constexpr int kDeviceArch = 80;
#endif
#else
inline constexpr int kDeviceArch = 0;
#endif

// Whether a kernel of this Shape has its body in the code being compiled (Shape::kArch: 0 for a
// shape shared by every family).
template <class Shape>
inline constexpr bool compiled_here = Shape::kArch == 0 || kDeviceArch == 0 || Shape::kArch == kDeviceArch;

// The family of the current device (80 or 90), from its compute capability.
int arch_family();

template <class T>
struct TypeTag {
  using type = T;
};
template <int D>
using HeadDim = std::integral_constant<int, D>;

// f(TypeTag<T>{}, HeadDim<D>{}) for the element type (bf16 or fp16) and head dim (64, 96, 128 or
// 256) of p: one place that lists the instances.
template <class F>
void dispatch_tensor_core(const AttentionParams& p, F&& f) {
  const bool bf16 = p.type == DType::bf16;
  auto by_type = [&](auto d) {
    if (bf16)
      f(TypeTag<__nv_bfloat16>{}, d);
    else
      f(TypeTag<__half>{}, d);
  };
  switch (p.head_dim) {
    case 64:
      return by_type(HeadDim<64>{});
    case 96:
      return by_type(HeadDim<96>{});
    case 128:
      return by_type(HeadDim<128>{});
    default:
      return by_type(HeadDim<256>{});
  }
}

// launch(TypeTag<T>{}, HeadDim<D>{}, TypeTag<Shape>{}) for p's instance (dispatch_tensor_core)
// and the Shape that Choice<D, family>::type names for the current device's family (80 or 90):
// the one place that turns the device into a tile-shape table's column.
template <template <int D, int Arch> class Choice, class F>
void launch_for_arch(const AttentionParams& p, F&& launch) {
  const int arch = arch_family();
  dispatch_tensor_core(p, [&](auto type, auto dim) {
    constexpr int D = decltype(dim)::value;
    if (arch >= 90)
      launch(type, dim, TypeTag<typename Choice<D, 90>::type>{});
    else
      launch(type, dim, TypeTag<typename Choice<D, 80>::type>{});
  });
}

}  // namespace ringattn::kernels::gpu
