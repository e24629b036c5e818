#include "launch/layer/layer_outputs.hpp"

#include <filesystem>
#include <optional>

#include "launch/cli/job_control.hpp"
#include "launch/cli/context.hpp"
#include "launch/cli/json.hpp"
#include "runtime/errors.hpp"
#include "runtime/lora/weights.hpp"

namespace ringattn {

namespace {

std::string file(const std::string& dir, int p, ProjectionPart part) {
  return (std::filesystem::path(dir) / weight_file_name(p, part)).string();
}

}  // namespace

void LayerOutputs::add(const std::string& path, const std::string& label, std::vector<int64_t> shape, RowSelection rows,
                       std::vector<float> data) {
  const float* p = buffers_.emplace_back(std::move(data)).data();
  files_.push_back({path, label, std::move(shape), rows, p});
}

void LayerOutputs::add_factors(const std::string& dir, const std::string& label, int p, std::span<const float> slice) {
  const ShardedProjection& proj = layer_.projection(p);
  const ProjectionShape& s = proj.shape();
  const std::vector<int64_t>& cols = positions(proj.cols());
  const int64_t n = static_cast<int64_t>(cols.size());
  std::vector<float> a(static_cast<size_t>(s.rank * n));  // (r, cols) from A^T (cols, r)
  for (int64_t i = 0; i < s.rank; ++i)
    for (int64_t j = 0; j < n; ++j) a[size_t(i * n + j)] = slice[size_t(j * s.rank + i)];
  add(file(dir, p, ProjectionPart::lora_a), label, {s.rank, s.in}, RowSelection{s.rank, s.in, 1, cols}, std::move(a));
  const std::span<const float> b = slice.subspan(static_cast<size_t>(n * s.rank));
  add(file(dir, p, ProjectionPart::lora_b), label, {s.out, s.rank},
      RowSelection{1, s.out, s.rank, positions(proj.rows())}, std::vector<float>(b.begin(), b.end()));
}

void LayerOutputs::add_merged(const std::string& dir, int p, std::vector<float> rows) {
  const ProjectionShape& s = layer_.projection(p).shape();
  add(file(dir, p, ProjectionPart::w0), "--merge-out", {s.out, s.in},
      RowSelection{1, s.out, s.in, positions(layer_.projection(p).rows())}, std::move(rows));
  if (!s.bias) return;  // the bias is frozen: the merged layer carries it as it is
  const std::span<const float> bias = layer_.projection(p).bias();
  add(file(dir, p, ProjectionPart::bias), "--merge-out", {s.out},
      RowSelection{1, s.out, 1, positions(layer_.projection(p).rows())}, std::vector<float>(bias.begin(), bias.end()));
}

LayerOutputs::SafetensorsFile& LayerOutputs::safetensors_file(const std::string& path, const std::string& label) {
  SafetensorsFile& f = safetensors_.emplace_back();
  f.path = path, f.label = label;
  return f;
}

void LayerOutputs::add_tensor(SafetensorsFile& file, std::string name, std::vector<int64_t> shape, RowSelection rows,
                              std::vector<float> data) {
  file.data.push_back(buffers_.emplace_back(std::move(data)).data());
  file.tensors.push_back({std::move(name), std::move(shape)});
  file.rows.push_back(rows);
}

void LayerOutputs::add_adapter(const std::string& dir, const std::string& prefix) {
  const LayerConfig& c = layer_.config();
  SafetensorsFile& file =
      safetensors_file((std::filesystem::path(dir) / "adapter_model.safetensors").string(), "--save-adapter");
  Json targets = Json::array();
  for (int p = 0; p < kProjections; ++p) {
    if (!c.lora[size_t(p)]) continue;
    targets.push_back(hf_module_name(p));
    const ShardedProjection& proj = layer_.projection(p);
    const ProjectionShape& s = proj.shape();
    const std::span<const float> slice = proj.lora();
    const std::vector<int64_t>& cols = positions(proj.cols());
    const int64_t n = static_cast<int64_t>(cols.size());
    std::vector<float> a(static_cast<size_t>(s.rank * n));  // (r, cols) from A^T (cols, r)
    for (int64_t i = 0; i < s.rank; ++i)
      for (int64_t j = 0; j < n; ++j) a[size_t(i * n + j)] = slice[size_t(j * s.rank + i)];
    add_tensor(file, hf_tensor_name(prefix, p, ProjectionPart::lora_a), {s.rank, s.in},
               RowSelection{s.rank, s.in, 1, cols}, std::move(a));
    const std::span<const float> b = slice.subspan(static_cast<size_t>(n * s.rank));
    add_tensor(file, hf_tensor_name(prefix, p, ProjectionPart::lora_b), {s.out, s.rank},
               RowSelection{1, s.out, s.rank, positions(proj.rows())}, std::vector<float>(b.begin(), b.end()));
  }
  // The fields PEFT's LoraConfig reads back; the rest take its defaults.
  Json config = Json::object();
  config["peft_type"] = "LORA";
  config["r"] = c.lora_rank;
  config["lora_alpha"] = c.lora_alpha;
  config["use_rslora"] = c.rslora;
  config["target_modules"] = targets;
  config["lora_dropout"] = 0.0;
  config["bias"] = "none";
  config["fan_in_fan_out"] = false;
  config["inference_mode"] = true;
  texts_.emplace_back((std::filesystem::path(dir) / "adapter_config.json").string(), config.dump() + "\n");
}

void LayerOutputs::add_merged_safetensors(const std::string& path, const std::string& prefix,
                                          std::vector<std::vector<float>> merged) {
  SafetensorsFile& file = safetensors_file(path, "--merge-out");
  for (int p = 0; p < kProjections; ++p) {
    const ShardedProjection& proj = layer_.projection(p);
    const ProjectionShape& s = proj.shape();
    const std::vector<int64_t>& rows = positions(proj.rows());
    add_tensor(file, hf_tensor_name(prefix, p, ProjectionPart::w0), {s.out, s.in}, RowSelection{1, s.out, s.in, rows},
               std::move(merged[size_t(p)]));
    if (!s.bias) continue;
    add_tensor(file, hf_tensor_name(prefix, p, ProjectionPart::bias), {s.out}, RowSelection{1, s.out, 1, rows},
               std::vector<float>(proj.bias().begin(), proj.bias().end()));
  }
}

const std::vector<int64_t>& LayerOutputs::positions(const RowRange& r) {
  std::vector<int64_t>& pos = positions_.emplace_back();
  for (int64_t i = r.begin; i < r.end; ++i) pos.push_back(i);
  return pos;
}

void LayerOutputs::write(comm::Communicator& comm, const std::vector<std::pair<std::string, const char*>>& dirs) const {
  agreed_phase(comm, [&] {
    if (comm.rank() != 0) return;
    for (const auto& [dir, option] : dirs) {
      if (dir.empty()) continue;
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec || !std::filesystem::is_directory(dir))
        throw usage_error(std::string(option) + " " + dir + ": cannot create the directory (" + ec.message() + ")");
    }
  });
  write_outputs(comm, files_);
  const SafetensorsOutput::Metadata metadata = {{"format", "pt"}};
  for (const SafetensorsFile& f : safetensors_) {
    std::optional<SafetensorsOutput> out;
    agreed_phase(comm, [&] {
      if (comm.rank() == 0) out.emplace(SafetensorsOutput::create(f.path, f.label, f.tensors, metadata));
    });
    std::string temp = comm.rank() == 0 ? out->temp_path() : "";
    uint64_t n = temp.size();
    comm.broadcast(&n, sizeof n, 0);
    temp.resize(n);
    comm.broadcast(temp.data(), n, 0);
    agreed_phase(comm, [&] {
      if (comm.rank() != 0) out.emplace(SafetensorsOutput::open(f.path, temp, f.label, f.tensors, metadata));
      for (size_t i = 0; i < f.tensors.size(); ++i) out->write_rows(i, f.rows[i], f.data[i]);
      out->finish();
    });
    agreed_phase(comm, [&] {
      if (comm.rank() == 0) out->commit();
    });
  }
  agreed_phase(comm, [&] {
    if (comm.rank() == 0)
      for (const auto& [path, text] : texts_) write_text_file(path, "--save-adapter", text);
  });
}

}  // namespace ringattn
