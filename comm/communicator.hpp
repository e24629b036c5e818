// How bytes move between ranks. A small interface with an MPI implementation (host memory) and
// an NCCL implementation (device memory). Knows nothing of attention.
//
// Every blocking call is bounded by a timeout: a peer that died or stopped answering turns into
// a CommError naming the peer and what was being waited for, never a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ringattn/errors.hpp"
#include "util/dtype.hpp"

namespace ringattn::comm {

// A communication fault: peer lost, timeout, transport error (a Fault: exit code 4 at the top).
class CommError : public Fault {
 public:
  using Fault::Fault;
};

enum class ReduceOp : uint8_t { sum, max, min };
enum class MemorySpace : uint8_t { host, device };

// Handle of a posted point-to-point transfer; invalid once completed, or once test() or wait()
// has thrown.
struct Request {
  int64_t id = -1;
  bool valid() const { return id >= 0; }
};

// A slower link's parameters (bandwidth in GB/s = 1e9 bytes/s, latency in microseconds), which
// EmulatedLinkCommunicator (comm/emulated_link_communicator.hpp) emulates. Zero means "not
// emulated".
struct LinkEmulation {
  double gbps = 0.0;
  double latency_us = 0.0;
  bool active() const { return gbps > 0.0 || latency_us > 0.0; }
  double delay_seconds(size_t bytes) const {
    return latency_us * 1e-6 + (gbps > 0.0 ? double(bytes) / (gbps * 1e9) : 0.0);
  }
};

// One transfer of a step (see Communicator::post_step): `bytes` from `buf` to `peer` (send) or
// into `buf` from `peer` (receive). A receive names the byte count of its send.
struct StepTransfer {
  enum class Kind : uint8_t { send, recv };
  Kind kind = Kind::send;
  void* buf = nullptr;  // a send's buffer is only read
  size_t bytes = 0;
  int peer = -1;

  static StepTransfer send(const void* buf, size_t bytes, int peer) {
    return {Kind::send, const_cast<void*>(buf), bytes, peer};
  }
  static StepTransfer recv(void* buf, size_t bytes, int peer) { return {Kind::recv, buf, bytes, peer}; }
};

// Handle of a posted step; invalid once completed, or once wait_step() has thrown.
struct StepHandle {
  int64_t id = -1;
  bool valid() const { return id >= 0; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "mpi" or "nccl"
  virtual MemorySpace memory() const = 0;

  // Point to point, non-blocking; the buffer must stay valid until the request completes.
  // Messages between one pair of ranks with the same tag arrive in posting order. A receive
  // names the byte count of its send.
  virtual Request isend(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual Request irecv(void* buf, size_t bytes, int peer, int tag) = 0;
  // True (and `r` invalidated) when the transfer is complete.
  virtual bool test(Request& r) = 0;
  // Blocks until complete; after timeout() seconds throws CommError naming `what` and the peer,
  // and gives the transfer up. The time spent blocked here is added to wait_seconds().
  virtual void wait(Request& r, const std::string& what) = 0;
  void wait_all(std::span<Request> requests, const std::string& what) {
    for (Request& r : requests)
      if (r.valid()) wait(r, what);
  }
  // Lets outstanding transfers advance; cheap, called from compute loops between tiles. Any
  // thread may call it; it does something only on the thread that owns the communicator. Never
  // throws: an error it meets is thrown by the next test() or wait() of that transfer.
  virtual void progress() = 0;

  // Steps: a set of sends and receives posted as one unit and completed as one unit (on NCCL,
  // one ncclGroupStart/ncclGroupEnd). No tags: every rank posts its steps in the same order,
  // including steps in which it moves nothing (an empty span), so that a send of step n to rank
  // b meets the receive of b's step n; within one step, several transfers between the same pair
  // match in the order listed. Buffers stay valid until the step completes. wait_step blocks
  // until every transfer of the step is complete, bounded by timeout() like wait() (CommError
  // naming `what`); its time is added to wait_seconds(). Steps use their own matching: they never
  // meet messages of isend/irecv. This base implementation posts isend/irecv on a tag reserved
  // for steps (MPI keeps messages of one pair and tag in order); a transport may do better.
  virtual StepHandle post_step(std::span<const StepTransfer> transfers);
  virtual void wait_step(StepHandle& step, const std::string& what);
  // Steps posted so far on this communicator (also the number the next one gets).
  int64_t steps_posted() const { return steps_posted_; }
  // The tag the base implementation reserves for steps (the least tag bound MPI guarantees).
  static constexpr int kStepTag = 32767;

  // Collectives: blocking, bounded by the timeout, same call order on every rank.
  virtual void allreduce(void* buf, size_t count, DType type, ReduceOp op) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void allgather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  // Rank r contributes recv_bytes[r] bytes; recv holds them concatenated in rank order.
  virtual void allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) = 0;
  // send holds size() consecutive blocks, block r of counts[r] elements; rank r receives the
  // reduction over ranks of block r.
  virtual void reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DType type,
                              ReduceOp op) = 0;
  // All-to-all with per-peer sizes (DeepSpeed-Ulysses' sequence-for-head swap): send holds
  // size() consecutive blocks, block j of send_bytes[j] bytes going to rank j; recv receives
  // them in rank order, block i of recv_bytes[i] bytes from rank i. recv_bytes[i] on this rank
  // must equal send_bytes[this rank] on rank i. The buffers must not overlap.
  // This default posts every receive and send on point-to-point tag kAlltoallTag and waits for
  // them (bounded by the timeout, link emulation applies); communicators with a native
  // all-to-all override it.
  static constexpr int kAlltoallTag = 32766;
  virtual void alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                         std::span<const size_t> recv_bytes);
  virtual void barrier() = 0;
  // Ends every rank of the job now with this exit code.
  [[noreturn]] virtual void abort(int exit_code) = 0;
  // Ranks with the same color form a new communicator ordered by key; color < 0 gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // The node of every rank (collective): entry r is the same for ranks that share a node, and is
  // the least rank of that node. MPI asks MPI_Comm_split_type (MPI_COMM_TYPE_SHARED); this default
  // compares host names.
  virtual std::vector<int> node_of_ranks();

  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

  // Counters: payload bytes posted by isend and post_step, and seconds blocked in wait() and
  // wait_step() (time in collectives is not counted: wait_seconds is the time compute waited for
  // point-to-point data).
  uint64_t bytes_sent() const { return bytes_sent_; }
  double wait_seconds() const { return wait_seconds_; }
  void reset_counters() {
    bytes_sent_ = 0;
    wait_seconds_ = 0.0;
  }

 protected:
  double timeout_s_ = 300.0;
  uint64_t bytes_sent_ = 0;
  double wait_seconds_ = 0.0;
  int64_t steps_posted_ = 0;

 private:
  std::vector<std::pair<int64_t, std::vector<Request>>> open_steps_;  // base implementation: by step id
};

}  // namespace ringattn::comm
