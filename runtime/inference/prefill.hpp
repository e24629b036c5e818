// Prefill: attention of new tokens (a whole prompt, or a chunk appended to what is cached:
// chunked prefill, multi-turn) against the cache and themselves, causal, with the K/V stored.
//
// Two exact methods (Meta's context-parallel inference, arXiv 2411.01783):
//   pass-KV: each rank holds its rows of the chunk (the causal zigzag layout of its T tokens). The
//            chunk's K/V go round the ring as in training (RingAttention), and each rank's cached
//            share is then sent to every other rank, one peer per step, the next step's transfer
//            posted before this one's compute; the chunk's rows stay where they were computed.
//   pass-Q:  every rank holds the whole chunk: each attends it to its own share (cache plus the
//            chunk rows the cache's placement gives it) and the partial states are merged across
//            the ranks; nothing cached moves. decode.hpp's computation with T = the chunk.
// The rule (Meta's): pass-KV when T / (T + P) >= 2 Hkv / H (T new, P cached tokens: the K/V pass-KV
// moves is then no more than the queries and outputs pass-Q moves), or when T is large enough
// that the ring's compute hides its transfers; pass-Q otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/inference/decode.hpp"
#include "runtime/inference/kv_cache.hpp"
#include "runtime/session.hpp"

namespace ringattn::inference {

enum class PrefillMethod { automatic, pass_kv, pass_q };
const char* prefill_method_name(PrefillMethod m);  // "auto", "pass-kv", "pass-q"
// Parses "auto", "pass-kv" or "pass-q"; ArgumentError naming `method` otherwise.
PrefillMethod parse_prefill_method(const std::string& name);

// Rows per rank from which pass-KV's ring is taken to hide its transfers whatever the cache holds.
inline constexpr int64_t kPassKvHidingRows = 4096;
// The method the rule picks for T new tokens after `cached` ones (the longest sequence's).
PrefillMethod choose_prefill_method(int64_t new_tokens, int64_t cached, int64_t heads, int64_t kv_heads, int ranks);

struct PrefillRequest {
  int64_t heads = 1;
  int64_t tokens = 0;  // T, the chunk's tokens per sequence (the same for the call's sequences)
  float scale = 0.125f;
  int64_t window_left = -1;
  int threads = 0;
  PrefillMethod method = PrefillMethod::automatic;
  std::vector<int64_t> sequences;  // as DecodeRequest (empty: all)
};

struct PrefillStats {
  PrefillMethod method = PrefillMethod::pass_kv;  // the one that ran
  double seconds = 0.0;
  uint64_t bytes_sent = 0;  // by this rank: the ring's K/V and the cached shares (pass-KV), or the merge's
};

// The rows of the chunk this rank passes and gets back: its rows of the T-token causal layout for
// pass-KV and auto, all T for pass-Q (and for auto when T is less than the ranks: no layout
// shards it, and the rule would pick pass-Q anyway).
int64_t prefill_rows(const Session& session, const PrefillRequest& request, PrefillMethod method);
// This rank's positions in the chunk (0-based within it), ascending.
std::vector<int64_t> prefill_chunk_positions(const Session& session, const PrefillRequest& request,
                                             PrefillMethod method);

// Checks as check_decode (minus "never filled"); the chunk's rows must fit the capacity.
std::optional<ArgumentError> check_prefill(const Session& session, const KVCache& cache, const PrefillRequest& request);

// q (n, rows, H, D), k and v (n, rows, Hkv, D) (rows: prefill_rows of the method the request
// names, auto's being pass-KV's), the cache's dtype, host memory; writes this rank's o
// (n, rows, H, D) and lse (n, H, rows). With auto, the rule's choice runs (pass-Q gathers the
// chunk first).
PrefillStats prefill(Session& session, KVCache& cache, const PrefillRequest& request, const void* q, const void* k,
                     const void* v, float* o, float* lse);

}  // namespace ringattn::inference
