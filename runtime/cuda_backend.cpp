// The CUDA backend (runtime/cuda_backend.hpp).
#include "runtime/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/decode_cuda.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "runtime/cudnn_steps.hpp"
#include "runtime/errors.hpp"

namespace ringattn {
namespace {

[[noreturn]] void fail(cudaError_t e, const std::string& what) {
  throw Fault("CUDA backend: " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(e, what);
}

// A device copy of a host array, re-uploaded only when the host content changes.
class DeviceMirror {
 public:
  DeviceMirror() = default;
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  ~DeviceMirror() {
    if (device_) cudaFree(device_);
  }

  // Room for `bytes` bytes, allocated now (RingAttention's construction) rather than in a pass.
  void reserve(size_t bytes) {
    if (bytes == 0 || bytes <= capacity_) return;
    if (device_) check(cudaFree(device_), "cudaFree");
    device_ = nullptr;
    check(cudaMalloc(&device_, bytes), "cudaMalloc for positions or mask");
    capacity_ = bytes;
    copy_.clear();
  }

  void* data() const { return device_; }
  size_t capacity() const { return capacity_; }

  // Device pointer holding `bytes` bytes equal to `host` (stream-ordered upload on `stream`).
  // Allocates only beyond the reserved room (never for a prepared RingAttention).
  const void* get(const void* host, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return nullptr;
    if (bytes == copy_.size() && std::memcmp(copy_.data(), host, bytes) == 0) return device_;
    reserve(bytes);
    copy_.assign(static_cast<const unsigned char*>(host), static_cast<const unsigned char*>(host) + bytes);
    // From the host copy, which lives until the next upload: that one is ordered after this.
    check(cudaMemcpyAsync(device_, copy_.data(), bytes, cudaMemcpyHostToDevice, stream), "uploading positions or mask");
    // copy_ may be overwritten by the next call before this copy ran: wait for it.
    check(cudaStreamSynchronize(stream), "uploading positions or mask");
    return device_;
  }

 private:
  void* device_ = nullptr;
  size_t capacity_ = 0;
  std::vector<unsigned char> copy_;
};

class CudaBackend final : public AttentionBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    check(cudaSetDevice(device), ("selecting device " + std::to_string(device)).c_str());
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
    check(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming), "creating an event");
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    cudnn_.reset();  // its handle and buffers before the stream they are used on
    cudaEventDestroy(order_event_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  void use_from_this_thread() override {
    check(cudaSetDevice(device_), ("selecting device " + std::to_string(device_)).c_str());
  }
  comm::MemorySpace memory() const override { return comm::MemorySpace::device; }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
      fail(e, "allocating " + std::to_string(bytes) + " bytes on device " + std::to_string(device_));
    return p;
  }
  // cudaFree waits for the whole device: buffers are released between passes, never while a
  // transfer on them is in flight.
  void release(void* p) override { check(cudaFree(p), "cudaFree"); }
  void zero(void* p, size_t bytes) override { check(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync"); }
  void fill(float* p, size_t n, float value) override { kernels::cuda_fill(p, n, value, stream_); }
  void upload(void* dst, const void* host_src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
    check(cudaStreamSynchronize(stream_), "upload");
  }
  void download(void* host_dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    check(cudaStreamSynchronize(stream_), "download");
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
  }

  void accumulate(float* dst, const float* src, size_t n) override { kernels::cuda_add(dst, src, n, stream_); }

  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t height) override {
    if (width == 0 || height == 0) return;
    check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice, stream_),
          "copy_2d");
  }

  StepKernel forward(const kernels::AttentionDims& dims, const kernels::QueryRows& q, const kernels::KeyValueRows& kv,
                     const MaskView& mask, const kernels::AttentionState& state,
                     const std::function<void()>& progress) override {
    if (q.rows == 0 || kv.rows == 0) return StepKernel::own;
    if (cudnn_ && cudnn_->forward(dims, q, kv, state)) {
      wait(progress);
      return StepKernel::cudnn;
    }
    const MaskView m = device_mask(mask);
    const kernels::CudaQueryRows dq{q.data, q.dtype, q.rows, positions(q_pos_, q.pos, q.rows)};
    const kernels::CudaKeyValueRows dkv{kv.k, kv.v, kv.dtype, kv.rows,
                                        positions(k_pos_, kv.pos, kv.rows)};
    kernels::cuda_attention_forward(dims, dq, dkv, m, state, options());
    wait(progress);
    return StepKernel::own;
  }

