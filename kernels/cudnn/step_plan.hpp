// Which cuDNN fused-attention (SDPA) calls compute one ring step, decided on the host from the
// step's positions and the mask alone (no cuDNN header here): every rank, given the same step and
// the same capabilities, makes the same calls, and the tests check the calls exhaustively on the CPU
// (tests/kernels/cudnn/test_step_plan.cpp).
//
// A step is its query rows and its key rows, each with strictly increasing global positions (a
// shard, a received block). Those split into arithmetic runs (consecutive rows whose positions
// advance by a constant stride: contiguous and zigzag shards give one or two runs of stride 1, a
// striped shard one run of stride P). Between a query run and a key run of the same stride s, the
// causal and window conditions of docs/reference.md are a diagonal band in row indices: with i = a + s r and
// j = b + s c,
//   j <= i + hi      <=>  c <= r + floor((a - b + hi) / s)
//   j >= i - left    <=>  c >= r + ceil((a - b - left) / s)
// which is what cuDNN's diagonal band expresses (right bound R: keep c <= r + R; left bound W:
// keep c >= r - W + 1; bottom-right alignment shifts both by s_kv - s_q of each sequence). Rows
// and keys that see nothing are trimmed, so every call starts on a row and a key that are seen.
// Documents cut the band into one sequence per document, packed into one call by ragged offsets
// with per-sequence lengths when their bands agree (top-left or bottom-right), else several calls.
// A block mask maps onto cuDNN's 128 x 128 tile mask where the rows are contiguous and the mask's
// blocks are multiples of 128 (the call cut at multiples of 128 positions); the forward only
// (cuDNN's backward has no block mask), and before cuDNN 9.21 only for calls without a band. The step's calls write disjoint (query, key) pairs whose
// union is exactly the step's visible pairs: their states merge into the step's.
//
// Everything else runs on our kernels: long runs of different strides, block masks that do not
// align, a step of one query and one key (cuDNN refuses s_q = s_kv = 1; a lone pair in a larger
// step takes a masked neighbouring key), and whatever the caller rules out before (fp32 inputs,
// head dims cuDNN refuses).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mask/mask_view.hpp"

namespace ringattn::kernels::cudnn {

// cuDNN's block-mask tile (TILE_M = TILE_N = 128 in cudnn-frontend's SDPA block-mask sample).
inline constexpr int64_t kMaskTile = 128;

// What the cuDNN in use can express, from its version (the same library on every rank of a job).
struct SdpaCapabilities {
  bool ragged = true;               // packed sequences: ragged offsets with per-sequence lengths
  bool block_mask_forward = false;  // the forward's tile mask (cuDNN 9.14 and later)
  bool block_mask_with_band = false;  // and with a diagonal band in the same call (9.21 and later)
};

enum class SdpaPass { forward, backward };
enum class DiagonalAlignment { top_left, bottom_right };

// One cuDNN sequence: query rows [q_row0, q_row0 + q_rows) and key rows [k_row0, k_row0 + k_rows)
// of the step's buffers (local rows, not positions).
struct SdpaSegment {
  int64_t q_row0 = 0, q_rows = 0;
  int64_t k_row0 = 0, k_rows = 0;
};

// One SDPA call, in cuDNN's terms. Sequence s of a call (s = 0 for a dense call) is segment s; with
// a batch of B, sequence (b, s) is segment s of batch entry b.
struct SdpaCall {
  std::vector<SdpaSegment> segments;
  bool ragged = false;   // segments packed by ragged offsets (several sequences per batch entry)
  bool padding = false;  // per-sequence lengths given (cuDNN's padding mask; every ragged call)
  DiagonalAlignment alignment = DiagonalAlignment::top_left;
  int64_t right_bound = -1;  // diagonal band right bound (>= 0), -1: none
  int64_t left_bound = -1;   // diagonal band left bound (>= 1), -1: none
  // Dense calls with a block mask: tiles_q x tiles_k tiles of kMaskTile rows and keys from the
  // call's first row and key, row-major, nonzero = kept. Empty: no tile mask.
  std::vector<uint8_t> tiles;
  int64_t tiles_q = 0, tiles_k = 0;
  // One query and one key widened by a neighbouring key that the band masks (cuDNN refuses
  // s_q = s_kv = 1): the call's keys include one that no row sees.
  bool widened = false;

  int64_t max_q_rows() const;  // cuDNN's s_q (the longest sequence)
  int64_t max_k_rows() const;  // s_kv
  bool has_tiles() const { return !tiles.empty(); }
};

struct StepPlan {
  bool cudnn = false;  // false: our kernels run the step (own_reason says why)
  std::string own_reason;
  std::vector<SdpaCall> calls;  // in merge order; none when no pair of the step is visible
};

struct StepRows {
  const int64_t* pos = nullptr;  // strictly increasing global positions
  int64_t rows = 0;
};

// The calls of one step for one pass (the backward's calls are the forward's without tile masks;
// a step that needs one runs our backward).
StepPlan plan_step(const MaskView& mask, StepRows queries, StepRows keys, const SdpaCapabilities& caps, SdpaPass pass);

// Arithmetic runs of a row set: rows [row0, row0 + count) at positions start + t * stride.
struct PositionRunOfRows {
  int64_t row0 = 0, count = 0, start = 0, stride = 1;
};
std::vector<PositionRunOfRows> arithmetic_runs(StepRows rows);

}  // namespace ringattn::kernels::cudnn
