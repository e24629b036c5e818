#include "comm/host_staged_communicator.hpp"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <numeric>
#include <string>

#include "util/stopwatch.hpp"

namespace ringattn::comm {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw CommError(std::string("host-staged communicator: ") + what + ": " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")");
}

}  // namespace

bool is_device_pointer(const void* p) {
  if (!p) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer is host memory for us
    return false;
  }
  return attr.type == cudaMemoryTypeDevice;
}

HostStagedCommunicator::HostStagedCommunicator(Communicator& inner) : inner_(&inner) {
  timeout_s_ = inner.timeout();
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> inner) : HostStagedCommunicator(*inner) {
  owned_ = std::move(inner);
}

HostStagedCommunicator::~HostStagedCommunicator() {
  // Buffers of transfers still outstanding are left to the inner communicator (it may still use them).
  for (const PinnedBuffer& b : pinned_)
    if (!b.in_use) cudaFreeHost(b.p);
  cudaStreamDestroy(stream_);
}

void* HostStagedCommunicator::acquire_pinned(size_t bytes) {
  PinnedBuffer* best = nullptr;
  for (PinnedBuffer& b : pinned_)
    if (!b.in_use && b.bytes >= bytes && (!best || b.bytes < best->bytes)) best = &b;
  if (!best) {
    void* p = nullptr;
    check(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost");
    pinned_.push_back({p, bytes, false});
    best = &pinned_.back();
  }
  best->in_use = true;
  return best->p;
}

void HostStagedCommunicator::release_pinned(void* p) {
  for (PinnedBuffer& b : pinned_)
    if (b.p == p) b.in_use = false;
}

void HostStagedCommunicator::copy(void* dst, const void* src, size_t bytes, bool to_device) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream_),
        to_device ? "copy to the device" : "copy from the device");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void* HostStagedCommunicator::host_view(const void* p, size_t bytes, bool with_data) {
  if (!is_device_pointer(p)) return const_cast<void*>(p);
  void* pinned = acquire_pinned(bytes);
  if (with_data) copy(pinned, p, bytes, false);
  return pinned;
}

Request HostStagedCommunicator::isend(const void* buf, size_t bytes, int peer, int tag) {
  Staged s;
  void* view = host_view(buf, bytes, true);
  if (view != buf) s.pinned = view;
  s.bytes = bytes;
  s.inner = inner_->isend(view, bytes, peer, tag);
  bytes_sent_ += bytes;
  const int64_t id = next_id_++;
  transfers_.emplace(id, s);
  return Request{id};
}

Request HostStagedCommunicator::irecv(void* buf, size_t bytes, int peer, int tag) {
  Staged s;
  void* view = host_view(buf, bytes, false);
  if (view != buf) s.pinned = view, s.device = buf;
  s.bytes = bytes;
  s.inner = inner_->irecv(view, bytes, peer, tag);
  const int64_t id = next_id_++;
  transfers_.emplace(id, s);
  return Request{id};
}

void HostStagedCommunicator::finish(Staged& s) {
  if (s.device) copy(s.device, s.pinned, s.bytes, true);
  if (s.pinned) release_pinned(s.pinned);
}

bool HostStagedCommunicator::test(Request& r) {
  if (!r.valid()) return true;
  auto it = transfers_.find(r.id);
  if (it == transfers_.end()) throw CommError("host-staged communicator: test() of an unknown request");
  if (!inner_->test(it->second.inner)) return false;
  finish(it->second);
  transfers_.erase(it);
  r.id = -1;
  return true;
}

void HostStagedCommunicator::wait(Request& r, const std::string& what) {
  if (!r.valid()) return;
  auto it = transfers_.find(r.id);
  if (it == transfers_.end()) throw CommError("host-staged communicator: wait() of an unknown request");
  sync_timeout();
  const Stopwatch clock;
  try {
    inner_->wait(it->second.inner, what);
  } catch (...) {
    wait_seconds_ += clock.seconds();
    transfers_.erase(it);  // its pinned buffer stays in use: the transfer may still touch it
    r.id = -1;
    throw;
  }
  wait_seconds_ += clock.seconds();
  finish(it->second);
  transfers_.erase(it);
  r.id = -1;
}

void HostStagedCommunicator::allreduce(void* buf, size_t count, DType type, ReduceOp op) {
  const size_t bytes = count * static_cast<size_t>(dtype_bytes(type));
  void* view = host_view(buf, bytes, true);
  sync_timeout();
  inner_->allreduce(view, count, type, op);
  if (view != buf) copy(buf, view, bytes, true), release_pinned(view);
}

void HostStagedCommunicator::broadcast(void* buf, size_t bytes, int root) {
  void* view = host_view(buf, bytes, rank() == root);
  sync_timeout();
  inner_->broadcast(view, bytes, root);
  if (view != buf) copy(buf, view, bytes, true), release_pinned(view);
}

void HostStagedCommunicator::allgather(const void* send, void* recv, size_t bytes_per_rank) {
  void* sview = host_view(send, bytes_per_rank, true);
  void* rview = host_view(recv, bytes_per_rank * size_t(size()), false);
  sync_timeout();
  inner_->allgather(sview, rview, bytes_per_rank);
  if (rview != recv) copy(recv, rview, bytes_per_rank * size_t(size()), true), release_pinned(rview);
  if (sview != send) release_pinned(sview);
}

void HostStagedCommunicator::allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) {
  const size_t total = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
  void* sview = host_view(send, recv_bytes[size_t(rank())], true);
  void* rview = host_view(recv, total, false);
  sync_timeout();
  inner_->allgatherv(sview, rview, recv_bytes);
  if (rview != recv) copy(recv, rview, total, true), release_pinned(rview);
  if (sview != send) release_pinned(sview);
}

void HostStagedCommunicator::reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DType type,
                                            ReduceOp op) {
  const size_t tsize = static_cast<size_t>(dtype_bytes(type));
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0}) * tsize;
  const size_t mine = counts[size_t(rank())] * tsize;
  void* sview = host_view(send, total, true);
  void* rview = host_view(recv, mine, false);
  sync_timeout();
  inner_->reduce_scatter(sview, rview, counts, type, op);
  if (rview != recv) copy(recv, rview, mine, true), release_pinned(rview);
  if (sview != send) release_pinned(sview);
}

void HostStagedCommunicator::abort(int exit_code) {
  inner_->abort(exit_code);
  std::abort();  // not reached
}

void HostStagedCommunicator::barrier() {
  sync_timeout();
  inner_->barrier();
}

std::unique_ptr<Communicator> HostStagedCommunicator::split(int color, int key) {
  sync_timeout();
  std::unique_ptr<Communicator> child = inner_->split(color, key);
  if (!child) return nullptr;
  auto staged = std::make_unique<HostStagedCommunicator>(std::move(child));
  staged->set_timeout(timeout());
  return staged;
}

}  // namespace ringattn::comm
