// The attention shape of a Hugging Face model's config.json (`ringattn layer --config FILE`):
// num_attention_heads, num_key_value_heads, head_dim, hidden_size, rope_theta (or, in newer
// transformers, rope_parameters.rope_theta), partial_rotary_factor, attention_bias, and Llama 3
// rope scaling (rope_scaling or rope_parameters of rope_type "llama3"). Other rope types (linear,
// dynamic, yarn, ...) are refused rather than silently computed differently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/lora/rope.hpp"

namespace ringattn {

struct ModelConfig {
  std::string path;
  std::optional<int64_t> hidden_size, heads, kv_heads, head_dim;
  std::optional<bool> attention_bias;
  RopeConfig rope;  // theta (HF's default 10000 when absent), rotary dims, Llama 3 scaling
};

// Throws ArgumentError naming --config and the file.
ModelConfig read_model_config(const std::string& path);

}  // namespace ringattn
