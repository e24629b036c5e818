// Where `ringattn layer` finds its parameters (docs/layer.md):
//
// - `--weights DIR` of .npy files: wq.npy (H*D, d_model), wk.npy and wv.npy (Hkv*D, d_model),
//   wo.npy (d_model, H*D); optional biases bq.npy (H*D,), bk.npy and bv.npy (Hkv*D,), bo.npy
//   (d_model,); for each projection with LoRA lora_<p>_A.npy (r, in) and lora_<p>_B.npy (out, r).
// - `--weights FILE.safetensors`, or a folder with model.safetensors.index.json (a sharded
//   checkpoint) or model.safetensors: the HF names PREFIX{q,k,v,o}_proj.weight and .bias, PREFIX = --weights-prefix.
// - `--adapter DIR`, a PEFT LoRA adapter (save_pretrained): adapter_config.json (r, lora_alpha,
//   use_rslora, target_modules) and adapter_model.safetensors with
//   base_model.model.PREFIX{q,k,v,o}_proj.lora_A.weight / .lora_B.weight.
//
// Each rank reads only its own slices (projection.hpp): its rows of W0, bias and B, its columns
// of A, by offset; float16 and bfloat16 are converted.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "runtime/io/npy.hpp"
#include "runtime/io/safetensors.hpp"
#include "runtime/lora/layer.hpp"

namespace ringattn {

// "wq.npy", "lora_q_A.npy", "lora_q_B.npy", "bq.npy", ...
std::string weight_file_name(int projection, ProjectionPart part);
// The HF module of a projection: "q_proj", ...
std::string hf_module_name(int projection);
// The HF tensor name of a part: PREFIXq_proj.weight, .bias; with the PEFT prefix for A and B:
// base_model.model.PREFIXq_proj.lora_A.weight.
std::string hf_tensor_name(const std::string& prefix, int projection, ProjectionPart part);

// One parameter tensor: a .npy file or a tensor of a safetensors file.
struct WeightTensor {
  std::optional<NpyInfo> npy;
  std::shared_ptr<const SafetensorsInfo> file;
  std::string name;  // of the tensor in `file`

  std::string describe() const;  // "{weights} DIR/wq.npy", "{adapter} F.safetensors tensor \"...\""
  // Reads the selected rows; refuses NaN and Inf.
  void read(const RowSelection& rows, float* out) const;
};

struct WeightSources {
  std::string weights;   // --weights: DIR of .npy, FILE.safetensors, or DIR with an index
  std::string prefix;    // --weights-prefix
  std::string adapter;   // --adapter DIR (empty: none)
};

struct WeightFiles {
  std::array<std::optional<WeightTensor>, kProjections> w0, a, b, bias;  // a, b, bias: optional
  bool from_adapter = false;  // the LoRA factors came from --adapter
  double adapter_alpha = 0.0; // lora_alpha of the adapter
  bool adapter_rslora = false;

  std::array<bool, kProjections> lora() const;
  std::array<bool, kProjections> biases() const;
  int64_t lora_rank() const;  // r of the LoRA tensors, 0 when there are none
};

// Finds every tensor and checks its shape against d_model (of --x), --heads, --kv-heads and, when
// positive, --lora-rank; ArgumentError naming the file, the tensor and what disagrees.
WeightFiles inspect_weights(const WeightSources& sources, int64_t d_model, int64_t heads, int64_t kv_heads,
                            int64_t lora_rank);

// Reads this rank's slices of every tensor into the layer's projections (whose shapes must be
// those of the files; LoRA factors the files lack are left as they are); refuses NaN and Inf.
void load_weights(const WeightFiles& files, LoraLayer& layer);

}  // namespace ringattn
