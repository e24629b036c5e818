#include "launch/attention/attention_inputs.hpp"

#include <cmath>
#include <cstdio>

#include "launch/cli/job_util.hpp"
#include "runtime/errors.hpp"
#include "runtime/io/npy.hpp"

namespace ringattn {

namespace {

// Reads (or generates) this rank's rows of a (B, L, heads*D) tensor, as fp32 on the host. A file
// that is not float32 is converted, and `note` says so. With `scan_finite`, a NaN or Inf in the
// file, or (with --dtype bf16) a value that bfloat16 cannot hold, is refused naming the position.
std::vector<float> load_rows(const Job& job, const std::optional<NpyInfo>& info, RandomTensor tensor, int64_t heads,
                             const std::vector<int64_t>& pos, bool scan_finite, std::string* note) {
  const int64_t B = job.shard.batch, D = job.shard.head_dim;
  std::vector<float> x(static_cast<size_t>(B * static_cast<int64_t>(pos.size()) * heads * D));
  if (!info) {
    random_rows(x.data(), job.opt.seed, tensor, B, job.seq_len, heads * D, pos.data(), static_cast<int64_t>(pos.size()));
    return x;
  }
  std::string converted;
  read_npy_rows(*info, rows_along(info->shape, info->shape.size() == 4 ? 1 : 0, pos), x.data(), &converted);
  if (!converted.empty())
    *note = info->label + " " + info->path + ": converted " + (info->descr == "<f8" ? "float64" : "float16") +
            " to float32";
  if (!scan_finite) return x;
  const std::string where = info->label + " " + info->path + ": ";
  auto position = [&](size_t i) { return std::to_string(pos[(i / static_cast<size_t>(heads * D)) % pos.size()]); };
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isfinite(x[i])) continue;
    if (std::isinf(x[i]) && converted.find("beyond") != std::string::npos)
      throw usage_error(where + "a float64 value at sequence position " + position(i) +
                        " is beyond the float32 range (it would be inf); rescale the input");
    throw usage_error(where + "contains " + (std::isnan(x[i]) ? "NaN" : "Inf") + " (at sequence position " +
                      position(i) + "); fix the input or pass --no-check-finite");
  }
  if (job.dtype() == DType::bf16)
    for (size_t i = 0; i < x.size(); ++i)
      if (std::isinf(bf16_to_float(float_to_bf16(x[i])))) {
        char value[32];
        std::snprintf(value, sizeof value, "%.6g", double(x[i]));
        throw usage_error(where + "value " + value + " at sequence position " + position(i) +
                          " overflows bfloat16 (largest finite 3.39e38) under --dtype bf16; rescale the input or use "
                          "--dtype fp32");
      }
  return x;
}

}  // namespace

AttentionInputs load_attention_inputs(const Job& job, const std::vector<int64_t>& positions,
                                      AttentionBackend& backend, const TestFault& fault) {
  AttentionInputs in;
  const bool scan = job.files ? !job.opt.no_check_finite : job.opt.check_finite;
  // The check reads the backend's own buffers when they are host fp32 holding the true inputs.
  const bool on_host = backend.memory() == comm::MemorySpace::host && job.dtype() == DType::f32;
  const bool keep_host_copy = job.opt.check && (!on_host || fault.active());
  const kernels::AttentionDims dims = job.dims();
  auto load = [&](std::vector<float>& host, DeviceBuffer& buffer, const std::optional<NpyInfo>& info,
                  RandomTensor tensor, int64_t heads) {
    std::string note;
    host = load_rows(job, info, tensor, heads, positions, scan, &note);
    if (!note.empty()) in.notes.push_back(note);
    buffer = to_backend(backend, host, job.dtype());
    std::vector<float> faulty;
    const bool kv = tensor == RandomTensor::k || tensor == RandomTensor::v;
    if (fault.ring_rows(host, kv, dims, faulty)) buffer = to_backend(backend, faulty, job.dtype());
    if (!keep_host_copy) host = std::vector<float>();
  };
  load(in.host_q, in.q, job.q_info, RandomTensor::q, job.shard.heads);
  load(in.host_k, in.k, job.k_info, RandomTensor::k, job.shard.kv_heads);
  load(in.host_v, in.v, job.v_info, RandomTensor::v, job.shard.kv_heads);
  if (job.backward) load(in.host_dout, in.dout, job.dout_info, RandomTensor::dout, job.shard.heads);
  return in;
}

}  // namespace ringattn
