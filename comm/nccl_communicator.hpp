// The NCCL communicator: point-to-point transfers and collectives on device memory, one rank
// per GPU. Built only with CUDA and NCCL (RINGATTN_HAVE_CUDA).
//
// Placement. The GPU is chosen from the node-local rank (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED); a node with more ranks than visible GPUs is an error on every rank
// (the message names the node and both counts): use --comm mpi there (HostStagedCommunicator).
//
// Point to point. NCCL has no tags, matches sends to receives in posting order per pair of
// ranks, and runs the operations of one communicator one after another: a receive posted
// early blocks every later operation of that communicator until its sender catches up. The
// ring executor's patterns (receive posted before the step's send, gradients received
// before they are sent on, messages of one pair in different orders on the two sides) would
// deadlock or mismatch on one NCCL communicator, so this class does not rely on posting order:
//   - every ordered pair of ranks (sender -> receiver) has its own two-rank NCCL communicator
//     and CUDA stream (2 (P - 1) per rank, created and connected in the constructor), so no
//     transfer waits behind another pair's;
//   - isend launches ncclSend on the pair's communicator at once and announces (tag, bytes)
//     to the receiver over MPI (a duplicate of the given communicator);
//   - the receiver launches ncclRecv in announcement order, i.e. in the sender's order, each
//     into the earliest posted irecv with that tag (MPI matching). A message whose irecv is not
//     posted yet waits, unless a later message of the same sender is already wanted: then it is
//     received into a temporary device buffer and copied when its irecv comes.
// A message matches a receive with the same tag, and a receive may be larger than its message.
// test() and wait() poll a CUDA event per request, and advance announcements and receives;
// progress() does the latter. wait() is bounded by timeout(): on timeout, or on an NCCL
// asynchronous error (ncclCommGetAsyncError), every NCCL communicator is aborted
// (ncclCommAbort) and a CommError names this rank, the peer, the tag and what was awaited;
// the communicator is unusable afterwards.
//
// Host buffers are accepted everywhere (staged through device memory), so a job can use the
// same communicator for its host-side bookkeeping. Collectives run on one world communicator:
// ncclAllReduce, ncclBroadcast, ncclAllGather, ncclReduceScatter (equal counts), grouped
// ncclSend/ncclRecv (allgatherv) and grouped ncclReduce (reduce_scatter with unequal counts);
// barrier() is an allreduce of one value. Links are not emulated (set_link_emulation is ignored).
//
// Threads: one thread uses the communicator (the one that created it).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/nccl_schedule.hpp"

namespace ringattn::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `comm`; selects and sets the CUDA device of this rank.
  explicit NcclCommunicator(MPI_Comm comm);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const char* name() const override { return "nccl"; }
  MemorySpace memory() const override { return MemorySpace::device; }

  Request isend(const void* buf, size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, size_t bytes, int peer, int tag) override;
  bool test(Request& r) override;
  void wait(Request& r, const std::string& what) override;
  void progress() override;

  void allreduce(void* buf, size_t count, DataType type, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override;
  void allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) override;
  void reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DataType type,
                      ReduceOp op) override;
  void barrier() override;
  [[noreturn]] void abort(int exit_code) override;
  std::unique_ptr<Communicator> split(int color, int key) override;

  // The CUDA device this rank uses.
  int device() const;

 private:
  struct Impl;
  NcclCommunicator(MPI_Comm comm, int device);
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm);

}  // namespace ringattn::comm
