// One projection of the LoRA attention layer, y = x W^T + bias with W = W0 + s B A (s = alpha / r), its
// parameters sharded over the ranks, and the arithmetic on it (docs/layer.md).
//
// File layouts (PyTorch nn.Linear): W0 (out, in), A (r, in), B (out, r). Rank p of P holds
//   W0 rows [out_p)          rows `rows(p)` of W0: about out/P of them
//   bias [out_p)             the same entries of the (optional, frozen) bias
//   B rows  [out_p)          the same rows of B
//   A columns [in_p)         columns `cols(p)` of A, stored transposed: rows of A^T (in, r)
// where [out_p) and [in_p) are the near-equal contiguous chunks of even_chunk(). Cutting A by its
// columns (not its r rows) keeps every rank's share ~1/P even when P > r, and makes both the
// gathered A^T and the per-rank gradient blocks of dA^T contiguous, so gathers and
// reduce-scatters need no reshuffling.
//
// The LoRA path is computed as (x A^T) B^T: B A is never formed except by merge. The arithmetic runs
// on LayerOps (layer_ops.hpp): the same calls on the CPU and on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/backend.hpp"
#include "runtime/lora/layer_ops.hpp"
#include "runtime/ring_plan.hpp"

namespace ringattn {

// Chunk `part` of n items cut into `parts` contiguous chunks whose sizes differ by at most one
// (the first n % parts are one longer).
RowRange even_chunk(int64_t n, int parts, int part);

struct ProjectionShape {
  int64_t out = 0;   // rows of W0 and B
  int64_t in = 0;    // columns of W0 and A
  int64_t rank = 0;  // r; 0 = no LoRA factors
  bool bias = false; // a frozen bias (out,)
  bool has_lora() const { return rank > 0; }
};

enum class ProjectionPart { w0, lora_a, lora_b, bias };

// This rank's slice of one projection's parameters.
class ShardedProjection {
 public:
  ShardedProjection(const ProjectionShape& shape, int ranks, int rank);

  const ProjectionShape& shape() const { return shape_; }
  int ranks() const { return ranks_; }
  RowRange rows(int rank) const { return even_chunk(shape_.out, ranks_, rank); }  // of W0 and B
  RowRange cols(int rank) const { return even_chunk(shape_.in, ranks_, rank); }   // of A
  RowRange rows() const { return rows(rank_); }
  RowRange cols() const { return cols(rank_); }

  // W0 rows (rows, in), frozen. (The non-const accessors count as writes: see version().)
  std::span<float> w0() {
    ++versions_[0];
    return w0_;
  }
  std::span<const float> w0() const { return w0_; }
  // Bias entries of rows() (empty without a bias), frozen.
  std::span<float> bias() {
    ++versions_[2];
    return bias_;
  }
  std::span<const float> bias() const { return bias_; }
  // The trainable slice: [A^T rows (cols, r) | B rows (rows, r)]. Gradients and optimizer state
  // have this layout too.
  std::span<float> lora() {
    ++versions_[1];
    return lora_;
  }
  std::span<const float> lora() const { return lora_; }
  std::span<const float> lora_a_t() const { return std::span<const float>(lora_).first(a_elements(rank_)); }
  std::span<const float> lora_b() const { return std::span<const float>(lora_).subspan(a_elements(rank_)); }
  size_t a_elements(int rank) const;  // of rank's A^T slice
  size_t b_elements(int rank) const;  // of rank's B slice

  // Calls f(row, col, index) for every element of `part` this rank holds: (row, col) in the
  // file layout of the part (a bias is (out, 1)), index into w0(), bias() or lora() (A and B).
  void for_each_owned(ProjectionPart part, const std::function<void(int64_t, int64_t, size_t)>& f) const;
  // Sets every owned element of `part` to value(row, col).
  void fill(ProjectionPart part, const std::function<float(int64_t, int64_t)>& value);

  size_t bytes() const { return sizeof(float) * (w0_.size() + bias_.size() + lora_.size()); }
  size_t full_bytes() const;  // of the whole projection, on one rank

  // How often a part was handed out for writing (the non-const w0(), bias(), lora(), fill()): a
  // copy of the part made at another version may be stale. A and B share lora()'s version.
  uint64_t version(ProjectionPart part) const { return versions_[version_index(part)]; }

 private:
  static size_t version_index(ProjectionPart part) {
    return part == ProjectionPart::w0 ? 0 : part == ProjectionPart::bias ? 2 : 1;
  }
  ProjectionShape shape_;
  int ranks_, rank_;
  std::vector<float> w0_, bias_, lora_;
  uint64_t versions_[3] = {0, 0, 0};  // w0, lora (A and B), bias
};

// A projection's whole parameters, assembled on one rank for the time of its use, in the layer's
// memory (LayerOps): W0 (out, in), A^T (in, r) and B (out, r) as GEMM operands of `type`, the bias
// (out,) in fp32 (null without one). A view into a buffer the layer owns.
struct GatheredProjection {
  ProjectionShape shape;
  DType type = DType::f32;
  void* w0 = nullptr;
  void* a_t = nullptr;
  void* b = nullptr;
  float* bias = nullptr;

