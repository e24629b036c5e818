// Decode against the sharded KV cache: T new tokens per sequence (usually 1, a few for
// speculative decoding), the same q, k, v on every rank. The new K/V rows go to the ranks the
// cache's placement names; every rank whose share holds a row some new query sees computes its
// partial state over its rows with the decode kernel, and the states are merged exactly across
// the ranks (rank_merge.hpp). A pass-Q prefill is the same computation with a whole chunk as T.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "comm/communicator.hpp"
#include "ringattn/errors.hpp"
#include "runtime/inference/kv_cache.hpp"
#include "runtime/inference/rank_merge.hpp"
#include "runtime/session.hpp"

namespace ringattn::inference {

struct DecodeRequest {
  int64_t heads = 1;
  int64_t tokens = 1;          // T, new tokens per sequence
  float scale = 0.125f;        // softmax scale
  int64_t window_left = -1;    // causal, and keys no further back than this (-1: unbounded)
  int threads = 0;             // CPU threads (0: OpenMP's default)
  // The sequences of the cache q's batch holds, in order (empty: all of them, 0..batch-1).
  std::vector<int64_t> sequences;
  // The position of each one's first new token (empty: its length, i.e. the next one).
  std::vector<int64_t> positions;
  // A pass-Q prefill: the cache may be empty.
  bool prefill = false;
};

struct DecodeStats {
  double seconds = 0.0;           // this rank's wall time of the call
  double compute_seconds = 0.0;   // in the decode kernel
  double merge_seconds = 0.0;     // in the merge across ranks
  uint64_t bytes_read = 0;        // cached K/V bytes the kernel read on this rank
  bool computed = false;          // this rank's share held a visible row
  MergeStats merge;
};

// The sequences a request names: `given`, or all of the cache's when empty.
std::vector<int64_t> sequences_of(const KVCache& cache, const std::vector<int64_t>& given);

// Why the call cannot run (an ArgumentError naming the argument), found the same on every rank
// for the same arguments, before the cache changes: a cache never filled, a sequence index out of
// range or repeated, a first position that is not the sequence's next, or rows past the capacity.
std::optional<ArgumentError> check_decode(const KVCache& cache, const DecodeRequest& request);

// q (n, T, H, D), k and v (n, T, Hkv, D) in the cache's dtype, n = the request's sequences;
// writes o (n, T, H, D) and lse (n, H, T), fp32, the same on every rank, complete on return. All
// in the session's backend memory (the cache's). The states merge over the session's world (CPU)
// or its transport (CUDA: NCCL or host-staged MPI). Throws the check's ArgumentError with the
// cache unchanged.
DecodeStats decode_step(Session& session, KVCache& cache, const DecodeRequest& request, const void* q, const void* k,
                        const void* v, float* o, float* lse);

// The communicator the states of a decode or prefill move on: one on the backend's memory.
comm::Communicator& states_communicator(Session& session);

}  // namespace ringattn::inference
