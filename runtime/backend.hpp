// Where the attention arithmetic runs and where its buffers live: the CPU (host memory) or a GPU
// (device memory). The ring executor is written against this interface only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "ringattn/errors.hpp"
#include "kernels/attention.hpp"
#include "kernels/cpu/decode_cpu.hpp"
#include "runtime/ring_plan.hpp"

namespace ringattn {

// Which kernels run the attention steps (RingOptions::kernel; docs/reference.md --kernel): cuDNN's fused
// attention for the steps it can express and ours for the rest (automatic; cudnn: the same, but
// an error where cuDNN cannot run at all), or ours throughout.
enum class KernelChoice { automatic, cudnn, own };
const char* kernel_choice_name(KernelChoice k);  // "auto", "cudnn", "own"
// Which kernels ran one step.
enum class StepKernel { own, cudnn };

// Every step a RingAttention will compute, for prepare(): the queries' and keys' positions (host
// arrays, read during the call only).
struct StepPositions {
  const int64_t* q_pos = nullptr;
  int64_t q_rows = 0;
  const int64_t* k_pos = nullptr;
  int64_t k_rows = 0;
};
struct PrepareRequest {
  kernels::AttentionDims dims;
  DType dtype = DType::f32;
  MaskView mask;
  int64_t max_rows = 0;  // the most query or key rows of any call
  KernelChoice kernel = KernelChoice::automatic;
  bool deterministic = false;  // the backward must be bitwise reproducible
  std::vector<StepPositions> steps;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual const char* name() const = 0;  // "cpu" or "cuda"
  virtual comm::MemorySpace memory() const = 0;

  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void fill(float* p, size_t n, float value) = 0;
  // Host <-> backend memory (plain copies on the CPU).
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;

  // Queued on the backend's stream (immediate on the CPU): dst <- src, both in backend memory, and
  // dst += src (fp32). The row walks below are written once on top of these two.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void accumulate(float* dst, const float* src, size_t n) = 0;

  // dst (batch, sum of ranges, row_bytes) <- rows of src (batch, src_rows, row_bytes).
  void gather_rows(void* dst, const void* src, int64_t batch, int64_t src_rows, size_t row_bytes,
                   const std::vector<RowRange>& ranges) {
    auto* out = static_cast<char*>(dst);
    const auto* in = static_cast<const char*>(src);
    for (int64_t b = 0; b < batch; ++b)
      for (const RowRange& r : ranges) {
        const size_t n = static_cast<size_t>(r.end - r.begin) * row_bytes;
        if (n) copy(out, in + static_cast<size_t>(b * src_rows + r.begin) * row_bytes, n);
        out += n;
      }
  }
  // dst rows += src (fp32): the inverse of gather_rows, used to return gradient partials. Returns
  // with the sums done (waits for the device).
  void scatter_add_rows(float* dst, const float* src, int64_t batch, int64_t dst_rows, int64_t row_elems,
                        const std::vector<RowRange>& ranges) {
    for (int64_t b = 0; b < batch; ++b)
      for (const RowRange& r : ranges) {
        const int64_t n = (r.end - r.begin) * row_elems;
        if (n) accumulate(dst + (b * dst_rows + r.begin) * row_elems, src, static_cast<size_t>(n));
        src += n;
      }
    synchronize();
  }
  // dst += src, done on return.
  void add(float* dst, const float* src, size_t n) {
    accumulate(dst, src, n);
    synchronize();
  }
  // `height` rows of `width` bytes from src to dst, consecutive rows `src_pitch` and `dst_pitch`
  // bytes apart (cudaMemcpy2D's contract): a slice of a tensor's heads or rows in one call.
  virtual void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                       size_t height) = 0;