  // The bytes a buffer must have to hold a projection of this shape and type.
  static size_t bytes(const ProjectionShape& shape, DType type);
  // The parts laid out in `memory` (at least bytes(shape, type) of it).
  static GatheredProjection at(void* memory, const ProjectionShape& shape, DType type);
};

// This rank's slices of a projection in the layer's memory, laid out as ShardedProjection holds
// them (W0 rows, A^T rows, B rows in the GEMM type; bias rows in fp32): what a gather sends.
struct ProjectionSlices {
  const void* w0 = nullptr;
  const void* a_t = nullptr;
  const void* b = nullptr;
  const float* bias = nullptr;
};

// The copy of this rank's slices in the layer's memory and GEMM type, refreshed from the host
// copy (ShardedProjection) for the parts that changed since (their version()). With fp32 on the
// CPU it is the host copy itself.
class SliceMirror {
 public:
  // Brings every changed part over (blocking: complete on return).
  void refresh(const ShardedProjection& p, AttentionBackend& backend, DType type);
  const ProjectionSlices& slices() const { return slices_; }
  size_t bytes() const { return storage_.bytes(); }

 private:
  DeviceBuffer storage_;
  ProjectionSlices slices_;
  bool copied_ = false;
  uint64_t versions_[3] = {};  // of the parts copied: w0, lora (A and B), bias
};

// The all-gather of one projection as one communicator step (Communicator::post_step): every
// rank sends its slices straight to every other rank, so it moves while the caller computes (on
// NCCL one group of ncclSend/ncclRecv, ordered after the compute stream's work; over MPI
// point-to-point transfers that progress() advances). Each rank sends and receives (P-1)/P of the
// projection, what a ring all-gather moves. Every rank starts the same gathers in the same order.
class ProjectionGather {
 public:
  // Posts the transfers that assemble `p` in `dst` from every rank's slices (`mine` are this
  // rank's, copied into `dst` by `ops`). `mine` must stay unchanged, and `dst` unread, until
  // finish(); the caller has waited for the work that last used `dst`.
  void start(comm::Communicator& comm, LayerOps& ops, const ShardedProjection& p, const ProjectionSlices& mine,
             const GatheredProjection& dst);
  // Blocks until every transfer is done; returns the seconds blocked (the exposed gather time).
  double finish(comm::Communicator& comm, const std::string& what);

 private:
  comm::StepHandle step_;
};

// y (n, out) = x (n, in) W0^T + bias + s u B^T with u = x A^T (n, r). x is a GEMM operand of
// w.type; u receives x A^T in fp32 and u_op the same as an operand of w.type (u_op may be u with
// fp32), which the backward pass takes. Without LoRA, u and u_op are not used.
void projection_forward(LayerOps& ops, const GatheredProjection& w, float scaling, const void* x, int64_t n, float* y,
                        float* u, void* u_op);

// Given dy_op (n, out), the gradient of y as an operand of w.type, and the forward's x and u_op:
// with du = s dy B (n, r; fp32 in du, as an operand in du_op, which may be du with fp32),
//   grad_a_t (in, r) += x^T du,   grad_b (out, r) += s dy^T u    (sums over these n rows)
//   dx (n, in) = dy W0 + du A     (+= when accumulate_dx; skipped when dx is null)
// (the bias is frozen and does not enter dx: it has no gradient here)
void projection_backward(LayerOps& ops, const GatheredProjection& w, float scaling, const void* x, const void* u_op,
                         const void* dy_op, int64_t n, float* dx, bool accumulate_dx, float* grad_a_t, float* grad_b,
                         float* du, void* du_op);

// Every owned element of `part` <- scale * N(0, 1) from the seeded generator of random_inputs.hpp,
// indexed by its global (row, col): the same values for any number of ranks.
void fill_normal(ShardedProjection& p, ProjectionPart part, uint64_t seed, uint64_t stream, float scale);
// Fresh LoRA factors as PEFT initialises them: B = 0, and A with the variance of PEFT's
// Kaiming-uniform init, 1 / (3 in) (here normal), so that W starts as W0.
void init_lora_factors(ShardedProjection& p, uint64_t seed, uint64_t stream);
// The generator stream of init_lora_factors for projection p (activations use 1..6).
inline uint64_t lora_init_stream(int p) { return 28 + uint64_t(p); }

// This rank's rows of the merged weight W0 + s B A, (rows, in), given the whole A^T (in, r).
std::vector<float> merge_rows(const ShardedProjection& p, std::span<const float> a_t, float scaling);

}  // namespace ringattn