  void delta(const kernels::AttentionDims& dims, int64_t rows, const float* o, const void* dout, DType dtype,
             float* delta) override {
    kernels::cuda_attention_delta(dims, rows, o, dout, dtype, delta, stream_);
    if (cudnn_) cudnn_->begin_backward(dims, rows, o, dtype);
  }

  StepKernel backward(const kernels::AttentionDims& dims, const kernels::QueryRows& q, const kernels::KeyValueRows& kv,
                      const void* dout, const float* lse, const float* delta, float* dq, float* dk, float* dv,
                      const MaskView& mask, const std::function<void()>& progress) override {
    if (q.rows == 0 || kv.rows == 0) return StepKernel::own;
    if (cudnn_ && cudnn_->backward(dims, q, kv, dout, lse, dq, dk, dv)) {
      wait(progress);
      return StepKernel::cudnn;
    }
    const MaskView m = device_mask(mask);
    const kernels::CudaQueryRows dqr{q.data, q.dtype, q.rows, positions(q_pos_, q.pos, q.rows)};
    const kernels::CudaKeyValueRows dkv{kv.k, kv.v, kv.dtype, kv.rows,
                                        positions(k_pos_, kv.pos, kv.rows)};
    kernels::cuda_attention_backward(dims, dqr, dkv, dout, lse, delta, dq, dk, dv, m, options());
    wait(progress);
    return StepKernel::own;
  }

  void synchronize() override { check(cudaStreamSynchronize(stream_), "synchronize"); }

  void* native_stream() override { return stream_; }

