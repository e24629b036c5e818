// The CUDA backend's cuDNN path (docs/reference.md --kernel): the steps of every prepared ring planned into
// cuDNN SDPA calls (kernels/cudnn/step_plan.hpp), their graphs built and their buffers allocated
// in prepare(), and in a pass only the calls, the merges of their states into the step's and the
// additions of their gradients. A step the planner leaves to our kernels, one of a type or head
// dim cuDNN refuses, or any step when no cuDNN is loaded, is refused here (forward() and
// backward() return false) and the backend runs its own kernels.
//
// Precision. cuDNN writes each call's O (and dQ, dK, dV) in the input type; the merge and the
// sums are fp32. Its backward reads O in the input type: the pass's fp32 O rounded once (delta()).
// Determinism. cuDNN's default backward adds dQ with atomics (not bitwise reproducible); with
// deterministic, its deterministic algorithm runs where its workspace stays linear in the shard
// (Hopper from 9.25, Blackwell from 9.18), and our kernels (which are) everywhere else.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cudnn/sdpa_engine.hpp"
#include "runtime/backend.hpp"

namespace ringattn {

class CudnnSteps {
 public:
  explicit CudnnSteps(cudaStream_t stream);
  ~CudnnSteps();
  CudnnSteps(const CudnnSteps&) = delete;
  CudnnSteps& operator=(const CudnnSteps&) = delete;

  int version() const { return engine_->version(); }
  std::string status() const;
  // Why cuDNN cannot run attention of these dims and type at all ("" when it can).
  std::string unsupported(const kernels::AttentionDims& dims, DType dtype) const;
  // Plans, builds and allocates for every step of the request; returns their ids (-1: not ours
  // to run here: our kernels take those steps).
  std::vector<int> prepare(const PrepareRequest& request);
  void forget(const std::vector<int>& ids);

  // Queue the step's calls (true), or leave the step to our kernels (false).
  bool forward(const kernels::AttentionDims& dims, const kernels::QueryRows& q, const kernels::KeyValueRows& kv,
               const kernels::AttentionState& state);
  // The pass's O, before its backward steps (AttentionBackend::delta).
  void begin_backward(const kernels::AttentionDims& dims, int64_t rows, const float* o, DType dtype);
  bool backward(const kernels::AttentionDims& dims, const kernels::QueryRows& q, const kernels::KeyValueRows& kv,
                const void* dout, const float* lse, float* dq, float* dk, float* dv);

  // Whether a pass ran a step here (for the same-precision model: sticky, so a backend that ever
  // ran cuDNN is judged with its rounding, the looser bound).
  bool ran_forward() const { return ran_forward_; }
  bool ran_backward() const { return ran_backward_; }

 private:
  class Buffer;  // device memory, grown only in prepare()
  // Where a call's metadata lies in its step's arena (npos: absent).
  struct MetaOffsets {
    static constexpr size_t npos = size_t(-1);
    size_t seq_q = npos, seq_kv = npos, ragged_q = npos, ragged_kv = npos, segments = npos, tiles = npos;
  };
  struct Call {
    kernels::cudnn::SdpaGraphShape shape;
    std::vector<kernels::cudnn::SdpaSegment> segments;
    MetaOffsets meta;
  };
  struct Step {
    kernels::AttentionDims dims;
    DType dtype = DType::bf16;
    int64_t q_rows = 0, k_rows = 0;
    bool forward = false, backward = false;  // planned onto cuDNN for that pass
    std::vector<Call> forward_calls, backward_calls;
    std::shared_ptr<Buffer> arena;  // every call's metadata, on the device
  };
  // The call's metadata pointers inside its step's arena.
  struct Meta {
    const int32_t *seq_q = nullptr, *seq_kv = nullptr, *ragged_q = nullptr, *ragged_kv = nullptr;
    const kernels::cudnn::SdpaSegment* segments = nullptr;
    const uint8_t* tiles = nullptr;
  };
  static Meta meta(const Step& step, const Call& call);
  static MetaOffsets append_meta(const kernels::cudnn::SdpaCall& c, const kernels::AttentionDims& d, int64_t q_rows,
                                 int64_t k_rows, std::vector<unsigned char>& arena);
  bool plan_pass(const PrepareRequest& r, const StepPositions& sp, kernels::cudnn::SdpaPass pass, Step& step,
                 std::vector<unsigned char>& host_meta);
  const Step* find(const kernels::AttentionDims& dims, DType dtype, const kernels::QueryRows& q,
                   const kernels::KeyValueRows& kv) const;

  cudaStream_t stream_;
  std::unique_ptr<kernels::cudnn::SdpaEngine> engine_;
  std::unordered_map<int, Step> steps_;
  int next_id_ = 0;
  std::unique_ptr<Buffer> workspace_, o_call_, stats_, o_in_, dq_call_, dk_call_, dv_call_;
  bool ran_forward_ = false, ran_backward_ = false;
  bool said_unavailable_ = false;
};

}  // namespace ringattn
