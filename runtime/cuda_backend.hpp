// The CUDA backend: device memory (cudaMalloc) and the CUDA attention kernels
// (kernels/cuda/attention_cuda.hpp) behind the AttentionBackend interface. Declared in every build;
// without CUDA (RINGATTN_WITH_CUDA undefined) cuda_device_available() is false and
// make_cuda_backend throws Fault.
//
// Ordering. Work is queued on one non-blocking stream of the chosen device. forward(),
// backward(), scatter_add_rows() and add() return once their work is complete (calling
// `progress` while the GPU runs, so that a host-driven communicator keeps transfers moving):
// the ring executor reuses and sends buffers right after these calls. The other methods are
// stream-ordered; synchronize() waits for them. upload() and download() are complete on return.
//
// Positions and the mask arrive as host arrays; the backend copies them to the device per call
// (positions) or once per distinct mask (doc offsets and block mask, compared by content), into
// device buffers that prepare() allocates when a RingAttention is built, with the workspace of the
// tensor-core backward kernel: no pass allocates. With --kernel auto or cudnn, prepare() also plans
// every step of the ring onto cuDNN's fused attention where it can (runtime/cudnn_steps.hpp).
#pragma once

#include <memory>

#include "runtime/backend.hpp"

namespace ringattn {

// True when the CUDA runtime sees at least one device. Never throws, also without a driver.
bool cuda_device_available();
// Devices the CUDA runtime sees (0 without a driver or a GPU).
int cuda_device_count();

// The backend on device `device` (throws Fault when it cannot be used).
std::unique_ptr<AttentionBackend> make_cuda_backend(int device);

}  // namespace ringattn
