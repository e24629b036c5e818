#include "launch/cli/job_util.hpp"

#include <cstdio>
#include <fstream>

namespace ringattn {

DeviceBuffer to_backend(AttentionBackend& backend, std::vector<float>& host, DType dtype) {
  if (dtype == DType::f32) {
    DeviceBuffer buf(backend, host.size() * sizeof(float));
    backend.upload(buf.data(), host.data(), host.size() * sizeof(float));
    return buf;
  }
  std::vector<bf16_bits> b(host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    b[i] = float_to_bf16(host[i]);
    host[i] = bf16_to_float(b[i]);
  }
  DeviceBuffer buf(backend, b.size() * sizeof(bf16_bits));
  backend.upload(buf.data(), b.data(), b.size() * sizeof(bf16_bits));
  return buf;
}

std::vector<float> download(AttentionBackend& backend, const DeviceBuffer& buf) {
  std::vector<float> host(buf.bytes() / sizeof(float));
  backend.download(host.data(), buf.data(), buf.bytes());
  return host;
}

const float* host_floats(AttentionBackend& backend, const DeviceBuffer& buf, std::vector<float>& storage) {
  if (!buf.data()) return nullptr;
  if (backend.memory() == comm::MemorySpace::host) return buf.as<float>();
  storage = download(backend, buf);
  return storage.data();
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace ringattn
