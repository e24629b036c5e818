// A CPU emulation of the small part of CUDA that kernels/cuda uses, so that the kernels' own
// sources run, unchanged, in tests on machines without a GPU (CI). Force-included (-include)
// before everything else in the emulated test build; the real CUDA headers then become no-ops.
//
// What is emulated: a grid runs one block at a time; the threads of a block are fibers
// (ucontext) on one OS thread, switching at __syncthreads, __syncwarp, warp shuffles and
// mma.sync, which are exact collective operations of the block or warp; dynamic shared memory
// (poisoned with NaN bytes before each block, so reading what no thread wrote shows up);
// mma.sync.m16n8k16 with bf16/fp16 inputs and fp32 accumulation, with the fragment layouts of the
// PTX ISA; "device" memory is host memory (poisoned on allocation); launch limits (block size,
// grid y/z, dynamic shared memory against the kernel's opt-in and the sm_80 maximum).
// What is not: timing, memory coalescing, bank conflicts, races between warps that the fiber
// order happens to serialise, and the hardware's exact mma summation order. A kernel that
// passes here can still be wrong on a GPU only through those (and through the fragment layout
// itself, which this file transcribes from the PTX ISA rather than observes).
#pragma once

#define RINGATTN_CUDA_EMULATION 1
// The real headers would redefine what follows: make them no-ops.
#define __CUDA_RUNTIME_H__
#define __CUDA_RUNTIME_API_H__
#define __CUDA_BF16_H__
#define __CUDA_FP16_H__

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct float2 {
  float x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

struct CUstream_st;
using cudaStream_t = CUstream_st*;

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidPitchValue = 12,
  cudaErrorNoDevice = 100,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  int device = 0;
  void* devicePointer = nullptr;
  void* hostPointer = nullptr;
};
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDisableTiming = 2;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct cudaDeviceProp {
  char name[256] = "CUDA emulation";
  int major = 9, minor = 0, multiProcessorCount = 1;
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76 };

namespace cuda_emulation {

struct Coordinates {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
const Coordinates& coordinates();

void sync_block();
void sync_warp();
float shuffle(float value, int source_lane);
unsigned ballot(bool predicate);  // __ballot_sync over the full warp

// cp.async: copies are queued per thread and carried out by the wait that must precede their use
// (as late as the hardware may), so reading a tile before waiting for it reads stale bytes.
void async_copy(void* shared_dst, const void* global_src, size_t bytes);
void async_commit();
void async_wait(int groups_in_flight);

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16: lanes 8i..8i+7 give the shared-memory
// addresses of the eight 16-byte rows of matrix i; register i of lane t receives matrix i's
// elements (t / 4, 2 (t % 4)) and (t / 4, 2 (t % 4) + 1), or with .trans (2 (t % 4), t / 4) and
// (2 (t % 4) + 1, t / 4), the lower one in the low half. `row_address` must be 16-byte aligned
// and inside the block's shared memory.
void load_matrix(uint32_t* out, int matrices, bool transpose, const void* row_address);

// A block waits until a flag in global memory, set by another block, holds `value` (the ordered
// dQ additions of the backward kernel). Blocks run one after another here, so the flag must
// already hold it: otherwise the block waited for runs later (on a GPU, a wait that may never
// end), and the launch fails naming the flag's value and the one expected.
void wait_equal(const int* flag, int value);

enum class MmaInput { bf16, f16 };
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], MmaInput input);

// Runs `body` once per thread of every block of the grid (blocks one after another).
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);
void set_max_dynamic_shared(const void* kernel, int bytes);
// The compute capability the emulated device reports (default 9.0), which also sets the largest
// dynamic shared memory a block may opt in to (sm_80: 163 KiB; sm_90: 227 KiB). Tests set it to run
// the kernels' shapes for each architecture family.
void set_compute_capability(int major, int minor);
// Queues work that completes later on `stream` (streams.cpp): `done` is polled, in issue order.
void enqueue(cudaStream_t stream, std::function<bool()> done);
cudaError_t take_last_error(bool clear);

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t, const Args&... args) {
  run_grid(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, [&] { kernel(Params(args)...); });
}

// Per translation unit, the storage behind `extern __shared__ unsigned char smem[]`.
constexpr size_t kSharedBytes = 232448;  // 227 KiB, the sm_90 block maximum
bool register_shared(unsigned char* buffer);

uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t h);

}  // namespace cuda_emulation

#define threadIdx (::cuda_emulation::coordinates().thread)
#define blockIdx (::cuda_emulation::coordinates().block)
#define blockDim (::cuda_emulation::coordinates().block_dim)
#define gridDim (::cuda_emulation::coordinates().grid_dim)

// The kernels declare `extern __shared__ __align__(16) unsigned char smem[]` in functions of
// ringattn::kernels::gpu's unnamed namespace; this is what that declaration finds.
namespace ringattn::kernels::gpu {
namespace {
alignas(16) unsigned char smem[::cuda_emulation::kSharedBytes];
[[maybe_unused]] const bool smem_registered = ::cuda_emulation::register_shared(smem);
}  // namespace
}  // namespace ringattn::kernels::gpu

// ---- bf16 / fp16 ----
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
struct __half2 {
  __half x, y;
};

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return {uint16_t((u >> 16) | 0x40)};
  return {uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline float __half2float(__half h) { return cuda_emulation::half_bits_to_float(h.bits); }
inline __half __float2half_rn(float f) { return {cuda_emulation::float_to_half_bits(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }

// ---- device intrinsics ----
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Fast division (MUFU.RCP on the GPU, within 2 ulp): exact here.
inline float __fdividef(float a, float b) { return a / b; }
// A product the compiler may not fuse into a following addition (nor does any here: no -mfma).
inline float __fmul_rn(float a, float b) { return a * b; }
inline void __syncthreads() { cuda_emulation::sync_block(); }
// Blocks run one at a time: memory is always coherent, fences and pauses have nothing to do.
inline void __threadfence() {}
inline void __nanosleep(unsigned) {}
// atomicAdd on fp32 global memory as the GPU performs it (atom/red.add.f32: round to nearest
// even, subnormal inputs and result flushed to sign-preserving zero); nothing runs concurrently.
inline float atomicAdd(float* address, float value) {
  auto flush = [](float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; };
  const float old = *address;
  *address = flush(flush(old) + flush(value));
  return old;
}
inline void __syncwarp(unsigned = 0xffffffffu) { cuda_emulation::sync_warp(); }
inline float __shfl_sync(unsigned, float v, int source_lane, int = 32) {
  return cuda_emulation::shuffle(v, source_lane);
}
inline unsigned __ballot_sync(unsigned, int predicate) { return cuda_emulation::ballot(predicate != 0); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask, int = 32) {
  return cuda_emulation::shuffle(v, int(threadIdx.x % 32) ^ lane_mask);
}

// ---- runtime API ----
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
inline cudaError_t cudaPeekAtLastError() { return cuda_emulation::take_last_error(false); }
inline cudaError_t cudaGetLastError() { return cuda_emulation::take_last_error(true); }
template <class T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute, int value) {
  cuda_emulation::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), value);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream);
template <class T>
cudaError_t cudaMallocAsync(T** p, size_t bytes, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(p), bytes, stream);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaMallocHost(void** p, size_t bytes);
template <class T>
cudaError_t cudaMallocHost(T** p, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFreeHost(void* p);
// Kernels run when launched; streams hold only work queued by other emulations (emulated NCCL),
// which events and synchronisation wait for (emulation/cuda/streams.cpp; elapsed time: wall clock).
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device);
// Device allocations are host memory here; the emulation remembers which pointers they are.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p);
