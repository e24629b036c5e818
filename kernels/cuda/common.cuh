// Pieces shared by the CUDA kernels: error checks, element loads, warp reductions, constants.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_cuda.hpp"

namespace ringattn::kernels::gpu {

// A CUDA runtime failure, with the call and where it was made (NCCL's CHECK style).
[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error: ") + call + " failed at " + file + ":" + std::to_string(line) +
                           ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

#define RINGATTN_CUDA_CHECK(call)                                                                   \
  do {                                                                                              \
    const cudaError_t ringattn_cuda_status_ = (call);                                               \
    if (ringattn_cuda_status_ != cudaSuccess)                                                       \
      ::ringattn::kernels::gpu::throw_cuda_error(ringattn_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports a bad configuration at once (execution errors surface later).
// cudaGetLastError, not Peek: it clears the error, so that a later, unrelated check does not
// report this launch's failure as its own.
#define RINGATTN_CUDA_CHECK_LAUNCH(name) RINGATTN_CUDA_CHECK(cudaGetLastError())

// Every kernel launch goes through here: kernel<<<grid, block, shared bytes, stream>>>(args), or,
// in the CPU emulation the tests build (tests/cuda/emulation), the emulator's launch.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   const Args&... args) {
#if defined(RINGATTN_CUDA_EMULATION)
  ::cuda_emulation::launch(kernel, grid, block, shared_bytes, stream, args...);
#else
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
#endif
}

// launch_kernel with `shared_bytes` of dynamic shared memory, opted in unconditionally (a no-op
// below 48 KiB, so that a bad size fails here, named), and the launch checked.
template <class... Params, class... Args>
void launch_with_shared_memory(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                               cudaStream_t stream, const Args&... args) {
  RINGATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
  launch_kernel(kernel, grid, block, shared_bytes, stream, args...);
  RINGATTN_CUDA_CHECK_LAUNCH("kernel launch");
}

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// 2^x by the special-function unit alone (ex2.approx.ftz: about 2 ulp, results below 2^-126
// flushed to 0, -inf gives 0), as FlashAttention's fast-math build computes its exponentials.
// exp2f without fast math adds a range fix-up around the same instruction for subnormal results,
// which a probability that small (it is added to a sum of at least 1) does not need. The CPU
// emulation computes exp2f.
__device__ __forceinline__ float exp2_approx(float x) {
#if defined(RINGATTN_CUDA_EMULATION)
  return exp2f(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

__device__ __forceinline__ float load_element(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default:
      return __half2float(static_cast<const __half*>(base)[i]);
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// LSE (natural log) of a row's running max m (log2 units) and sum l: m ln2 + ln l, rounded once.
// (m + log2 l) ln2 rounds twice, at the size of m + log2 l: on the CPU kernels that made LSE 1.5x
// and, through P, dQ 1.8x as inexact as the plain fp32 computation (L = 4096).
__device__ __forceinline__ float lse_of(float m, float l) { return fmaf(m, kLn2, logf(l)); }

// The running max m and sum l (log2 units) that continue a partial state of LSE `lse`: m = LSE
// log2(e) rounded to fp32 and l = 2^(LSE log2(e) - m), within 2^-23 of 1, by which the state's
// normalised O is multiplied. (l = 1 weighs the state by 2^(rounding of m): over a ring of 4
// ranks, LSE came out 1.9x as inexact as the plain fp32 computation on the CPU kernels.)
struct ContinuedState {
  float m, l;
};
__device__ __forceinline__ ContinuedState continue_state(float lse) {
  constexpr float kLog2eLow = 1.925963033500011e-8f;  // log2(e) - kLog2e
  const float m = lse * kLog2e;
  // LSE log2(e) - m: the product's rounding error, exact by the FMA, plus the low part's product
  return {m, exp2f(fmaf(lse, kLog2eLow, fmaf(lse, kLog2e, -m)))};
}

// LSE (natural log) as the log2 offset that turns log2-scaled scores into probabilities; rows
// that saw no key (LSE = -inf) get +inf, so that their P is exactly 0.
__device__ __forceinline__ float lse_to_log2_offset(float lse) { return lse == neg_inf() ? pos_inf() : lse * kLog2e; }

// Flags between CTAs in global memory (the ordered dQ additions, dq_order.cuh), as CUTLASS's
// semaphore: the writer's threads make their global writes, pass a barrier, then one thread
// publishes the value with release semantics; every lane of a reading warp waits until the flag
// holds the value, with acquire semantics (all lanes load the same word together: the loop stays
// converged), before it touches what the writer wrote.
__device__ __forceinline__ void wait_for_flag(const int* flag, int value) {
#if defined(RINGATTN_CUDA_EMULATION)
  ::cuda_emulation::wait_equal(flag, value);
#else
  for (;;) {
    int seen;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(flag) : "memory");
    if (seen == value) return;
    __nanosleep(64);
  }
#endif
}

__device__ __forceinline__ void publish_flag(int* flag, int value) {
#if defined(RINGATTN_CUDA_EMULATION)
  *flag = value;
#else
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
#endif
}

// dst[0] += a, dst[1] += b in global memory, performed at L2 (no read back): one vector reduction
// on sm_90, two scalar ones before. fp32 atomic additions round to nearest and flush subnormals.
__device__ __forceinline__ void add_pair_to_global(float* dst, float a, float b) {
#if !defined(RINGATTN_CUDA_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

inline bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

// Launch geometry limits: grid y and z take at most 65535.
inline void check_grid(int64_t tiles, int64_t heads, int64_t batch, const char* what) {
  if (tiles > 0x7fffffff || heads > 65535 || batch > 65535)
    throw std::invalid_argument(std::string(what) + ": too many tiles, heads or batch entries for one launch");
}

}  // namespace ringattn::kernels::gpu
