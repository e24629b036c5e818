// What `ringattn layer` reports: the header before any pass (rank 0), and after the passes the
// summary and the JSON of docs/reference.md with the layer's own fields.
#pragma once

#include <optional>
#include <vector>

#include "launch/cli/context.hpp"
#include "launch/layer/layer_check.hpp"
#include "launch/layer/layer_options.hpp"
#include "runtime/lora/layer.hpp"

namespace ringattn {

// This rank's account of the passes that ran.
struct LayerResults {
  LayerPassStats forward, backward;  // the last of each
  std::vector<double> losses;        // one per training step
  double train_seconds = 0.0;
  std::optional<LayerCheck> check;
};

// The configuration the passes run with (rank 0 prints; the others do nothing).
void print_layer_header(const LayerJob& job, const LoraLayer& layer, int ranks);
// "  check     passed against the CPU backend in fp32: ..." (rank 0).
void print_layer_check(const LayerCheck& check);
// Collective: reduces the measurements over ranks; rank 0 prints the summary and writes --json.
// Returns the exit code (a --json that cannot be written is its error's).
int report_layer(comm::Communicator& comm, const LayerJob& job, LoraLayer& layer, const LayerResults& r);

}  // namespace ringattn
