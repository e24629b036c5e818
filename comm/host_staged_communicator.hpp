// A Communicator on device memory built on one on host memory (MPI): device buffers go through
// pinned host buffers. For the CUDA backend when NCCL cannot be used, e.g. several ranks share
// one GPU (NCCL needs one GPU per rank) or a node has no NCCL.
//
//   isend: the device buffer is copied to a pinned host buffer (synchronously: the caller has
//          synchronised the producer of the buffer), then sent by the inner communicator;
//   irecv: received into a pinned buffer, copied to the device buffer in the test() or wait()
//          that reports completion (so the data is in place when the call returns);
//   collectives: staged in and out the same way.
// Host buffers pass through untouched (the pointer kind is asked of the CUDA runtime), so the
// same object serves a job's host-side bookkeeping too. Pinned buffers are pooled. Knows
// nothing of the runtime; needs the CUDA runtime only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"

struct CUstream_st;

namespace ringattn::comm {

class HostStagedCommunicator final : public Communicator {
 public:
  // Wraps `inner` (not owned; it must outlive this object).
  explicit HostStagedCommunicator(Communicator& inner);
  // Wraps and owns `inner`.
  explicit HostStagedCommunicator(std::unique_ptr<Communicator> inner);
  ~HostStagedCommunicator() override;
  HostStagedCommunicator(const HostStagedCommunicator&) = delete;
  HostStagedCommunicator& operator=(const HostStagedCommunicator&) = delete;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return inner_->name(); }
  MemorySpace memory() const override { return MemorySpace::device; }

  Request isend(const void* buf, size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, size_t bytes, int peer, int tag) override;
  bool test(Request& r) override;
  void wait(Request& r, const std::string& what) override;
  void progress() override { inner_->progress(); }

  void allreduce(void* buf, size_t count, DType type, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override;
  void allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) override;
  void reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DType type,
                      ReduceOp op) override;
  void barrier() override;
  [[noreturn]] void abort(int exit_code) override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::vector<int> node_of_ranks() override { return inner_->node_of_ranks(); }

  Communicator& inner() { return *inner_; }

 private:
  struct Staged {
    Request inner;
    void* device = nullptr;  // a receive's destination on the device (null: no copy back)
    void* pinned = nullptr;
    size_t bytes = 0;
  };
  // A host view of `p`: p itself for host memory, else a pinned copy (with_data: filled).
  void* host_view(const void* p, size_t bytes, bool with_data);
  void finish(Staged& s);  // copies a receive back, returns the pinned buffer
  void* acquire_pinned(size_t bytes);
  void release_pinned(void* p);
  void copy(void* dst, const void* src, size_t bytes, bool to_device);
  void sync_timeout() { inner_->set_timeout(timeout()); }

  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  CUstream_st* stream_ = nullptr;
  std::map<int64_t, Staged> transfers_;
  int64_t next_id_ = 0;
  struct PinnedBuffer {
    void* p;
    size_t bytes;
    bool in_use;
  };
  std::vector<PinnedBuffer> pinned_;
};

// True when `p` points to device memory (cudaMemoryTypeDevice); false for host memory, managed
// memory, and whenever the CUDA runtime cannot tell.
bool is_device_pointer(const void* p);

}  // namespace ringattn::comm
