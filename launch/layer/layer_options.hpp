// The options of `ringattn layer` and the job they describe, resolved and validated before any
// data moves: the shapes from --x, the weights' files inspected, the model's config.json applied,
// the layer's configuration and its attention judged by the library.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "launch/cli/context.hpp"
#include "launch/cli/mask_options.hpp"
#include "launch/cli/options_util.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/io/npy.hpp"
#include "runtime/lora/layer.hpp"
#include "runtime/lora/training.hpp"
#include "runtime/lora/weights.hpp"

namespace ringattn {

// The demo's defaults where its flags are not given.
inline constexpr int kDemoSteps = 60;
inline constexpr double kDemoLr = 2e-2;
inline constexpr int64_t kDemoRank = 4;

struct LayerOptions : ExecutionOptions {
  std::string weights_prefix, adapter, save_adapter, config;
  std::string x, weights, out, dy, grads, merge_out, save_lora, target, json;
  int64_t heads = 8, kv_heads = 0, lora_rank = 0;
  double lora_alpha = 0.0;
  bool lora_init = false;
  double rope_theta = 0.0;
  bool rope_interleaved = false, rope_per_document = false;
  int64_t rope_dims = 0;
  uint64_t seed = 0;
  int steps = 0;
  double lr = 1e-3;
  std::string optimizer = "adamw";
  bool demo = false, check = false;
  int64_t seq_len = 1024, batch = 1, d_model = 128;
  double demo_change = 0.5;
  MaskOptions mask;
  int ulysses = 1;
};

// Every option, with its default, bound to `o`.
boost::program_options::options_description describe_layer_options(LayerOptions& o);

struct LayerJob {
  LayerOptions opt;
  LayerConfig config;
  AttentionSpec spec;      // the layer's attention: mask, layout, schedule, ulysses
  ContextOptions context;  // backend, comm, threads (resolved), timeout
  OptimizerOptions optimizer;
  std::optional<NpyInfo> x_info, dy_info, target_info;
  std::optional<WeightFiles> weights;
  bool backward = false;  // one backward pass with --dy (not training)
};

// Throws ArgumentError naming the option or file.
LayerJob resolve_layer_job(const LayerOptions& o, const boost::program_options::variables_map& vm,
                           const LaunchContext& ctx);

}  // namespace ringattn
