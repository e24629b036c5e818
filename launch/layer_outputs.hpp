// The files `ringattn layer` writes, each rank its own part: activations (its sequence rows),
// LoRA factors and their gradients (its rows of B, its columns of A), merged weights (its rows).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/io/npy_outputs.hpp"
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

  bool empty() const { return files_.empty(); }
  // Rank 0 creates the directories (options named for messages), then every file is written
  // (collective; agreed phases).
  void write(comm::Communicator& comm, const std::vector<std::pair<std::string, const char*>>& dirs) const;

 private:
  const std::vector<int64_t>& positions(const RowRange& r);

  const LoraLayer& layer_;
  std::deque<std::vector<float>> buffers_;
  std::deque<std::vector<int64_t>> positions_;
  std::vector<OutputRows> files_;
};

}  // namespace ringattn
