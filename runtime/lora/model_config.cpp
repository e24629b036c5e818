#include "runtime/lora/model_config.hpp"

#include <cmath>

#include "runtime/errors.hpp"
#include "runtime/io/json_reader.hpp"

namespace ringattn {

namespace {

std::optional<int64_t> positive_integer(const JsonValue& root, const char* key, const std::string& where) {
  const JsonValue* v = root.find(key);
  if (!v || v->kind() == JsonValue::Kind::null) return std::nullopt;
  if (!v->is_number() || !(v->number() >= 1) || std::floor(v->number()) != v->number() || v->number() > 1e12)
    throw usage_error(where + "\"" + key + "\" must be a positive integer");
  return static_cast<int64_t>(v->number());
}

}  // namespace

ModelConfig read_model_config(const std::string& path) {
  const std::string where = "{config} " + path + ": ";
  const JsonValue root = read_json_file(path, "{config}");
  if (!root.is_object()) throw usage_error(where + "not a JSON object");
  ModelConfig c;
  c.path = path;
  c.hidden_size = positive_integer(root, "hidden_size", where);
  c.heads = positive_integer(root, "num_attention_heads", where);
  c.kv_heads = positive_integer(root, "num_key_value_heads", where);
  c.head_dim = positive_integer(root, "head_dim", where);
  if (const JsonValue* b = root.find("attention_bias"); b && b->is_bool()) c.attention_bias = b->boolean();

  // rope_theta at the top (transformers 4) or in rope_parameters (transformers 5); the scaling in
  // rope_scaling (4) or rope_parameters (5).
  const JsonValue* params = root.find("rope_parameters");
  if (params && !params->is_object()) params = nullptr;
  c.rope.theta = root.number_or("rope_theta", params ? params->number_or("rope_theta", 10000.0) : 10000.0);
  const JsonValue* scaling = root.find("rope_scaling");
  if (!scaling || !scaling->is_object()) scaling = params;
  if (scaling) {
    const std::string type = scaling->string_or("rope_type", scaling->string_or("type", "default"));
    if (type == "llama3") {
      c.rope.llama3_factor = scaling->number_or("factor", 0.0);
      c.rope.llama3_low_freq_factor = scaling->number_or("low_freq_factor", 1.0);
      c.rope.llama3_high_freq_factor = scaling->number_or("high_freq_factor", 4.0);
      c.rope.llama3_original_max_positions =
          static_cast<int64_t>(scaling->number_or("original_max_position_embeddings", 8192.0));
    } else if (type != "default") {
      throw usage_error(where + "rope type \"" + type + "\" is not supported (default and llama3 are)");
    }
  }
  const double partial = root.number_or("partial_rotary_factor", params ? params->number_or("partial_rotary_factor", 1.0) : 1.0);
  if (!(partial > 0.0 && partial <= 1.0)) throw usage_error(where + "partial_rotary_factor must be in (0, 1]");
  if (partial < 1.0) {
    if (!c.head_dim && !(c.hidden_size && c.heads))
      throw usage_error(where + "partial_rotary_factor needs head_dim (or hidden_size and num_attention_heads)");
    const int64_t D = c.head_dim ? *c.head_dim : *c.hidden_size / *c.heads;
    c.rope.dims = static_cast<int64_t>(double(D) * partial);
    c.rope.dims -= c.rope.dims % 2;
  }
  return c;
}

}  // namespace ringattn
