// One backend's attention kernels as the shared kernel tests see them (attention_cases.hpp, after
// ggml's test-backend-ops): the variants it runs a problem with (element type x kernel, each with
// the same-precision model it is judged by) and its four calls of kernels/attention.hpp on host
// vectors. tests/kernels/cpu and tests/kernels/cuda each implement it once; check_problem judges
// any of them against the fp64 oracle by kernels/error_rule.hpp's rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "tests/support/attention_oracle.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {

struct KernelVariant {
  DType dtype = DType::f32;
  std::string kernel;  // the backend's word for it: "avx512", "tensor_core", "simple"...
  kernels::SamePrecision precision = kernels::SamePrecision::fp32();

  std::string tag() const { return std::string(dtype_name(dtype)) + "/" + kernel; }
};

// How far passes over key chunks may differ from one pass (max |difference|): O and LSE, dQ, dK
// and dV. Kernels that round P relative to a running maximum (bf16/fp16 products) differ at the
// element type's rounding there, since the maximum depends on where the chunks start.
struct ChunkTolerance {
  double forward = 0.0, dq = 0.0, dkv = 0.0;
};

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;
  // Why nothing can run here ("no CUDA device visible"), or empty.
  virtual std::string unavailable() const { return {}; }
  // The variants that run these shapes with inputs of `dtype`; none where the backend lacks the
  // type or the head dim.
  virtual std::vector<KernelVariant> variants(const kernels::AttentionDims& dims, DType dtype) const = 0;
  // Attends the problem's queries to its keys [first, last) and merges the result into (o, lse).
  // Chunks of keys (first > 0 or last < rows_k) need batch 1: their rows are not contiguous across
  // the batch. The inputs are the problem's, already representable in the variant's type.
  virtual void forward(const Problem& p, const KernelVariant& v, int64_t first, int64_t last, std::vector<float>& o,
                       std::vector<float>& lse) const = 0;
  // (o, lse) <- the merge of (o, lse) and (src_o, src_lse).
  virtual void merge(const Problem& p, std::vector<float>& o, std::vector<float>& lse, const std::vector<float>& src_o,
                     const std::vector<float>& src_lse) const = 0;
  // Gradients through keys [first, last), from the whole pass's O and LSE: adds to dq, and to the
  // rows [first, last) of dk and dv (whole-problem tensors).
  virtual void backward(const Problem& p, const KernelVariant& v, int64_t first, int64_t last,
                        const std::vector<float>& o, const std::vector<float>& lse, std::vector<float>& dq,
                        std::vector<float>& dk, std::vector<float>& dv) const = 0;
  virtual ChunkTolerance chunk_tolerance(const KernelVariant& v) const = 0;
};

// Query rows [first, last), at every batch and head (empty when first == last).
struct RowRange {
  int64_t first = 0, last = 0;
};

// Every element type a table case runs with by default (each backend runs those it has).
inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> types{DType::f32, DType::bf16, DType::f16};
  return types;
}

// x rounded to the element type and back (exact for f32).
std::vector<float> rounded(const std::vector<float>& x, DType t);
// The problem with Q, K, V and dO rounded to the element type: what kernels of that type see.
Problem rounded(const Problem& p, DType t);
// Host bytes of x in the element type (x representable in it).
std::vector<uint8_t> encode(const std::vector<float>& x, DType t);

// Forward from an empty state over every key, then the backward from its O and LSE.
Outputs run_kernels(const KernelBackend& backend, const Problem& p, const KernelVariant& v, bool backward = true);

// Runs the problem on every variant the backend has for each of `dtypes` and judges each against
// fp64 (kernels/error_rule.hpp, with the variant's same-precision model): LSE never NaN, the rows
// that see no key exactly those of fp64 (and `empty` among them) with O = 0 and dQ = 0 there, the
// other outputs finite, and each of O, LSE, dQ, dK, dV within the rule's bound. Returns how many
// variants ran.
int check_problem(const KernelBackend& backend, const Problem& p, const std::vector<DType>& dtypes = all_dtypes(),
                  RowRange empty = {});

}  // namespace ringattn::testing
