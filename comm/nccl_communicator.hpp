// The NCCL communicator: ring steps and collectives on device memory, one rank per GPU, over a
// single NCCL communicator per job. Built with CUDA and NCCL (RINGATTN_HAVE_CUDA), or on the
// emulation of both (-DRINGATTN_CUDA_EMULATION=ON, emulation/nccl).
//
// Placement. The GPU is chosen from the node-local rank (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED); a node with more ranks than visible GPUs is an error on every rank
// naming the node and both counts (nccl_schedule.hpp): use --comm mpi there
// (HostStagedCommunicator).
//
// Lifecycle. Rank 0's ncclUniqueId goes out by MPI broadcast; the communicator is created
// non-blocking (ncclConfig_t::blocking = 0) and polled with ncclCommGetAsyncError until ready,
// for at most timeout() seconds, then every rank checks that every rank succeeded. The
// destructor calls ncclCommFinalize, polls it (bounded), then ncclCommDestroy; on any error or
// timeout the communicator is aborted (ncclCommAbort) and a CommError names this rank, the step
// and what was awaited (exit code 4 at the top); it is unusable afterwards.
//
// Steps (post_step). One ncclGroupStart/ncclGroupEnd per step, with the step's ncclSend and
// ncclRecv, on one communication stream. With order_after(compute stream), the group waits on
// the device for the compute work issued before it (an event), and wait_step makes later compute
// wait for the step on the device too; the host waits only in wait_step, polling the step's
// event (and the communicator's asynchronous error) under the timeout. No tags: NCCL matches
// group n of a rank to group n of its peers because every rank posts its steps in the same
// order (the RingPlan makes the executor do so). NCCL communicators per rank: one per object,
// whatever P.
//
// Collectives on device memory: ncclAllReduce, ncclBroadcast, ncclAllGather, ncclReduceScatter
// (equal counts), and alltoallv as one group of ncclSend/ncclRecv (DeepSpeed-Ulysses' all-to-all,
// no host copy), on the same stream, waited for under the timeout. Everything else goes over MPI
// through pinned host buffers (HostStagedCommunicator over a private MPI duplicate): host
// buffers, allgatherv, reduce_scatter with unequal counts, barrier, isend/irecv (tagged
// point-to-point, which NCCL lacks: not the ring's path). Links are not emulated.
//
// split: ncclCommSplit (color, key; a negative color takes part and gets nullptr), polled under
// the timeout, then every rank of this communicator checks that every rank succeeded: a new
// NcclCommunicator on the same device with its own stream, ordered after the same compute
// stream, and a split of the MPI duplicate for its own fallbacks. (--ulysses: the group's.)
//
// Threads: one thread at a time uses the communicator, with its device current (the context's
// entry points make it so: AttentionBackend::use_from_this_thread).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/nccl_schedule.hpp"

namespace ringattn::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `comm`; selects and sets the CUDA device of this rank; waits at most
  // `timeout_s` seconds for every rank to join.
  explicit NcclCommunicator(MPI_Comm comm, double timeout_s = 300.0);
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

  StepHandle post_step(std::span<const StepTransfer> transfers) override;
  void wait_step(StepHandle& step, const std::string& what) override;

  void allreduce(void* buf, size_t count, DType type, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override;
  void allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) override;
  void reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DType type,
                      ReduceOp op) override;
  void barrier() override;
  void alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                 std::span<const size_t> recv_bytes) override;
  [[noreturn]] void abort(int exit_code) override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::vector<int> node_of_ranks() override;

  // Orders steps and collectives after the work issued before them on `compute_stream` (a
  // cudaStream_t: the backend's), and that stream's later work after them, on the device.
  void order_after(void* compute_stream);
  // The CUDA device this rank uses.
  int device() const;
  // NCCL communicators this object holds: 1, whatever the number of ranks.
  int nccl_communicators() const;

 private:
  // split's result: adopts `comm` (from ncclCommSplit) and `control` (the matching MPI split).
  NcclCommunicator(const NcclCommunicator& parent, std::unique_ptr<Communicator> control, void* comm);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm);

}  // namespace ringattn::comm
