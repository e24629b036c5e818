// The CPU decode kernel: a few new tokens of one sequence against its cached K/V rows on this rank
// (split-KV decode, as FlashDecoding), giving the partial state (O, LSE) the ranks then merge.
//
// One query row per (token, head) fills the 64-row query tiles of attention_forward badly, and
// decode reads every cached row once per step: it is bound by memory bandwidth, not FLOPs. So the
// H / Hkv query heads of a group (times the new tokens) are the rows of one tile, and each head's
// rows are split into chunks of kDecodeChunkRows that the threads take as they come; the chunks'
// partial states are merged in chunk order, so results do not depend on the thread count. A call
// with kDecodeForwardTokens new tokens or more (a prefill chunk through pass-Q) fills whole query
// tiles, and runs each KV head's group through attention_forward instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/cpu/tile_args.hpp"

namespace ringattn::kernels {

inline constexpr int64_t kDecodeChunkRows = cpu::kDecodeChunkRows;
// From this many new tokens per call (a prefill chunk through pass-Q) the forward kernel serves
// them: half its 64-row query tile. Measured at 512-token chunks (docs/inference.md), not at the
// crossover itself; decode's few tokens stay on the decode kernel's packed rows.
inline constexpr int64_t kDecodeForwardTokens = 32;

// The new tokens of one sequence: q (tokens, H, D), their global positions ascending.
struct DecodeQueries {
  const void* q = nullptr;
  DType dtype = DType::f32;
  int64_t tokens = 1;
  const int64_t* pos = nullptr;
};

// One sequence's cached rows on this rank, head-major (each head's rows contiguous, the layout
// that streams): head g's row j at k + (g * head_stride + j) * D elements; positions ascending.
struct CachedKeyValues {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t head_stride = 0;  // rows between two heads' first rows (the cache's capacity)
  const int64_t* pos = nullptr;
};

// The rows [first, last) of `kv` that some query sees under causal + window_left (-1: unbounded):
// where the cache holds none, this rank need not compute (nor send) anything.
struct VisibleRows {
  int64_t first = 0, last = 0;
  bool empty() const { return last <= first; }
};
VisibleRows decode_visible_rows(const DecodeQueries& q, const CachedKeyValues& kv, int64_t window_left);

// Writes the state of the queries against the visible rows of `kv` (causal, and the left window):
// state.o (tokens, H, D) normalised, state.lse (H, tokens) natural log; O = 0 and LSE = -inf for a
// row that sees none of them. dims.batch is ignored (one sequence).
void decode_forward(const AttentionDims& dims, const DecodeQueries& q, const CachedKeyValues& kv,
                    int64_t window_left, const AttentionState& state, const CpuOptions& options);

// Bytes of K/V the call reads: what its bandwidth is counted by.
uint64_t decode_bytes_read(const AttentionDims& dims, const CachedKeyValues& kv, int64_t window_left,
                           const DecodeQueries& q);

// The yardstick of the decode benchmark: the read bandwidth of this machine on `threads` threads,
// each summing its part of a buffer of `bytes` (placed by first touch from the thread that reads
// it). One pass() is one measurement (bytes/s), so that a benchmark can interleave them with the
// kernel's calls and compare rates measured under the same load.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(int threads, size_t bytes);
  double pass();

 private:
  int threads_;
  std::vector<float> buffer_;
};

}  // namespace ringattn::kernels
