// The sampled check of one process holding a whole problem (`bench --kernel`, the GPU benchmark),
// by kernels/error_rule.hpp: O, LSE and dQ of sampled query rows, dK and dV of sampled key rows,
// each against fp64 and against the same-precision reference. dK/dV use fp64 LSE and delta
// recomputed for every query that sees the sampled keys, as long as that costs at most
// kRecomputeMacs multiply-adds (cheapest keys first); keys seen by more use the kernel's LSE and
// delta. (The distributed --check, runtime/check.hpp, does the same without gathering anything.)
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/error_rule.hpp"
#include "kernels/mask/mask_view.hpp"
#include "kernels/reference.hpp"

namespace ringattn::kernels {

inline constexpr double kRecomputeMacs = double(int64_t{1} << 31);

// Inputs as the kernel saw them (bf16 converted to fp32), positions 0..L-1; layouts of
// kernels/attention.hpp with rows = L.
struct WholeProblem {
  AttentionDims dims;
  int64_t seq_len = 0;
  MaskView mask;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  SamePrecision precision = SamePrecision::fp32();
};

// The kernel's results; dq, dk, dv null when only the forward pass ran.
struct KernelResults {
  const float *o = nullptr, *lse = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

struct SampledErrors {
  TensorError o, lse, dq, dk, dv;
  int keys_recomputed = 0;
  int wrong_forward() const { return !o.passed() + !lse.passed(); }
  int wrong_backward() const { return !dq.passed() + !dk.passed() + !dv.passed(); }
};

// Forward states of S query rows in fp64 and in the same precision: O (B, S, H, D), LSE and
// delta (B, H, S). Shared with the distributed --check (runtime/check.cpp), so that both checks
// build their references from one piece of code and judge by the same numbers.
struct RowStates {
  double max_score = 0.0;  // largest |scaled score| of a visible pair (set by the distributed check)
  std::vector<double> o, lse, delta;
  std::vector<float> o32, lse32, delta32;
};

// delta = rowsum(dO * O) in both precisions, (B, H, S), from st.o, st.o32 and dO (B, S, H, D); the
// same-precision one from O rounded to bf16 where the backward reads it so (backward_step_outputs).
void add_deltas(const AttentionDims& dims, int64_t S, const std::vector<float>& dout, RowStates& st,
                SamePrecision precision = SamePrecision::fp32());

// Visible keys of the query at position i of an L-row sequence (an upper bound under a block
// mask): the cost measure of both checks' recompute budgets.
int64_t keys_seen(const MaskView& mask, int64_t i, int64_t L);

// The sampled keys split by the cost of recomputing fp64 LSE and delta for every query that sees
// them (keys_seen of each such query x pair_cost): cheapest first while the total fits `budget`,
// the rest judged with the kernel's (the ring's) LSE and delta. Both lists in ascending position.
struct KeySplit {
  std::vector<int64_t> recomputed, trusted;
};
KeySplit split_keys_by_cost(const MaskView& mask, int64_t L, const std::vector<int64_t>& keys, double budget,
                            double pair_cost);

// `sample`: positions of the sampled query rows, also the sampled key rows.
SampledErrors check_sampled_rows(const WholeProblem& problem, const KernelResults& got,
                                 const std::vector<int64_t>& sample);

}  // namespace ringattn::kernels
