// The LoRA attention layer around the ring (docs/layer.md):
//
//   Y = Attn(rope(X Wq^T + bq), rope(X Wk^T + bk), X Wv^T + bv) Wo^T + bo,
//   W = W0 + (alpha / r) B A for each projection,
//
// heads split (L, H, D) with D = d_model / H, GQA through Hkv, any mask of the attention job.
// Biases are optional and frozen; rope (rope.hpp) is optional and uses each row's global
// position (or its offset in its document), whatever the layout.
// Activations are sharded by sequence positions (ShardLayout), parameters by rows (FSDP-like):
//
//   what                    shape            rank p holds                         between passes
//   X, Y, dX, dY            (B, L, d)        its positions' rows                  (caller's)
//   Q, K, V, O, LSE, x A^T  (B, L, ...)      its positions' rows                  kept for backward
//   W0 of q, k, v, o        (out, in)        rows even_chunk(out, P, p)           ~1/P
//   bias of q, k, v, o      (out,)           the same rows                        ~1/P
//   B  of q, k, v, o        (out, r)         the same rows                        ~1/P
//   A  of q, k, v, o        (r, in)          columns even_chunk(in, P, p)         ~1/P
//   dA, dB                  like A, B        the same slices, summed over all     ~1/P
//                                            ranks' rows and the batch
//   AdamW moments           like A, B        the same slices (LoraOptimizer)      ~1/P
//   gathered projection     W0, A, B whole   during a pass only: the one in use   0
//                                            and the next one arriving
//
// A pass walks the projections in order (forward q, k, v, o; backward o, v, k, q). Each is
// gathered just before use (ProjectionGather: one communicator step, posted before the compute of
// the previous projection so the transfer overlaps it) into one of two buffers, each reused two
// projections later; both are freed when the pass ends. Peak parameter memory per rank is
// therefore (4 d^2 + LoRA) / P for the slices plus two gathered projections. After backward, the
// full local dA, dB of every projection are reduce-scattered in one collective, so each rank ends
// holding the full-sequence gradient of exactly the slices it owns.
//
// Where it runs. The attention goes through the runtime's session (runtime/session.hpp: the plan
// it caches for this shape, the ring or the Ulysses hybrid); the layer's tensors live in the
// session backend's memory, and the rest of the arithmetic runs on LayerOps (layer_ops.hpp)
// there: OpenBLAS and loops on the CPU, cuBLAS and small kernels on a GPU. The gathers and the
// reduce-scatter use the session's transport: MPI, or with the CUDA backend NCCL (comm nccl;
// equal-size blocks, so ncclReduceScatter) or MPI through host memory.
// The parameters' master copy (ShardedProjection, what the files load and the optimizer updates)
// is fp32 in host memory; a mirror of this rank's slices in the backend's memory (in the GEMMs'
// type) is refreshed before each forward pass for the parts that changed (backward uses what its
// forward used).
//
// Precision. With --dtype fp32 every GEMM is fp32. With --dtype bf16 the ring stores Q, K, V and
// dO as bf16 and every GEMM takes bf16 operands (X, the gathered weights, O, x A^T and the
// gradients it multiplies) with fp32 products and sums (cublasGemmEx on a GPU; on the CPU the
// operands rounded to bf16, then sgemm, which is the same arithmetic); outputs, biases, RoPE and
// gradients stay fp32.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/mask/mask.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/backend.hpp"
#include "runtime/lora/layer_ops.hpp"
#include "runtime/lora/projection.hpp"
#include "runtime/lora/rope.hpp"
#include "runtime/ring_plan.hpp"
#include "runtime/session.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

inline constexpr int kProjections = 4;
enum ProjectionIndex : int { kQuery = 0, kKey = 1, kValue = 2, kOutput = 3 };
const char* projection_name(int p);  // "q", "k", "v", "o"

struct LayerConfig {
  int64_t batch = 1;
  int64_t seq_len = 0;
  int64_t d_model = 0;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t lora_rank = 0;                  // r
  double lora_alpha = 0.0;                // scaling = alpha / r
  bool rslora = false;                    // rank-stabilised: scaling = alpha / sqrt(r) (PEFT use_rslora)
  std::array<bool, kProjections> lora{};  // which projections carry LoRA factors
  std::array<bool, kProjections> bias{};  // which projections have a (frozen) bias
  RopeConfig rope;                        // rotary embeddings of q and k (off by default)
  DType dtype = DType::f32;               // of Q, K, V, dO in the ring and of the GEMMs' operands
  int threads = 1;

  int64_t head_dim() const { return d_model / heads; }
  float scaling() const {
    if (lora_rank <= 0) return 0.0f;
    return float(lora_alpha / (rslora ? std::sqrt(double(lora_rank)) : double(lora_rank)));
  }
  ProjectionShape shape(int p) const;
  // Checks the arithmetic of the shape (d_model divisible by heads, Hkv dividing H, r >= 0, the
  // rotary dims, and with cpu_kernels a head dim the CPU kernels support: the CUDA kernels' are
  // checked by the API); throws ArgumentError naming the option.
  void validate(bool cpu_kernels = true) const;
};

// Where one pass of the layer spent its time on this rank.
struct LayerPassStats {
  double seconds = 0.0;
  double projection_seconds = 0.0;   // in the projections' GEMMs
  double attention_seconds = 0.0;    // in the ring (its own waits included)
  double gather_wait_seconds = 0.0;  // blocked waiting for parameter gathers: the exposed part
  double reduce_seconds = 0.0;       // backward: the gradient reduce-scatter
  RingStats attention;               // the ring's account of the attention
};

