#include "runtime/lora/weights.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <vector>

#include "runtime/errors.hpp"
#include "runtime/io/json_reader.hpp"
#include "runtime/io/npy_file.hpp"
#include "util/format.hpp"

namespace ringattn {

namespace {

namespace fs = std::filesystem;

std::vector<int64_t> range_positions(const RowRange& r) {
  std::vector<int64_t> pos(static_cast<size_t>(r.end - r.begin));
  std::iota(pos.begin(), pos.end(), r.begin);
  return pos;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The shape a tensor has, for the checks.
std::vector<int64_t> shape_of(const WeightTensor& t) {
  return t.npy ? t.npy->shape : t.file->find(t.name)->shape;
}

// Safetensors files opened once each, by path.
class SafetensorsFiles {
 public:
  std::shared_ptr<const SafetensorsInfo> open(const std::string& path, const std::string& label) {
    auto& slot = files_[path];
    if (!slot) slot = std::make_shared<const SafetensorsInfo>(inspect_safetensors(path, label));
    return slot;
  }

 private:
  std::map<std::string, std::shared_ptr<const SafetensorsInfo>> files_;
};

// A safetensors checkpoint: one file, or the shards an index maps names to.
class Checkpoint {
 public:
  Checkpoint(const std::string& weights, SafetensorsFiles& files) : files_(files) {
    const fs::path index = fs::path(weights) / "model.safetensors.index.json";
    std::error_code ec;
    if (!fs::is_directory(weights, ec) || !fs::exists(index, ec)) {  // a file, or a folder with model.safetensors
      single_ = fs::is_directory(weights, ec) ? (fs::path(weights) / "model.safetensors").string() : weights;
      return;
    }
    const JsonValue root = read_json_file(index.string(), "{weights}");
    const JsonValue* map = root.find("weight_map");
    if (!map || !map->is_object())
      throw usage_error("{weights} " + index.string() + ": no \"weight_map\" object (name -> shard file)");
    for (const auto& [name, file] : map->members()) {
      if (!file.is_string()) throw usage_error("{weights} " + index.string() + ": weight_map \"" + name + "\" is not a file name");
      shard_of_[name] = (fs::path(weights) / file.text()).string();
    }
    index_ = index.string();
  }
  // The tensor `name`, or nullopt when the checkpoint has none.
  std::optional<WeightTensor> find(const std::string& name) {
    std::string path = single_;
    if (path.empty()) {
      const auto it = shard_of_.find(name);
      if (it == shard_of_.end()) return std::nullopt;
      path = it->second;
    }
    WeightTensor t;
    t.file = files_.open(path, "{weights}");
    t.name = name;
    if (!t.file->find(name)) {
      if (!single_.empty()) return std::nullopt;
      throw usage_error("{weights} " + index_ + " maps tensor \"" + name + "\" to " + path + ", which lacks it");
    }
    return t;
  }
  std::string describe() const { return single_.empty() ? index_ : single_; }

 private:
  SafetensorsFiles& files_;
  std::string single_, index_;
  std::map<std::string, std::string> shard_of_;
};

struct AdapterConfig {
  int64_t r = 0;
  double alpha = 0.0;
  bool rslora = false;
  std::array<bool, kProjections> targets{};
};

AdapterConfig read_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  const JsonValue root = read_json_file(path, "{adapter}");
  const std::string where = "{adapter} " + path + ": ";
  if (!root.is_object()) throw usage_error(where + "not a JSON object");
  AdapterConfig c;
  const JsonValue* r = root.find("r");
  if (!r || !r->is_number() || r->number() < 1 || std::floor(r->number()) != r->number())
    throw usage_error(where + "\"r\" must be a positive integer");
  c.r = static_cast<int64_t>(r->number());
  c.alpha = root.number_or("lora_alpha", 8.0);  // PEFT's default
  c.rslora = root.bool_or("use_rslora", false);
  const std::string type = root.string_or("peft_type", "LORA");
  if (type != "LORA") throw usage_error(where + "peft_type " + type + ": only LORA adapters are supported");
  if (root.bool_or("use_dora", false)) throw usage_error(where + "use_dora: DoRA adapters are not supported");
  if (root.bool_or("fan_in_fan_out", false))
    throw usage_error(where + "fan_in_fan_out: transposed (Conv1D) layers are not supported");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (const JsonValue* v = root.find(key); v && v->is_object() && !v->members().empty())
      throw usage_error(where + "\"" + key + "\": a rank or alpha per module is not supported");
  const JsonValue* targets = root.find("target_modules");
  if (!targets || !(targets->is_array() || targets->is_string()))
    throw usage_error(where + "\"target_modules\" must list the modules (q_proj, k_proj, v_proj, o_proj)");
  for (int p = 0; p < kProjections; ++p) {
    const std::string module = hf_module_name(p);
    if (targets->is_string()) {  // PEFT: a regex over module names, or "all-linear"
      c.targets[size_t(p)] = targets->text() == "all-linear" || targets->text().find(module) != std::string::npos;
      continue;
    }
    for (const JsonValue& t : targets->items())
      if (t.is_string() && t.text() == module) c.targets[size_t(p)] = true;
  }
  return c;
}

void require_shape(const WeightTensor& t, const std::vector<int64_t>& expected, const std::string& why) {
  const std::vector<int64_t> shape = shape_of(t);
  if (shape != expected)
    throw usage_error(t.describe() + ": shape " + format_shape(shape) + ", expected " + format_shape(expected) + why);
  if (t.file) require_float_tensor(*t.file, t.name, expected, why);  // and a float dtype
}

WeightTensor npy_tensor(const std::string& path, const std::string& label) {
  WeightTensor t;
  t.npy = inspect_npy(path, label);
  return t;
}

}  // namespace

std::string weight_file_name(int projection, ProjectionPart part) {
  const std::string p = projection_name(projection);
  switch (part) {
    case ProjectionPart::w0: return "w" + p + ".npy";
    case ProjectionPart::lora_a: return "lora_" + p + "_A.npy";
    case ProjectionPart::lora_b: return "lora_" + p + "_B.npy";
    case ProjectionPart::bias: return "b" + p + ".npy";
  }
  return "";
}

std::string hf_module_name(int projection) { return std::string(projection_name(projection)) + "_proj"; }

std::string hf_tensor_name(const std::string& prefix, int projection, ProjectionPart part) {
  const std::string module = prefix + hf_module_name(projection);
  switch (part) {
    case ProjectionPart::w0: return module + ".weight";
    case ProjectionPart::bias: return module + ".bias";
    case ProjectionPart::lora_a: return "base_model.model." + module + ".lora_A.weight";
    case ProjectionPart::lora_b: return "base_model.model." + module + ".lora_B.weight";
  }
  return "";
}

std::string WeightTensor::describe() const {
  if (npy) return npy->label + " " + npy->path;
  return file->label + " " + file->path + " tensor \"" + name + "\"";
}

void WeightTensor::read(const RowSelection& rows, float* out) const {
  if (npy) {
    read_npy_rows(*npy, rows, out);
  } else {
    read_safetensors_rows(*file, *file->find(name), rows, out);
  }
  for (int64_t i = 0; i < rows.elements(); ++i)
    if (!std::isfinite(out[i])) throw usage_error(describe() + ": contains NaN or Inf");
}

std::array<bool, kProjections> WeightFiles::lora() const {
  std::array<bool, kProjections> on{};
  for (int p = 0; p < kProjections; ++p) on[static_cast<size_t>(p)] = a[static_cast<size_t>(p)].has_value();
  return on;
}

std::array<bool, kProjections> WeightFiles::biases() const {
  std::array<bool, kProjections> on{};
  for (int p = 0; p < kProjections; ++p) on[static_cast<size_t>(p)] = bias[static_cast<size_t>(p)].has_value();
  return on;
}

int64_t WeightFiles::lora_rank() const {
  for (const auto& t : a)
    if (t) return shape_of(*t)[0];
  return 0;
}

WeightFiles inspect_weights(const WeightSources& sources, int64_t d_model, int64_t heads, int64_t kv_heads,
                            int64_t lora_rank) {
  std::error_code ec;
  const std::string& dir = sources.weights;
  const bool safetensors = ends_with(dir, ".safetensors") ||
                           fs::exists(fs::path(dir) / "model.safetensors.index.json", ec) ||
                           fs::exists(fs::path(dir) / "model.safetensors", ec);
  if (!safetensors && !fs::is_directory(dir, ec))
    throw usage_error("{weights} " + dir + ": not a directory of .npy files, a .safetensors file, or a folder with " +
                     "model.safetensors or model.safetensors.index.json");
  if (!safetensors && !sources.prefix.empty())
    throw usage_error("{weights_prefix} names tensors in a safetensors checkpoint; {weights} " + dir +
                     " is a directory of .npy files");
  LayerConfig dims;
  dims.d_model = d_model, dims.heads = heads, dims.kv_heads = kv_heads;
  const std::string why = " ({d_model} " + std::to_string(d_model) + ", {heads} " + std::to_string(heads) +
                          ", {kv_heads} " + std::to_string(kv_heads) + ")";
  SafetensorsFiles opened;
  std::optional<Checkpoint> checkpoint;
  if (safetensors) checkpoint.emplace(dir, opened);
  std::optional<AdapterConfig> adapter;
  std::string adapter_file;
  if (!sources.adapter.empty()) {
    if (!fs::is_directory(sources.adapter, ec)) throw usage_error("{adapter} " + sources.adapter + ": not a directory");
    adapter = read_adapter_config(sources.adapter);
    adapter_file = (fs::path(sources.adapter) / "adapter_model.safetensors").string();
    if (lora_rank > 0 && lora_rank != adapter->r)
      throw usage_error("{lora_rank} " + std::to_string(lora_rank) + " contradicts {adapter} " + sources.adapter +
                       " (r " + std::to_string(adapter->r) + ")");
  }

  WeightFiles files;
  int64_t r = adapter ? adapter->r : lora_rank;
  std::string r_source = adapter ? "{adapter} " + sources.adapter : "{lora_rank}";
  for (int p = 0; p < kProjections; ++p) {
    const size_t i = static_cast<size_t>(p);
    const ProjectionShape s = dims.shape(p);
    // W0 and the bias.
    if (checkpoint) {
      const std::string w_name = hf_tensor_name(sources.prefix, p, ProjectionPart::w0);
      files.w0[i] = checkpoint->find(w_name);
      if (!files.w0[i])
        throw usage_error("{weights} " + checkpoint->describe() + ": tensor \"" + w_name + "\" is missing" +
                         (sources.prefix.empty() ? " (set {weights_prefix}, e.g. model.layers.0.self_attn.)" : ""));
      files.bias[i] = checkpoint->find(hf_tensor_name(sources.prefix, p, ProjectionPart::bias));
    } else {
      files.w0[i] = npy_tensor((fs::path(dir) / weight_file_name(p, ProjectionPart::w0)).string(), "{weights}");
      const std::string bias_path = (fs::path(dir) / weight_file_name(p, ProjectionPart::bias)).string();
      if (fs::exists(bias_path, ec)) files.bias[i] = npy_tensor(bias_path, "{weights}");
    }
    require_shape(*files.w0[i], {s.out, s.in}, why);
    if (files.bias[i]) require_shape(*files.bias[i], {s.out}, why);

    // The LoRA factors: from the adapter, or lora_<p>_{A,B}.npy beside the .npy weights.
    if (adapter) {
      const std::string a_name = hf_tensor_name(sources.prefix, p, ProjectionPart::lora_a);
      const std::string b_name = hf_tensor_name(sources.prefix, p, ProjectionPart::lora_b);
      const auto file = opened.open(adapter_file, "{adapter}");
      const bool has_a = file->find(a_name) != nullptr, has_b = file->find(b_name) != nullptr;
      if (!adapter->targets[i]) {
        if (has_a || has_b)
          throw usage_error("{adapter} " + adapter_file + ": tensor \"" + (has_a ? a_name : b_name) + "\" but " +
                           hf_module_name(p) + " is not in target_modules of adapter_config.json");
        continue;
      }
      if (!has_a || !has_b)
        throw usage_error("{adapter} " + adapter_file + ": tensor \"" + (has_a ? b_name : a_name) + "\" is missing (" +
                         hf_module_name(p) + " is a target module" +
                         (sources.prefix.empty() ? "; set {weights_prefix}, e.g. model.layers.0.self_attn.)" : ")"));
      files.a[i] = WeightTensor{std::nullopt, file, a_name};
      files.b[i] = WeightTensor{std::nullopt, file, b_name};
    } else if (!checkpoint) {
      const std::string a_path = (fs::path(dir) / weight_file_name(p, ProjectionPart::lora_a)).string();
      const std::string b_path = (fs::path(dir) / weight_file_name(p, ProjectionPart::lora_b)).string();
      const bool has_a = fs::exists(a_path, ec), has_b = fs::exists(b_path, ec);
      if (has_a != has_b)
        throw usage_error("{weights} " + (has_a ? a_path : b_path) + ": LoRA factors come in pairs, but " +
                         (has_a ? b_path : a_path) + " is missing");
      if (!has_a) continue;
      files.a[i] = npy_tensor(a_path, "{weights}");
      files.b[i] = npy_tensor(b_path, "{weights}");
    }
    if (!files.a[i]) continue;
    const std::vector<int64_t> a_shape = shape_of(*files.a[i]);
    if (a_shape.size() != 2)
      throw usage_error(files.a[i]->describe() + ": expected a 2-D array (r, " + std::to_string(s.in) +
                       "), got shape " + format_shape(a_shape));
    if (r == 0) r = a_shape[0], r_source = files.a[i]->describe();
    const std::string r_why = " (r " + std::to_string(r) + " from " + r_source + ")";
    require_shape(*files.a[i], {r, s.in}, r_source == files.a[i]->describe() ? why : r_why);
    require_shape(*files.b[i], {s.out, r}, r_why + why);
    if (r < 1) throw usage_error(files.a[i]->describe() + ": LoRA rank 0");
  }
  if (adapter) {
    files.from_adapter = true;
    files.adapter_alpha = adapter->alpha;
    files.adapter_rslora = adapter->rslora;
  }
  return files;
}

void load_weights(const WeightFiles& files, LoraLayer& layer) {
  for (int p = 0; p < kProjections; ++p) {
    const size_t i = static_cast<size_t>(p);
    ShardedProjection& proj = layer.projection(p);
    const ProjectionShape& s = proj.shape();
    const std::vector<int64_t> rows = range_positions(proj.rows()), cols = range_positions(proj.cols());
    const int64_t n_rows = static_cast<int64_t>(rows.size()), n_cols = static_cast<int64_t>(cols.size());
    // W0, bias and B: this rank's rows; A: its columns, i.e. the positions of axis 1 of (r, in).
    std::vector<float> buf(static_cast<size_t>(n_rows * s.in));
    files.w0[i]->read(RowSelection{1, s.out, s.in, rows}, buf.data());
    proj.fill(ProjectionPart::w0,
              [&](int64_t r, int64_t c) { return buf[static_cast<size_t>((r - rows[0]) * s.in + c)]; });
    if (s.bias && files.bias[i]) {
      buf.assign(rows.size(), 0.0f);
      files.bias[i]->read(RowSelection{1, s.out, 1, rows}, buf.data());
      proj.fill(ProjectionPart::bias, [&](int64_t r, int64_t) { return buf[static_cast<size_t>(r - rows[0])]; });
    }
    if (!s.has_lora() || !files.a[i]) continue;  // (factors not in the files are the caller's to set)
    buf.assign(static_cast<size_t>(s.rank * n_cols), 0.0f);
    files.a[i]->read(RowSelection{s.rank, s.in, 1, cols}, buf.data());
    proj.fill(ProjectionPart::lora_a,
              [&](int64_t r, int64_t c) { return buf[static_cast<size_t>(r * n_cols + (c - cols[0]))]; });
    buf.assign(static_cast<size_t>(n_rows * s.rank), 0.0f);
    files.b[i]->read(RowSelection{1, s.out, s.rank, rows}, buf.data());
    proj.fill(ProjectionPart::lora_b,
              [&](int64_t r, int64_t c) { return buf[static_cast<size_t>((r - rows[0]) * s.rank + c)]; });
  }
}

}  // namespace ringattn
