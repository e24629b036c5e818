// The CPU backend: host memory and the vectorised CPU kernels.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/cpu/decode_cpu.hpp"
#include "kernels/cpu/state_weights.hpp"
#include "runtime/backend.hpp"

namespace ringattn {
namespace {

class CpuBackend final : public AttentionBackend {
 public:
  explicit CpuBackend(int threads) : threads_(threads) {}
  // The kernels' cached temporaries go back to the system with the context that used them.
  ~CpuBackend() override { kernels::release_cpu_workspace_cache(); }
  const char* name() const override { return "cpu"; }
  comm::MemorySpace memory() const override { return comm::MemorySpace::host; }

  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void release(void* p) override { std::free(p); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void fill(float* p, size_t n, float value) override { std::fill(p, p + n, value); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  void accumulate(float* dst, const float* src, size_t n) override {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t height) override {
    if (width == 0) return;
    for (size_t r = 0; r < height; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
  }

  StepKernel forward(const kernels::AttentionDims& dims, const kernels::QueryRows& q, const kernels::KeyValueRows& kv,
                     const MaskView& mask, const kernels::AttentionState& state,
                     const std::function<void()>& progress) override {
    kernels::attention_forward(dims, q, kv, mask, state, options(progress));
    return StepKernel::own;
  }
  void delta(const kernels::AttentionDims& dims, int64_t rows, const float* o, const void* dout, DType dtype,
             float* delta) override {
    kernels::attention_delta(dims, rows, o, dout, dtype, delta);
  }
  StepKernel backward(const kernels::AttentionDims& dims, const kernels::QueryRows& q, const kernels::KeyValueRows& kv,
                      const void* dout, const float* lse, const float* delta, float* dq, float* dk, float* dv,
                      const MaskView& mask, const std::function<void()>& progress) override {
    kernels::attention_backward(dims, q, kv, dout, lse, delta, dq, dk, dv, mask, options(progress));
    return StepKernel::own;
  }
  kernels::SamePrecision same_precision(const kernels::AttentionDims&, DType dtype) const override {
    return kernels::cpu_same_precision(dtype);
  }
  kernels::SamePrecision decode_same_precision(const kernels::AttentionDims&, int64_t tokens,
                                               DType dtype) const override {
    return kernels::decode_same_precision(tokens, dtype);
  }
  void synchronize() override {}

 private:
  kernels::CpuOptions options(const std::function<void()>& progress) const {
    kernels::CpuOptions o;
    o.threads = threads_;
    o.progress = progress;
    return o;
  }
  int threads_;
};

}  // namespace

std::unique_ptr<AttentionBackend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

// The AttentionBackend defaults: the CPU kernels on host memory.
void AttentionBackend::decode(const kernels::AttentionDims& dims, const kernels::DecodeQueries& q,
                              const kernels::CachedKeyValues& kv, const int64_t*, int64_t window_left,
                              const kernels::AttentionState& state, void*, int threads) {
  kernels::CpuOptions options;
  options.threads = threads;
  kernels::decode_forward(dims, q, kv, window_left, state, options);
}
void AttentionBackend::merge_states(const kernels::AttentionDims& dims, int64_t rows, const kernels::AttentionState& dst,
                                    const float* src_o, const float* src_lse) {
  kernels::merge_states(dims, rows, dst, src_o, src_lse);
}
void AttentionBackend::weigh_states(const kernels::AttentionDims& dims, int64_t rows, const float* o, const float* lse,
                                    const float* max_lse, float* sums) {
  kernels::weigh_states(dims, rows, o, lse, max_lse, sums);
}
void AttentionBackend::finish_weighted_states(const kernels::AttentionDims& dims, int64_t rows, const float* sums,
                                              const float* max_lse, float* o, float* lse) {
  kernels::finish_weighted_states(dims, rows, sums, max_lse, o, lse);
}

}  // namespace ringattn