  // The kernels, with the semantics of kernels/cpu/attention_cpu.hpp; pointers are backend memory,
  // positions are host arrays. `progress` is called between tiles (may be empty). kv.step is the
  // id prepare() gave this step (-1: none); the result says which kernels ran it.
  virtual StepKernel forward(const kernels::AttentionDims& dims, const kernels::QueryRows& q,
                             const kernels::KeyValueRows& kv, const MaskView& mask,
                             const kernels::AttentionState& state, const std::function<void()>& progress) = 0;
  // Called once per backward pass, before its backward() calls, with the pass's O and dO (a
  // backend whose backward reads O takes what it needs of it here).
  virtual void delta(const kernels::AttentionDims& dims, int64_t rows, const float* o, const void* dout,
                     DType dtype, float* delta) = 0;
  virtual StepKernel backward(const kernels::AttentionDims& dims, const kernels::QueryRows& q,
                              const kernels::KeyValueRows& kv, const void* dout, const float* lse, const float* delta,
                              float* dq, float* dk, float* dv, const MaskView& mask,
                              const std::function<void()>& progress) = 0;
  // Called once when a RingAttention is built: allocates now whatever later kernel calls of its
  // steps would allocate (device copies of the mask and of positions, the backward kernel's
  // workspace; on the cuDNN path every step's calls, their graphs, buffers and workspace), so that
  // no call during a pass allocates memory or builds anything. Returns one id per step, for
  // KeyValueRows::step (-1 each on the CPU); forget_steps(ids) when the ring is gone.
  virtual std::vector<int> prepare(const PrepareRequest& request) {
    return std::vector<int>(request.steps.size(), -1);
  }
  virtual void forget_steps(const std::vector<int>& ids) { (void)ids; }
  // Why `kernel` cannot run attention of these dims and input type on this backend (an
  // ArgumentError naming `kernel`), or nothing when it can. The same answer on every rank that has
  // the same backend and libraries.
  virtual std::optional<ArgumentError> kernel_problem(KernelChoice kernel, const kernels::AttentionDims& dims,
                                                      DType dtype) const {
    (void)dims, (void)dtype;
    if (kernel != KernelChoice::cudnn) return std::nullopt;
    return ArgumentError("kernel", std::string("{kernel} cudnn needs the CUDA backend (this is ") + name() + ")");
  }
  // The cuDNN the backend loaded: its version (9.19.0: 91900; 0: none) and a line for the summary
  // ("cuDNN 9.19.0 (libcudnn.so.9)", or why none is used).
  virtual int cudnn_version() const { return 0; }
  virtual std::string cudnn_status() const { return std::string("not used by the ") + name() + " backend"; }
  // The stream the backend queues its work on (a cudaStream_t), for a communicator that orders
  // its transfers with it on the device; nullptr on the CPU.
  virtual void* native_stream() { return nullptr; }
  // Makes the backend usable from the calling thread (CUDA: its device current there). A context
  // may be driven by several threads, one at a time (PyTorch runs the backward of CUDA tensors
  // on its autograd device thread); every public entry point calls this first. No-op on the CPU.
  virtual void use_from_this_thread() {}
  // Ordering with a stream of the caller's (a cudaStream_t; nullptr: CUDA's legacy default
  // stream), on the device, with no host or device-wide synchronisation. after_stream: work
  // queued here from now on starts after the work queued on `stream` so far (the kernels that
  // wrote a call's inputs). before_stream: work queued on `stream` from now on starts after the
  // work queued here so far (a call's results). No-ops on the CPU.
  virtual void after_stream(void* stream) { (void)stream; }
  virtual void before_stream(void* stream) { (void)stream; }
  // ---- Decode against the KV cache (runtime/inference/) ----
  // The decode kernel, with kernels/cpu/decode_cpu.hpp's semantics: q.q, kv.k, kv.v and `state`
  // in backend memory; q.pos and kv.pos host arrays, `kv_pos` the same positions in backend
  // memory (kv.pos itself on the CPU); `workspace` holds decode_workspace_bytes(dims.head_dim).
  // Queued on the backend's stream. The defaults (here and below) are the CPU kernels on host memory.
  virtual void decode(const kernels::AttentionDims& dims, const kernels::DecodeQueries& q,
                      const kernels::CachedKeyValues& kv, const int64_t* kv_pos, int64_t window_left,
                      const kernels::AttentionState& state, void* workspace, int threads);
  virtual size_t decode_workspace_bytes(int64_t head_dim) const {
    (void)head_dim;
    return 0;
  }
  // Why the decode kernel cannot serve a cache of this head dim (an ArgumentError naming
  // head_dim), or nothing.
  virtual std::optional<ArgumentError> decode_problem(int64_t head_dim) const {
    (void)head_dim;
    return std::nullopt;
  }
  // The merge of partial states across ranks (runtime/inference/rank_merge.hpp) on backend
  // memory: dst <- merge(dst, src) (kernels::merge_states), and the all-reduce's two halves
  // (kernels/cpu/state_weights.hpp). Queued on the backend's stream.
  virtual void merge_states(const kernels::AttentionDims& dims, int64_t rows, const kernels::AttentionState& dst,
                            const float* src_o, const float* src_lse);
  virtual void weigh_states(const kernels::AttentionDims& dims, int64_t rows, const float* o, const float* lse,
                            const float* max_lse, float* sums);
  virtual void finish_weighted_states(const kernels::AttentionDims& dims, int64_t rows, const float* sums,
                                      const float* max_lse, float* o, float* lse);