class LoraLayer {
 public:
  // Collective over the session's ranks (it builds the session's plan for the attention: `spec`
  // over config.seq_len positions, checked alike on every rank). The session computes the
  // attention and lends its backend (the memory of every tensor the layer takes or keeps) and its
  // transport (the parameter traffic); it must outlive the layer. The parameters start at zero:
  // fill them through projection(p).
  LoraLayer(Session& session, const LayerConfig& config, const AttentionSpec& spec);
  LoraLayer(const LoraLayer&) = delete;
  LoraLayer& operator=(const LoraLayer&) = delete;

  const LayerConfig& config() const { return config_; }
  const AttentionSpec& spec() const { return spec_; }
  const ShardLayout& layout() const { return plan_.layout(); }
  const Mask& mask() const { return plan_.mask(); }
  Session& session() { return session_; }
  // The memory of x, y, dy and dx: the backend's (host memory on the CPU, the GPU's with CUDA).
  AttentionBackend& backend() { return backend_; }
  const std::vector<int64_t>& positions() const { return plan_.positions(); }
  int64_t rows() const { return plan_.rows(); }
  // Elements of this rank's X (or Y): (batch, rows, d_model).
  size_t activation_elements() const { return static_cast<size_t>(config_.batch * rows() * config_.d_model); }

  ShardedProjection& projection(int p) { return projections_[static_cast<size_t>(p)]; }
  const ShardedProjection& projection(int p) const { return projections_[static_cast<size_t>(p)]; }

  // x (B, rows, d_model) -> y (B, rows, d_model), both in backend(); keeps what backward needs.
  // Collective.
  LayerPassStats forward(const float* x, float* y);
  // After forward on the same x: given dy, computes the LoRA gradients (lora_grad) and dx
  // (B, rows, d_model; skipped when null), all in backend(). Collective.
  LayerPassStats backward(const float* x, const float* dy, float* dx);
  // This rank's slice of a projection's gradient, laid out as projection(p).lora(), in host
  // memory: the sum over every rank's rows and the batch. Empty for a projection without LoRA.
  std::span<const float> lora_grad(int p) const { return grads_[static_cast<size_t>(p)]; }

  // This rank's rows of the merged weight W0 + (alpha / r) B A, (rows, in), on the host.
  // Collective (gathers A).
  std::vector<float> merged_rows(int p);

  // Parameter memory: the slices this rank holds between passes (the master copy; the mirror in
  // backend memory adds as much again with fp32 on a GPU), the whole layer's parameters (what one
  // rank would hold unsharded), and the most gathered-parameter bytes held at once.
  size_t shard_bytes() const;
  size_t full_parameter_bytes() const;
  size_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  size_t gathered_bytes() const;  // held now: 0 between passes
  // Multiply-adds of this rank's projections in one forward, times 2 (FLOPs).
  double projection_flops_forward() const;

 private:
  // Runs the four projections in `order`, each gathered just before use with the next one's
  // gather overlapping it; use(p, gathered) does the compute.
  void run_projections(const std::array<int, kProjections>& order, LayerPassStats& stats,
                       const std::function<void(int, const GatheredProjection&)>& use);
  void reduce_scatter_gradients(const float* full);
  // x (n floats in backend memory) as a GEMM operand: itself for fp32, rounded into `storage` for
  // bf16, which operand_buffer(n) allocated (before the pass posts any transfer: allocating with
  // transfers in flight could wait on them).
  const void* operand(const float* x, size_t n, const DeviceBuffer& storage);
  DeviceBuffer operand_buffer(int64_t n);
  DeviceBuffer buffer(size_t bytes) { return DeviceBuffer(backend_, bytes); }
  int64_t heads_of(int p) const { return p == kQuery ? config_.heads : config_.kv_heads; }

  Session& session_;
  AttentionBackend& backend_;
  comm::Communicator& comm_;  // the session's transport: parameter gathers and gradient reductions
  LayerConfig config_;
  AttentionSpec spec_;  // the attention: mask, layout, schedule, ulysses
  Shard shard_;
  AttentionPlan& plan_;  // the session's, for spec_ over the sequence
  std::unique_ptr<LayerOps> ops_;
  std::vector<ShardedProjection> projections_;
  std::array<SliceMirror, kProjections> mirrors_;
  std::array<DeviceBuffer, 2> slots_;  // the gathered projections of a pass
  std::array<ProjectionGather, 2> gathers_;
  size_t peak_gathered_bytes_ = 0;

  // Activations of the last forward, in backend memory: Q, K, V as the ring stores them (dtype),
  // O and LSE fp32, O as a GEMM operand (bf16 only), and u = x A^T of each projection (operand).
  DeviceBuffer q_, k_, v_, o_, lse_, o_operand_;
  std::array<DeviceBuffer, kProjections> u_;
  RopeTable rope_;                 // cos / sin of this rank's rows (host)
  DeviceBuffer rope_angles_;       // their copy in backend memory, when that is not the host's
  kernels::RotaryTable rotary_{};  // the table as ops_ reads it
  bool have_forward_ = false;
  std::array<std::vector<float>, kProjections> grads_;
};

}  // namespace ringattn
