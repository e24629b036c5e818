// The CUDA emulation's devices, streams and events (runtime API; cuda_emulation.hpp).
//
// Kernels, copies and memsets run when they are issued, so most streams never hold anything.
// What does not finish at once is work another emulation queues (emulated NCCL operations,
// emulation/nccl): cuda_emulation::enqueue puts it on a stream as a test that says when it is
// done. A stream completes its work in issue order; an event recorded on a stream completes when
// all work queued on it before the record has; cudaStreamWaitEvent makes later work of a stream
// wait for the event (here: the host waits, since the next kernel runs when launched). Copies
// and memsets on a stream with queued work wait for it first.
//
// Blocking calls (cudaStreamSynchronize, cudaEventSynchronize, cudaStreamWaitEvent on queued
// work) wait at most RINGATTN_EMULATION_BLOCK_SECONDS (default 600) and then fail with
// cudaErrorLaunchFailure, where a GPU would hang: callers that must not hang poll instead.
//
// Devices: RINGATTN_EMULATED_GPUS per node (default 8), so that several ranks on one machine can
// each have "their" GPU (the NCCL path); 1 models ranks sharing a GPU.
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "emulation/cuda/cuda_emulation.hpp"

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double block_seconds() {
  static const double seconds = [] {
    const char* v = std::getenv("RINGATTN_EMULATION_BLOCK_SECONDS");
    const double s = v ? std::atof(v) : 0.0;
    return s > 0.0 ? s : 600.0;
  }();
  return seconds;
}

int device_count() {
  static const int count = [] {
    const char* v = std::getenv("RINGATTN_EMULATED_GPUS");
    const int n = v ? std::atoi(v) : 8;
    return n >= 0 ? n : 8;
  }();
  return count;
}

int g_device = 0;

struct Work {
  std::function<bool()> test;
  bool done = false;
};
using WorkList = std::vector<std::shared_ptr<Work>>;

// True when every item is done, testing in order (an item counts only after those before it).
bool all_done(WorkList& list) {
  for (auto& w : list) {
    if (!w->done) w->done = w->test();
    if (!w->done) return false;
  }
  return true;
}

bool wait_for(WorkList& list) {
  const double start = now_seconds();
  while (!all_done(list)) {
    if (now_seconds() - start > block_seconds()) return false;
    sched_yield();
  }
  return true;
}

}  // namespace

struct CUstream_st {
  WorkList queued;  // not yet known to be done, in issue order
  void prune() {
    size_t i = 0;
    while (i < queued.size() && (queued[i]->done || (queued[i]->done = queued[i]->test()))) ++i;
    queued.erase(queued.begin(), queued.begin() + static_cast<long>(i));
  }
};

struct CUevent_st {
  double seconds = 0.0;
  WorkList before;  // the stream's queued work when recorded
};

namespace cuda_emulation {

void enqueue(cudaStream_t stream, std::function<bool()> done) {
  if (!stream) {  // the legacy default stream: nothing else queues there, so wait now
    WorkList one{std::make_shared<Work>(Work{std::move(done)})};
    wait_for(one);
    return;
  }
  stream->queued.push_back(std::make_shared<Work>(Work{std::move(done)}));
}

}  // namespace cuda_emulation

namespace {
cudaError_t drain(cudaStream_t stream) {
  if (!stream) return cudaSuccess;
  if (!wait_for(stream->queued)) return cudaErrorLaunchFailure;
  stream->queued.clear();
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return device_count() > 0 ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return cudaErrorInvalidValue;
  g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = g_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -1;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned flags, int) {
  return cudaStreamCreateWithFlags(stream, flags);
}
// As on a GPU, queued work still completes (its tests are owned by whoever queued it).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!stream) return cudaSuccess;
  stream->prune();
  return stream->queued.empty() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return drain(stream); }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (cudaError_t e = drain(stream); e != cudaSuccess) return e;
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  if (cudaError_t e = drain(stream); e != cudaSuccess) return e;
  for (size_t r = 0; r < height && width > 0; ++r)
    if (cudaError_t e = cudaMemcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                                   width, kind);
        e != cudaSuccess)
      return e;
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  if (cudaError_t e = drain(stream); e != cudaSuccess) return e;
  return cudaMemset(p, value, bytes);
}
// Stream-ordered allocation: the memory is usable by work issued after the call on `stream`.
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (cudaError_t e = drain(stream); e != cudaSuccess) return e;
  return cudaFree(p);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  event->seconds = now_seconds();
  event->before.clear();
  if (stream) {
    stream->prune();
    event->before = stream->queued;
  }
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) { return all_done(event->before) ? cudaSuccess : cudaErrorNotReady; }
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return wait_for(event->before) ? cudaSuccess : cudaErrorLaunchFailure;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  (void)stream;
  return wait_for(event->before) ? cudaSuccess : cudaErrorLaunchFailure;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  *ms = float((stop->seconds - start->seconds) * 1e3);
  return cudaSuccess;
}
