// The CPU decode kernel: a few new tokens of one sequence against its cached K/V rows on this rank
// (split-KV decode, as FlashDecoding), giving the partial state (O, LSE) the ranks then merge.
//
// One query row per (token, head) fills the 64-row query tiles of attention_forward badly, and
// decode reads every cached row once per step: it is bound by memory bandwidth, not FLOPs. So the
// H / Hkv query heads of a group (times the new tokens) are the rows of one tile, and each head's
// rows are split into chunks of kDecodeChunkRows that the threads take as they come; the chunks'
// partial states are merged in chunk order, so results do not depend on the thread count. A call
// with enough new tokens to fill its query tiles (a prefill chunk through pass-Q; see
// decode_runs_forward_kernel) runs each KV head's group through attention_forward instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/cpu/tile_args.hpp"

namespace ringattn::kernels {

inline constexpr int64_t kDecodeChunkRows = cpu::kDecodeChunkRows;
// Whether a call with `tokens` new tokens per sequence runs on the forward kernel rather than the
// decode kernel: when they fill its query tiles at least 7/8 full (with 64-row tiles: 56-64
// tokens, 113-128, ..., and every chunk of 449 or more). Each KV head's group runs the forward kernel
// as G heads of `tokens` rows, so its cost goes by whole tiles, each streaming the cache once, while
// the decode kernel's goes by tokens. Measured (fp32, 8192 cached rows, 1 thread, G 1-8, D 64 and
// 128): one tile cost as much as 46-59 tokens on the decode kernel; at 32 tokens the forward kernel
// was 1.4-1.9x slower, at 48 faster in one case of four, at 64 1.1-1.4x faster, at 96 (two tiles)
// slower in two of three.
bool decode_runs_forward_kernel(int64_t tokens);
// How a call with `tokens` new tokens rounds (the --check's model): the decode kernel is fp32
// throughout; a call on the forward kernel rounds as it does (cpu_same_precision: P in bf16 on AMX).
SamePrecision decode_same_precision(int64_t tokens, DType dtype);

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