  // How the kernels this backend ran round, for these shapes and this input type: the
  // same-precision model the --check compares against (kernels/error_rule.hpp). Where passes ran
  // steps on cuDNN, its rounding is included.
  virtual kernels::SamePrecision same_precision(const kernels::AttentionDims& dims, DType dtype) const = 0;
  // The same for the decode kernel called with `tokens` new tokens (pass-Q): fp32 throughout, but
  // where a backend runs a call on its block kernels (the CPU's, on calls that fill its query tiles).
  virtual kernels::SamePrecision decode_same_precision(const kernels::AttentionDims& dims, int64_t tokens,
                                                       DType dtype) const {
    (void)dims, (void)tokens, (void)dtype;
    return kernels::SamePrecision::fp32();
  }
  // Waits for queued work (a no-op on the CPU).
  virtual void synchronize() = 0;
};

// Runs `call` (the backend's work of one user call) ordered with the caller's stream, where there
// is one (Context::set_cuda_stream): after the work queued on it so far, and before the work queued
// on it later. Returns what `call` returns.
template <class Call>
auto ordered_with_stream(AttentionBackend& backend, std::optional<void*> stream, Call&& call) {
  if (stream) backend.after_stream(*stream);
  auto result = call();
  if (stream) backend.before_stream(*stream);
  return result;
}

std::unique_ptr<AttentionBackend> make_cpu_backend(int threads);

// A buffer in backend memory, released with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(AttentionBackend& backend, size_t bytes)
      : backend_(&backend), bytes_(bytes), ptr_(bytes ? backend.allocate(bytes) : nullptr) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    reset();
    backend_ = o.backend_, bytes_ = o.bytes_, ptr_ = o.ptr_;
    o.ptr_ = nullptr, o.bytes_ = 0;
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void reset() {
    if (ptr_) backend_->release(ptr_);
    ptr_ = nullptr;
  }
  AttentionBackend* backend_ = nullptr;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

// A host buffer and its copy in a backend's memory: the buffer itself when that memory is the
// host's (no copy), else a buffer of its size; upload() and download() move the bytes (no-ops on
// the host).
class MirroredBytes {
 public:
  MirroredBytes(AttentionBackend& backend, void* host, size_t bytes)
      : backend_(backend),
        host_(host),
        device_(backend.memory() == comm::MemorySpace::host ? DeviceBuffer() : DeviceBuffer(backend, bytes)) {}
  void* data() { return device_.data() ? device_.data() : host_; }  // in the backend's memory
  void upload() {
    if (device_.data()) backend_.upload(device_.data(), host_, device_.bytes());
  }
  void download() {
    if (device_.data()) backend_.download(host_, device_.data(), device_.bytes());
  }

 private:
  AttentionBackend& backend_;
  void* host_;
  DeviceBuffer device_;
};

// A host vector of floats and its copy in a backend's memory (MirroredBytes; the vector's size
// must not change while mirrored).
class MirroredFloats : public MirroredBytes {
 public:
  MirroredFloats(AttentionBackend& backend, std::vector<float>& host)
      : MirroredBytes(backend, host.data(), sizeof(float) * host.size()) {}
  float* data() { return static_cast<float*>(MirroredBytes::data()); }
};

}  // namespace ringattn
