// Naive fp64 attention: the oracle every kernel and every distributed run is checked against.
// Row by row, O(rows_q * rows_k) time and O(rows_k) extra memory; no (L x L) buffer.
// Layouts as in attention_cpu.hpp; inputs are fp32 (bf16 data is compared after conversion).
#pragma once

#include <cstdint>

#include "kernels/attention.hpp"
#include "kernels/mask/mask_view.hpp"

namespace ringattn::kernels {

// O (B, rows_q, H, D) and LSE (B, H, rows_q) of the queries against the given keys only
// (a partial state: LSE = -inf and O = 0 for rows that see none of them). When given,
// *max_abs_score receives the largest |scaled score| of a visible pair (it sets how much fp32
// rounding of the scores any implementation must show).
void reference_forward(const AttentionDims& dims, const float* q, const int64_t* q_pos, int64_t q_rows,
                       const float* k, const float* v, const int64_t* k_pos, int64_t k_rows, const MaskView& mask,
                       double* o, double* lse, double* max_abs_score = nullptr);

// Adds the gradients through the given keys, using the queries' full-softmax LSE and
// delta = rowsum(dO * O): dq (B, rows_q, H, D), dk and dv (B, rows_k, Hkv, D); a null gradient
// is not computed. When `magnitude` is given, its dq/dk/dv (same shapes, may be null) receive the
// sums of the absolute values of the terms, with |dP| + |delta| in place of dP - delta: the
// scale against which rounding errors of any implementation must be judged (a gradient that
// cancels to ~0 still carries the rounding of its terms).
struct GradientMagnitudes {
  double* dq = nullptr;
  double* dk = nullptr;
  double* dv = nullptr;
};
void reference_backward(const AttentionDims& dims, const float* q, const int64_t* q_pos, int64_t q_rows,
                        const float* k, const float* v, const int64_t* k_pos, int64_t k_rows, const float* dout,
                        const double* lse, const double* delta, const MaskView& mask, double* dq, double* dk,
                        double* dv, const GradientMagnitudes* magnitude = nullptr);

// The same computation in plain fp32 (scores, softmax, products in float): the "same precision
// reference" whose error against fp64 sets the bound of every check (kernels/error_rule.hpp).
// Inputs are what the kernel saw (bf16 inputs converted exactly), so fp32 accumulation models the
// bf16 kernels too; SamePrecision (kernels/attention.hpp) says where P and dS are rounded to bf16
// or fp16 before their products (the tensor cores, the CPU's bf16 dot product in the backward), and
// with *_step_outputs the call's O, or its contribution to dq, dk and dv, is rounded to bf16 (one
// ring step's result on cuDNN; callers make one call per step's keys).
void naive_forward_fp32(const AttentionDims& dims, const float* q, const int64_t* q_pos, int64_t q_rows,
                        const float* k, const float* v, const int64_t* k_pos, int64_t k_rows, const MaskView& mask,
                        float* o, float* lse, SamePrecision precision = SamePrecision::fp32());
void naive_backward_fp32(const AttentionDims& dims, const float* q, const int64_t* q_pos, int64_t q_rows,
                         const float* k, const float* v, const int64_t* k_pos, int64_t k_rows, const float* dout,
                         const float* lse, const float* delta, const MaskView& mask, float* dq, float* dk,
                         float* dv, SamePrecision precision = SamePrecision::fp32());

}  // namespace ringattn::kernels
