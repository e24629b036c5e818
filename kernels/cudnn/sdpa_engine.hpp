// cuDNN's fused attention (SDPA) behind a small interface of our own, so that the CUDA backend
// never includes a cuDNN header: the real engine (kernels/cudnn/cudnn_engine.cpp, cudnn-frontend's
// Graph API over libcudnn loaded at run time), its CPU stand-in in emulated builds
// (emulation/cuda/cudnn_emulation.cpp: the same calls' arithmetic with cuDNN's conventions), or
// none (a build without the cudnn-frontend headers).
//
// A graph is built for an SdpaGraphShape (the shape and the kind of one planned call, SdpaCall of
// kernels/cudnn/step_plan.hpp) and cached by it; prepare() builds it, outside any pass, and
// run_forward()/run_backward() only execute. Layouts (kernels/attention.hpp): Q, dO, O, dQ rows of
// H x D elements, K, V, dK, dV rows of Hkv x D, every tensor in the input type (bf16 or fp16),
// (B, rows, heads, D) over the buffer's rows. A dense call reads rows [row0, row0 + s) of each
// batch entry through offset pointers; a ragged call reads its sequences at the ragged offsets
// (elements, int32, one per sequence plus the end). Stats is the natural-log LSE of the scaled
// scores, fp32, dense (sequences, H, s_q); the forward writes it, the backward reads the global
// one (gathered into that layout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/attention.hpp"
#include "kernels/cudnn/step_plan.hpp"
#include "util/dtype.hpp"

namespace ringattn::kernels::cudnn {

struct SdpaGraphShape {
  SdpaPass pass = SdpaPass::forward;
  DType dtype = DType::bf16;
  int64_t batch = 1;  // cuDNN's batch: B for a dense call, B x sequences for a ragged one
  int64_t heads = 1, kv_heads = 1, head_dim = 64;
  int64_t s_q = 0, s_kv = 0;       // the longest sequence's rows and keys
  int64_t q_rows = 0, k_rows = 0;  // rows of the buffers (a dense call's batch stride)
  bool ragged = false, padding = false;
  DiagonalAlignment alignment = DiagonalAlignment::top_left;
  int64_t right_bound = -1, left_bound = -1;
  int64_t tiles_q = 0, tiles_k = 0;  // tile mask (forward, dense), 0: none
  float scale = 1.0f;
  bool deterministic = false;  // backward: cuDNN's deterministic algorithm

  bool operator==(const SdpaGraphShape&) const = default;
  size_t hash() const;
  std::string describe() const;  // "fwd bf16 b1 h8/8 d128 sq2048 skv2048 causal(tl,R0)" and so on
};

// The graph shape of one call of a step whose buffers hold q_rows query and k_rows key rows.
SdpaGraphShape graph_shape(const SdpaCall& call, SdpaPass pass, const AttentionDims& dims, DType dtype, int64_t q_rows,
                           int64_t k_rows, bool deterministic);

// Device pointers of one call; the metadata arrays (int32; see the header comment) are those the
// shape asks for, null otherwise. workspace holds workspace_bytes(shape). stream: a cudaStream_t.
struct SdpaForwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* o = nullptr;                                          // in the input type, laid out as Q
  float* stats = nullptr;                                     // (batch, H, s_q)
  const int32_t *seq_len_q = nullptr, *seq_len_kv = nullptr;  // (batch)
  const int32_t *ragged_q = nullptr, *ragged_kv = nullptr;    // (batch + 1), elements
  const uint8_t* tile_mask = nullptr;  // (tiles_q, ceil(tiles_k / 8)) bits, LSB first, every batch and head
  void* workspace = nullptr;
  void* stream = nullptr;
};

struct SdpaBackwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr;
  const float* stats = nullptr;                      // the global LSE of the call's rows, (batch, H, s_q)
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;  // in the input type, written (not added)
  const int32_t *seq_len_q = nullptr, *seq_len_kv = nullptr;
  const int32_t *ragged_q = nullptr, *ragged_kv = nullptr;
  void* workspace = nullptr;
  void* stream = nullptr;
};

class SdpaEngine {
 public:
  virtual ~SdpaEngine() = default;
  // cuDNN's version as cudnnGetVersion() gives it (9.19.0: 91900); 0 when none is usable.
  virtual int version() const = 0;
  // "cuDNN 9.19.0 (libcudnn.so.9)", or why none is usable.
  virtual std::string describe() const = 0;
  bool available() const { return version() > 0; }
  // The device this engine's graphs are for (its SM version, e.g. 90), 0 when unknown.
  virtual int sm_version() const = 0;
  // Builds the graph for `shape` (cached); false, with the reason, when cuDNN has no engine for it.
  virtual bool prepare(const SdpaGraphShape& shape, std::string* why) = 0;
  // Workspace of a prepared graph.
  virtual size_t workspace_bytes(const SdpaGraphShape& shape) const = 0;
  // Queue a prepared graph's call on args.stream (throws Fault on a cuDNN error).
  virtual void run_forward(const SdpaGraphShape& shape, const SdpaForwardArgs& args) = 0;
  virtual void run_backward(const SdpaGraphShape& shape, const SdpaBackwardArgs& args) = 0;
};

// The engine of this build for the current CUDA device.
std::unique_ptr<SdpaEngine> make_sdpa_engine();

// cuDNN's own checks of the graph for `shape` without a device, for a target GPU (sm_version, e.g.
// 90, and its SM count): "" when they pass, else cuDNN's message. Needs libcudnn (not a GPU); says
// so when the build or the machine has none.
std::string validate_graph_offline(const SdpaGraphShape& shape, int sm_version, int sm_count);

// The cuDNN versions from which the planner may use a feature (cudnn-frontend 1.32's checks).
inline constexpr int kBlockMaskVersion = 91400;            // Unified SDPA's Block_mask input
inline constexpr int kBlockMaskBandVersion = 92100;        // Unified SDPA with left or right bounds
inline constexpr int kLinearDeterministicVersion = 92500;  // Hopper's deterministic backward, linear workspace

// What the cuDNN of `version` can express on a device of SM `sm_version` (ragged sequences:
// Hopper and newer, or any from 9.18.1) for buffers of `elements` elements at most (int32 offsets).
SdpaCapabilities capabilities(int version, int sm_version, int64_t elements);

}  // namespace ringattn::kernels::cudnn
