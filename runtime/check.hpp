// --check: the distributed result compared with an fp64 reference on sampled rows, without any
// rank holding more than its shard. The sampled query rows (and key rows) are shared with every
// rank; each rank computes their fp64 partial results against its own shard; partial states are
// merged across ranks (max, then weighted sums) and the owner of each row compares.
// Forward: O and LSE of sampled queries. Backward: dQ of sampled queries (against fp64 LSE and
// delta), and dK, dV of sampled keys, summed over every query that sees them with fp64 LSE and
// delta = rowsum(dO * O) recomputed here for those queries (distributed the same way, in chunks)
// as long as that costs at most max(16 x the forward check, 2^30 multiply-adds); keys seen by more
// (in full causal attention, keys far from the end) use the run's LSE and delta, which the forward
// check verified on the sampled rows. Every tensor is judged by kernels/error_rule.hpp.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.hpp"
#include "kernels/attention.hpp"
#include "kernels/error_rule.hpp"
#include "kernels/reference.hpp"
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
};

struct CheckReport {
  int samples = 0;          // sampled query rows (O, LSE, dQ) and key rows (dK, dV)
  int keys_recomputed = 0;  // sampled keys whose dK/dV reference used fp64 LSE and delta recomputed here
  bool backward = false;
  // Each tensor by kernels/error_rule.hpp: the run's error, the same-precision error, the bound.
  kernels::TensorError o, lse, dq, dk, dv;
  bool passed() const;
  int wrong() const;  // tensors over their bound
  double max_abs_err() const;
  std::string describe() const;  // "o 1.2e-07 (bound 4.0e-07), lse ..."
};

// `precision` is how the kernels that ran compute (kernels/reference.hpp): the same-precision
// reference is computed that way, distributed like the fp64 one (each rank's partial, merged).
CheckReport check_sampled_rows(comm::Communicator& comm, const ShardLayout& layout, const Mask& mask,
                               const kernels::AttentionDims& dims, const CheckTensors& local, bool backward,
                               int samples, uint64_t seed,
                               kernels::SamePrecision precision = kernels::SamePrecision::fp32());

}  // namespace ringattn
