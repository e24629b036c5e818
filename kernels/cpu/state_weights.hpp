// The all-reduce merge of partial attention states across ranks (runtime/inference/rank_merge.hpp),
// its two local halves: before the sum, a state's (O w, w) with w = exp(LSE - max LSE over the
// ranks); after it, O = sum(O w) / sum(w), LSE = max + ln sum(w). States are o (batch, rows, heads,
// head_dim) and lse (batch, heads, rows), fp32; dims.kv_heads and dims.scale are not used.
#pragma once

#include <cstdint>

#include "kernels/attention.hpp"

namespace ringattn::kernels {

// sums (o's elements, then lse's) <- (O w, w); w = 0 for an empty share or a row nobody sees
// (LSE or max -inf).
void weigh_states(const AttentionDims& dims, int64_t rows, const float* o, const float* lse, const float* max_lse,
                  float* sums);
// o, lse <- the merged state from the summed (O w, w); O = 0 and LSE = -inf where sum(w) = 0.
void finish_weighted_states(const AttentionDims& dims, int64_t rows, const float* sums, const float* max_lse, float* o,
                            float* lse);

}  // namespace ringattn::kernels
