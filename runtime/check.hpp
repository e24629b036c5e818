// --check: the distributed result compared with an fp64 reference on sampled rows, without any
// rank holding more than its shard. The sampled query rows (and key rows) are shared with every
// rank; each rank computes their fp64 partial results against its own shard; partial states are
// merged across ranks (max, then weighted sums) and the owner of each row compares.
// Forward: O and LSE of sampled queries. Backward: dQ of sampled queries (against fp64 LSE and
// delta), and dK, dV of sampled keys (their sums over every rank's queries use the run's own
// LSE and delta = rowsum(dO * O), already checked on the sampled rows).
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.hpp"
#include "kernels/attention.hpp"
#include "kernels/mask/mask.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

// This rank's inputs and results, host fp32 (bf16 inputs converted, i.e. exactly what the kernels saw).
struct CheckTensors {
  const float* q = nullptr;  // (B, rows, H, D)
  const float* k = nullptr;  // (B, rows, Hkv, D)
  const float* v = nullptr;
  const float* o = nullptr;
  const float* lse = nullptr;  // (B, H, rows)
  const float* dout = nullptr;  // backward only, like q
  const float* dq = nullptr;
  const float* dk = nullptr;
  const float* dv = nullptr;
  // bf16 inputs: the kernels may round P and dS to bf16 before their products (FlashAttention-2's
  // bf16 contract, README "The kernel"), which the gradients' tolerances then allow for.
  bool bf16_products = false;
};

struct CheckReport {
  int samples = 0;
  double err_o = 0, err_lse = 0, err_dq = 0, err_dk = 0, err_dv = 0;  // max abs errors
  double tol_o = 0, tol_lse = 0, tol_dq = 0, tol_dk = 0, tol_dv = 0;
  bool backward = false;
  bool passed() const;
  double max_abs_err() const;
  std::string describe() const;  // "o 1.2e-07 (tol 1e-04), lse ..."
};

CheckReport check_sampled_rows(comm::Communicator& comm, const ShardLayout& layout, const Mask& mask,
                               const kernels::AttentionDims& dims, const CheckTensors& local, bool backward,
                               int samples, uint64_t seed);

}  // namespace ringattn
