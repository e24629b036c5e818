// The LoRA attention layer around the ring (SPEC.md "The LoRA attention layer"):
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
// gathered just before use (ProjectionGather: point-to-point, posted before the compute of the
// previous projection so the transfer overlaps it) and its buffer is reused two projections
// later; both buffers are freed when the pass ends. Peak parameter memory per rank is therefore
// (4 d^2 + LoRA) / P for the slices plus two gathered projections. After backward, the full
// local dA, dB of every projection are reduce-scattered in one collective, so each rank ends
// holding the full-sequence gradient of exactly the slices it owns.
//
// The attention runs on the CPU backend through RingAttention; the projections are OpenBLAS
// sgemm calls on the host.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/backend.hpp"
#include "runtime/lora/projection.hpp"
#include "runtime/lora/rope.hpp"
#include "kernels/mask/mask.hpp"
#include "runtime/ring_attention.hpp"
#include "runtime/ulysses_attention.hpp"
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
  DType dtype = DType::f32;               // of Q, K, V, dO in the ring (projections are fp32)
  Schedule schedule = Schedule::direct;
  int threads = 1;

  int64_t head_dim() const { return d_model / heads; }
  float scaling() const {
    if (lora_rank <= 0) return 0.0f;
    return float(lora_alpha / (rslora ? std::sqrt(double(lora_rank)) : double(lora_rank)));
  }
  ProjectionShape shape(int p) const;
  // Checks the arithmetic of the shape (d_model divisible by heads, Hkv dividing H, a head dim
  // the kernels support, r >= 0, the rotary dims); throws UsageError naming the option.
  void validate() const;
};

// Where one pass of the layer spent its time on this rank.
struct LayerPassStats {
  double seconds = 0.0;
  double projection_seconds = 0.0;   // in the projections' GEMMs
  double attention_seconds = 0.0;    // in the ring (its own waits included)
  double gather_wait_seconds = 0.0;  // blocked waiting for parameter gathers: the exposed part
  double reduce_seconds = 0.0;       // backward: the gradient reduce-scatter
  PassStats attention;
};

class LoraLayer {
 public:
  // Collective over `comm` (it splits off a communicator for the parameter traffic). The
  // parameters start at zero: fill them through projection(p).
  LoraLayer(comm::Communicator& comm, const LayerConfig& config, const ShardLayout& layout, const Mask& mask);
  LoraLayer(const LoraLayer&) = delete;
  LoraLayer& operator=(const LoraLayer&) = delete;

  const LayerConfig& config() const { return config_; }
  const ShardLayout& layout() const { return layout_; }
  const Mask& mask() const { return mask_; }
  const std::vector<int64_t>& positions() const { return ring_.positions(); }
  int64_t rows() const { return ring_.rows(); }
  // Elements of this rank's X (or Y): (batch, rows, d_model).
  size_t activation_elements() const { return static_cast<size_t>(config_.batch * rows() * config_.d_model); }

  ShardedProjection& projection(int p) { return projections_[static_cast<size_t>(p)]; }
  const ShardedProjection& projection(int p) const { return projections_[static_cast<size_t>(p)]; }

  // x (B, rows, d_model) -> y (B, rows, d_model); keeps what backward needs. Collective.
  LayerPassStats forward(const float* x, float* y);
  // After forward on the same x: given dy, computes the LoRA gradients (lora_grad) and dx
  // (B, rows, d_model; skipped when null). Collective.
  LayerPassStats backward(const float* x, const float* dy, float* dx);
  // This rank's slice of a projection's gradient, laid out as projection(p).lora(): the sum over
  // every rank's rows and the batch. Empty for a projection without LoRA.
  std::span<const float> lora_grad(int p) const { return grads_[static_cast<size_t>(p)]; }

  // This rank's rows of the merged weight W0 + (alpha / r) B A, (rows, in). Collective (gathers A).
  std::vector<float> merged_rows(int p);

  // Parameter memory: the slices this rank holds between passes, the whole layer's parameters
  // (what one rank would hold unsharded), and the most gathered-parameter bytes held at once.
  size_t shard_bytes() const;
  size_t full_parameter_bytes() const;
  size_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  size_t gathered_bytes() const;  // held now: 0 between passes
  // Multiply-adds of this rank's projections in one forward, times 2 (FLOPs).
  double projection_flops_forward() const;
  const UlyssesAttention& attention() const { return ring_; }

 private:
  // Runs the four projections in `order`, each gathered just before use with the next one's
  // gather overlapping it; use(p, gathered) does the compute.
  void run_projections(const std::array<int, kProjections>& order, LayerPassStats& stats,
                       const std::function<void(int, const GatheredProjection&)>& use);
  void reduce_scatter_gradients(std::vector<std::vector<float>>& full);
  std::function<void()> progress();

  comm::Communicator& comm_;
  std::unique_ptr<comm::Communicator> params_comm_;  // parameter gathers and gradient reductions
  LayerConfig config_;
  ShardLayout layout_;
  Mask mask_;
  std::unique_ptr<AttentionBackend> backend_;
  UlyssesAttention ring_;  // the ring, with --ulysses the hybrid (layout.ulysses())
  std::vector<ShardedProjection> projections_;
  std::array<GatheredProjection, 2> gathered_;
  std::array<ProjectionGather, 2> gathers_;
  size_t peak_gathered_bytes_ = 0;

  // Activations of the last forward: Q, K, V as the ring stores them (dtype), O and LSE fp32,
  // and u = x A^T of each projection.
  std::vector<uint8_t> q_, k_, v_;
  std::vector<float> o_, lse_;
  std::array<std::vector<float>, kProjections> u_;
  RopeTable rope_;  // cos / sin of this rank's rows
  bool have_forward_ = false;
  std::array<std::vector<float>, kProjections> grads_;
};

}  // namespace ringattn