  // One event serves both directions: a stream's wait takes the event as recorded at that moment.
  void after_stream(void* stream) override {
    check(cudaEventRecord(order_event_, static_cast<cudaStream_t>(stream)), "recording an event on the caller's stream");
    check(cudaStreamWaitEvent(stream_, order_event_, 0), "ordering after the caller's stream");
  }
  void before_stream(void* stream) override {
    check(cudaEventRecord(order_event_, stream_), "recording an event");
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), order_event_, 0), "ordering the caller's stream after ours");
  }

  std::vector<int> prepare(const PrepareRequest& r) override {
    const size_t bytes = sizeof(int64_t) * static_cast<size_t>(std::max<int64_t>(r.max_rows, 1));
    q_pos_.reserve(bytes);
    k_pos_.reserve(bytes);
    device_mask(r.mask);  // uploads the doc offsets and block mask now; later calls find them equal
    workspace_.reserve(kernels::cuda_attention_backward_workspace_bytes(r.dims, r.max_rows));
    if (r.kernel == KernelChoice::own) return std::vector<int>(r.steps.size(), -1);
    return cudnn().prepare(r);
  }
  void forget_steps(const std::vector<int>& ids) override {
    if (cudnn_) cudnn_->forget(ids);
  }
  std::optional<ArgumentError> kernel_problem(KernelChoice kernel, const kernels::AttentionDims& dims,
                                              DType dtype) const override {
    if (kernel != KernelChoice::cudnn) return std::nullopt;
    const std::string why = cudnn().unsupported(dims, dtype);
    if (why.empty()) return std::nullopt;
    return ArgumentError("kernel", "{kernel} cudnn: " + why);
  }
  void decode(const kernels::AttentionDims& dims, const kernels::DecodeQueries& q, const kernels::CachedKeyValues& kv,
              const int64_t* kv_pos, int64_t window_left, const kernels::AttentionState& state, void* workspace,
              int) override {
    // The rows some query sees, found on the host copy of the positions; the kernel reads no other.
    const kernels::VisibleRows visible = kernels::decode_visible_rows(q, kv, window_left);
    for (int64_t t = 1; t < q.tokens; ++t)
      if (q.pos[t] != q.pos[0] + t) throw std::invalid_argument("CUDA decode: the new tokens' positions must be consecutive");
    const kernels::CudaDecodeQueries dq{q.q, q.dtype, q.tokens, q.tokens > 0 ? q.pos[0] : 0};
    const kernels::CudaCachedRows rows{kv.k, kv.v, kv.dtype, kv.head_stride, kv_pos, visible.first, visible.last};
    kernels::cuda_decode_forward(dims, dq, rows, window_left, state, workspace, decode_workspace_bytes(dims.head_dim),
                                 stream_);
  }
  size_t decode_workspace_bytes(int64_t head_dim) const override {
    return kernels::cuda_decode_workspace_bytes(head_dim);
  }
  std::optional<ArgumentError> decode_problem(int64_t head_dim) const override {
    if (kernels::cuda_decode_supports_head_dim(head_dim)) return std::nullopt;
    return ArgumentError("head_dim", "{head_dim} " + std::to_string(head_dim) +
                                         " is not supported by the CUDA decode kernel (multiples of 16 up to 256)");
  }
  void merge_states(const kernels::AttentionDims& dims, int64_t rows, const kernels::AttentionState& dst,
                    const float* src_o, const float* src_lse) override {
    kernels::cuda_merge_states(dims, rows, dst, src_o, src_lse, stream_);
  }
  void weigh_states(const kernels::AttentionDims& dims, int64_t rows, const float* o, const float* lse,
                    const float* max_lse, float* sums) override {
    kernels::cuda_weigh_states(dims, rows, o, lse, max_lse, sums, stream_);
  }
  void finish_weighted_states(const kernels::AttentionDims& dims, int64_t rows, const float* sums, const float* max_lse,
                              float* o, float* lse) override {
    kernels::cuda_finish_weighted_states(dims, rows, sums, max_lse, o, lse, stream_);
  }

  int cudnn_version() const override { return cudnn().version(); }
  std::string cudnn_status() const override { return cudnn().status(); }

 private:
  kernels::SamePrecision same_precision(const kernels::AttentionDims& dims, DType dtype) const override {
    // The tensor-core kernels round P and dS to the input type; the CUDA-core ones compute in fp32.
    // Backend buffers are 256-byte aligned, so alignment never decides here: any aligned address will do.
    alignas(16) static const char aligned[16] = {};
    const std::string kernel =
        kernels::cuda_kernel_name(dims, dtype, aligned, aligned, aligned, options());
    kernels::SamePrecision p = kernel != "tensor_core" ? kernels::SamePrecision::fp32()
                               : dtype == DType::f16   ? kernels::SamePrecision::fp16_products()
                                                       : kernels::SamePrecision::bf16_products();
    // cuDNN's steps (runtime/cudnn_steps.hpp): tensor-core products, each step's outputs in bf16.
    if (cudnn_ && cudnn_->ran_forward()) p.forward_products = DType::bf16, p.forward_step_outputs = true;
    if (cudnn_ && cudnn_->ran_backward()) p.backward_products = DType::bf16, p.backward_step_outputs = true;
    return p;
  }
  // The cuDNN path, made on first use (it loads libcudnn).
  CudnnSteps& cudnn() const {
    if (!cudnn_) cudnn_ = std::make_unique<CudnnSteps>(stream_);
    return *cudnn_;
  }
  kernels::CudaOptions options() const {
    kernels::CudaOptions o;
    o.stream = stream_;
    o.workspace = workspace_.data();  // calls run one after another on stream_: one workspace serves all
    o.workspace_bytes = workspace_.capacity();
    return o;
  }

  const int64_t* positions(DeviceMirror& mirror, const int64_t* host, int64_t rows) {
    return static_cast<const int64_t*>(mirror.get(host, sizeof(int64_t) * static_cast<size_t>(rows), stream_));
  }

  // The mask with its arrays on the device (its host-side run index is not used by the kernels).
  MaskView device_mask(const MaskView& host) {
    MaskView m = host;
    if (host.has_docs())
      m.doc_offsets = static_cast<const int64_t*>(
          docs_.get(host.doc_offsets, sizeof(int64_t) * static_cast<size_t>(host.num_docs + 1), stream_));
    if (host.has_block_mask())
      m.block_mask = static_cast<const uint8_t*>(
          blocks_.get(host.block_mask, static_cast<size_t>(host.block_count * host.block_count), stream_));
    m.row_run_ptr = nullptr, m.row_runs = nullptr, m.col_run_ptr = nullptr, m.col_runs = nullptr;
    return m;
  }

  // Waits for the stream, calling `progress` meanwhile (spinning briefly, then yielding the core).
  void wait(const std::function<void()>& progress) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) fail(e, "attention kernels");
      if (progress) progress();
      if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(100))
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t order_event_ = nullptr;  // after_stream, before_stream
  DeviceMirror q_pos_, k_pos_, docs_, blocks_;
  DeviceMirror workspace_;  // room only (reserve): the backward kernel's bookkeeping
  mutable std::unique_ptr<CudnnSteps> cudnn_;  // the cuDNN path (--kernel auto|cudnn)
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear: no driver or no device is not an error here
    return 0;
  }
  return n;
}

bool cuda_device_available() { return cuda_device_count() > 0; }

std::unique_ptr<AttentionBackend> make_cuda_backend(int device) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n)
    throw Fault("CUDA device " + std::to_string(device) + " requested, " + std::to_string(n) +
                       " CUDA device(s) visible");
  return std::make_unique<CudaBackend>(device);
}

}  // namespace ringattn
