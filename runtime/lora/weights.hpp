// The weight files of `ringattn layer --weights DIR` (SPEC.md "The LoRA attention layer"):
// wq.npy (H*D, d_model), wk.npy and wv.npy (Hkv*D, d_model), wo.npy (d_model, H*D), and for
// each projection with LoRA lora_<p>_A.npy (r, in) and lora_<p>_B.npy (out, r), and optional biases
// bq.npy (H*D,), bk.npy and bv.npy (Hkv*D,), bo.npy (d_model,). Each rank reads only its own slices
// (projection.hpp): its rows of W0, bias and B, its columns of A.
//
// Adapters trained elsewhere: PEFT's q_proj.lora_A.weight is lora_q_A.npy, q_proj.lora_B.weight
// is lora_q_B.npy (likewise k_proj, v_proj, o_proj), with --lora-alpha = PEFT's lora_alpha.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "runtime/lora/layer.hpp"
#include "runtime/io/npy.hpp"

namespace ringattn {

// "wq.npy", "lora_q_A.npy", "lora_q_B.npy", "bq.npy", ...
std::string weight_file_name(int projection, ProjectionPart part);

struct WeightFiles {
  std::array<NpyInfo, kProjections> w0;
  std::array<std::optional<NpyInfo>, kProjections> a, b;  // absent: that projection has no LoRA
  std::array<std::optional<NpyInfo>, kProjections> bias;  // absent: no bias

  std::array<bool, kProjections> lora() const;
  std::array<bool, kProjections> biases() const;
  int64_t lora_rank() const;  // r of the LoRA files, 0 when there are none
};

// Inspects the files in `dir` and checks their shapes against d_model (of --x), --heads,
// --kv-heads and, when positive, --lora-rank; UsageError naming the file and what disagrees.
WeightFiles inspect_weights(const std::string& dir, int64_t d_model, int64_t heads, int64_t kv_heads,
                            int64_t lora_rank);

// Reads this rank's slices of every file into the layer's projections (whose shapes must be
// those of the files; LoRA factors the files lack are left as they are); refuses NaN and Inf.
void load_weights(const WeightFiles& files, LoraLayer& layer);

}  // namespace ringattn
