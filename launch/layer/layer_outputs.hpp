// The files `ringattn layer` writes, each rank its own part: activations (its sequence rows),
// LoRA factors and their gradients (its rows of B, its columns of A), merged weights (its rows),
// as .npy files or tensors of safetensors files (PEFT adapters, HF checkpoints).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "launch/cli/npy_outputs.hpp"
#include "runtime/io/safetensors_output.hpp"
#include "runtime/lora/layer.hpp"

namespace ringattn {

class LayerOutputs {
 public:
  explicit LayerOutputs(const LoraLayer& layer) : layer_(layer) {}

  // A file of which this rank holds `rows` (whose positions must outlive write()).
  void add(const std::string& path, const std::string& label, std::vector<int64_t> shape, RowSelection rows,
           std::vector<float> data);
  // DIR/lora_<p>_A.npy (r, in) and DIR/lora_<p>_B.npy (out, r) from a slice laid out as
  // projection(p).lora() (parameters or gradients).
  void add_factors(const std::string& dir, const std::string& label, int p, std::span<const float> slice);
  // DIR/w<p>.npy (out, in) from this rank's merged rows (and DIR/b<p>.npy with a bias).
  void add_merged(const std::string& dir, int p, std::vector<float> rows);

  // DIR/adapter_model.safetensors (base_model.model.PREFIX<p>_proj.lora_A.weight, ...) of the layer's
  // current factors and DIR/adapter_config.json, as PEFT's save_pretrained writes them.
  void add_adapter(const std::string& dir, const std::string& prefix);
  // FILE.safetensors with the merged weights (and biases) under PREFIX<p>_proj.weight (.bias).
  void add_merged_safetensors(const std::string& path, const std::string& prefix,
                              std::vector<std::vector<float>> merged);

  bool empty() const { return files_.empty() && safetensors_.empty(); }
  // Rank 0 creates the directories (options named for messages), then every file is written
  // (collective; agreed phases).
  void write(comm::Communicator& comm, const std::vector<std::pair<std::string, const char*>>& dirs) const;

 private:
  const std::vector<int64_t>& positions(const RowRange& r);

  const LoraLayer& layer_;
  std::deque<std::vector<float>> buffers_;
  std::deque<std::vector<int64_t>> positions_;
  std::vector<OutputRows> files_;
  struct SafetensorsFile {
    std::string path, label;
    std::vector<SafetensorsEntry> tensors;
    std::vector<RowSelection> rows;   // this rank's part of each tensor
    std::vector<const float*> data;
  };
  SafetensorsFile& safetensors_file(const std::string& path, const std::string& label);
  void add_tensor(SafetensorsFile& file, std::string name, std::vector<int64_t> shape, RowSelection rows,
                  std::vector<float> data);
  std::vector<SafetensorsFile> safetensors_;
  std::vector<std::pair<std::string, std::string>> texts_;  // path, content: written by rank 0
};

}  // namespace ringattn
