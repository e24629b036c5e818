// What the CUDA backend does around a cuDNN SDPA call (kernels/cudnn/sdpa_engine.hpp), on the
// device: merging the call's bf16 O and its Stats into the step's fp32 state, gathering the global
// LSE into the call's Stats layout for the backward, and adding the call's bf16 dQ, dK, dV to the
// fp32 gradients. `segments` is the call's SdpaSegment table in device memory; sequence n of the
// call is segment n % nseg of batch entry n / nseg. Buffers are laid out as the step's Q (rows of
// H x D) or K/V (rows of Hkv x D) over `rows` rows per batch entry; Stats is (B x nseg, H, s_q).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention.hpp"
#include "kernels/cudnn/step_plan.hpp"
#include "util/dtype.hpp"

namespace ringattn::kernels {

// state (o, lse over q_rows rows) <- merge(state, call): rows whose Stats is -inf or NaN (cuDNN's
// fully masked rows) leave the state as it is.
void cuda_merge_sdpa_output(const AttentionDims& dims, int64_t q_rows, const cudnn::SdpaSegment* segments, int64_t nseg,
                            int64_t s_q, const bf16_bits* o_call, const float* stats, const AttentionState& state,
                            cudaStream_t stream);

// stats (B x nseg, H, s_q) <- the rows of lse (B, H, q_rows) the segments hold (0 past a segment's rows).
void cuda_gather_sdpa_stats(const AttentionDims& dims, int64_t q_rows, const cudnn::SdpaSegment* segments, int64_t nseg,
                            int64_t s_q, const float* lse, float* stats, cudaStream_t stream);

// dst rows [row0, row0 + count) of every batch entry += src's (bf16), for one segment's query
// rows (keys = false) or key rows (keys = true); rows of row_elems elements over `rows` rows.
void cuda_add_sdpa_rows(float* dst, const bf16_bits* src, int64_t batch, int64_t rows, int64_t row_elems, int64_t row0,
                        int64_t count, cudaStream_t stream);

}  // namespace ringattn::kernels
