// The attention job's inputs: each rank reads (or generates) only its own rows, one tensor at a
// time into the backend's memory, and keeps a host copy only where the check needs one.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launch/attention/attention_options.hpp"
#include "launch/cli/test_seam.hpp"
#include "runtime/backend.hpp"
#include "runtime/random_inputs.hpp"

namespace ringattn {

struct AttentionInputs {
  // In the backend's memory, in the job's element type (what the ring computes with: with
  // RINGATTN_TEST_FAULT=gqa-head, K and V with two heads swapped).
  DeviceBuffer q, k, v, dout;
  // The true inputs on the host, fp32 (bf16-rounded under --dtype bf16: what the kernels see),
  // for --check; empty where the check reads the backend's buffers themselves.
  std::vector<float> host_q, host_k, host_v, host_dout;
  std::vector<std::string> notes;  // conversions to report once (rank 0)
};

// This rank's rows at `positions` of every input (collective in nothing; run it in an agreed
// phase). Throws ArgumentError naming the file for a NaN/Inf (unless --no-check-finite) or a value
// bfloat16 cannot hold.
AttentionInputs load_attention_inputs(const Job& job, const std::vector<int64_t>& positions,
                                      AttentionBackend& backend, const TestFault& fault);

}  // namespace ringattn
