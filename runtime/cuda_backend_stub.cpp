// runtime/cuda_backend.hpp in a build without CUDA: no device, and a clear error when asked for one.
#include "runtime/cuda_backend.hpp"
#include "runtime/errors.hpp"

namespace ringattn {

int cuda_device_count() { return 0; }
bool cuda_device_available() { return false; }

std::unique_ptr<AttentionBackend> make_cuda_backend(int) {
  throw Fault("this build has no CUDA backend (configure it where nvcc and NCCL are installed)");
}

}  // namespace ringattn
