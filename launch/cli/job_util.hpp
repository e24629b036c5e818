// Helpers shared by the attention job and the scaling benchmark: moving host tensors into the
// backend's memory and back, and describing sizes and the machine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/backend.hpp"

namespace ringattn {

// Host fp32 values in `dtype`, in backend memory. For bf16 the host copy is rounded in place, so
// that a --check sees exactly what the kernels see.
DeviceBuffer to_backend(AttentionBackend& backend, std::vector<float>& host, DType dtype);

// A backend buffer of fp32 values, on the host.
std::vector<float> download(AttentionBackend& backend, const DeviceBuffer& buf);

// The fp32 values of a backend buffer as host memory: the buffer itself when the backend's
// memory is the host's (no copy), else a copy downloaded into `storage`.
const float* host_floats(AttentionBackend& backend, const DeviceBuffer& buf, std::vector<float>& storage);

// The CPU's model name from /proc/cpuinfo ("unknown CPU" elsewhere).
std::string cpu_model();

}  // namespace ringattn
