#include "runtime/lora/weights.hpp"

#include <cmath>
#include <filesystem>
#include <numeric>
#include <vector>

#include "runtime/errors.hpp"
#include "runtime/io/npy_file.hpp"

namespace ringattn {

namespace {

using npy_internal::format_shape;

std::vector<int64_t> range_positions(const RowRange& r) {
  std::vector<int64_t> pos(static_cast<size_t>(r.end - r.begin));
  std::iota(pos.begin(), pos.end(), r.begin);
  return pos;
}

void require_finite(const std::vector<float>& x, const NpyInfo& info) {
  for (float v : x)
    if (!std::isfinite(v)) throw UsageError(info.label + " " + info.path + ": contains NaN or Inf");
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
  for (const auto& info : a)
    if (info) return info->shape[0];
  return 0;
}

WeightFiles inspect_weights(const std::string& dir, int64_t d_model, int64_t heads, int64_t kv_heads,
                            int64_t lora_rank) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError("--weights " + dir + ": not a directory");
  LayerConfig dims;
  dims.d_model = d_model, dims.heads = heads, dims.kv_heads = kv_heads;
  const std::string why = " (d_model " + std::to_string(d_model) + " from --x, --heads " + std::to_string(heads) +
                          ", --kv-heads " + std::to_string(kv_heads) + ")";
  auto check = [&](const NpyInfo& info, const std::vector<int64_t>& expected, const std::string& extra) {
    if (info.shape != expected)
      throw UsageError(info.label + " " + info.path + ": shape " + format_shape(info.shape) + ", expected " +
                       format_shape(expected) + extra);
  };
  WeightFiles files;
  int64_t r = lora_rank;
  std::string r_source = "--lora-rank";
  for (int p = 0; p < kProjections; ++p) {
    const size_t i = static_cast<size_t>(p);
    const ProjectionShape s = dims.shape(p);
    const std::string w_path = (fs::path(dir) / weight_file_name(p, ProjectionPart::w0)).string();
    files.w0[i] = inspect_npy(w_path, "--weights");
    check(files.w0[i], {s.out, s.in}, why);
    const std::string bias_path = (fs::path(dir) / weight_file_name(p, ProjectionPart::bias)).string();
    if (fs::exists(bias_path, ec)) {
      files.bias[i] = inspect_npy(bias_path, "--weights");
      check(*files.bias[i], {s.out}, why);
    }
    const std::string a_path = (fs::path(dir) / weight_file_name(p, ProjectionPart::lora_a)).string();
    const std::string b_path = (fs::path(dir) / weight_file_name(p, ProjectionPart::lora_b)).string();
    const bool has_a = fs::exists(a_path, ec), has_b = fs::exists(b_path, ec);
    if (has_a != has_b)
      throw UsageError("--weights " + (has_a ? a_path : b_path) + ": LoRA factors come in pairs, but " +
                       (has_a ? b_path : a_path) + " is missing");
    if (!has_a) continue;
    files.a[i] = inspect_npy(a_path, "--weights");
    files.b[i] = inspect_npy(b_path, "--weights");
    const NpyInfo& a = *files.a[i];
    if (a.shape.size() != 2)
      throw UsageError("--weights " + a_path + ": expected a 2-D array (r, " + std::to_string(s.in) + "), got shape " +
                       format_shape(a.shape));
    if (r == 0) r = a.shape[0], r_source = a_path;
    check(a, {r, s.in}, r_source == a_path ? why : " (r " + std::to_string(r) + " from " + r_source + ")");
    check(*files.b[i], {s.out, r}, " (r " + std::to_string(r) + " from " + r_source + ")" + why);
    if (r < 1) throw UsageError("--weights " + a_path + ": LoRA rank 0");
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
    // W0 and B: this rank's rows; A: its columns, i.e. the positions of axis 1 of (r, in).
    std::vector<float> buf(static_cast<size_t>(n_rows * s.in));
    read_npy_rows(files.w0[i], RowSelection{1, s.out, s.in, rows}, buf.data());
    require_finite(buf, files.w0[i]);
    proj.fill(ProjectionPart::w0,
              [&](int64_t r, int64_t c) { return buf[static_cast<size_t>((r - rows[0]) * s.in + c)]; });
    if (s.bias && files.bias[i]) {
      buf.assign(rows.size(), 0.0f);
      read_npy_rows(*files.bias[i], RowSelection{1, s.out, 1, rows}, buf.data());
      require_finite(buf, *files.bias[i]);
      proj.fill(ProjectionPart::bias, [&](int64_t r, int64_t) { return buf[static_cast<size_t>(r - rows[0])]; });
    }
    if (!s.has_lora() || !files.a[i]) continue;  // (factors not in the files are the caller's to set)
    buf.assign(static_cast<size_t>(s.rank * n_cols), 0.0f);
    read_npy_rows(*files.a[i], RowSelection{s.rank, s.in, 1, cols}, buf.data());
    require_finite(buf, *files.a[i]);
    proj.fill(ProjectionPart::lora_a,
              [&](int64_t r, int64_t c) { return buf[static_cast<size_t>(r * n_cols + (c - cols[0]))]; });
    buf.assign(static_cast<size_t>(n_rows * s.rank), 0.0f);
    read_npy_rows(*files.b[i], RowSelection{1, s.out, s.rank, rows}, buf.data());
    require_finite(buf, *files.b[i]);
    proj.fill(ProjectionPart::lora_b,
              [&](int64_t r, int64_t c) { return buf[static_cast<size_t>((r - rows[0]) * s.rank + c)]; });
  }
}

}  // namespace ringattn
