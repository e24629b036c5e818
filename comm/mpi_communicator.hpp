// The MPI communicator: point-to-point transfers and collectives over an MPI communicator, on
// host memory. The caller owns MPI_Init_thread (MPI_THREAD_FUNNELED or more) and MPI_Finalize.
//
// Threads. One thread at a time calls MPI: under FUNNELED the one that created the communicator;
// under SERIALIZED or MULTIPLE, whichever called last, and another may take over whenever no
// transfer is outstanding (check_thread). progress() called from any other thread, e.g. an OpenMP
// worker in a compute loop, returns at once; any other call from another thread throws CommError
// (FUNNELED, or while transfers are outstanding, or while another thread is inside a call of this
// communicator or of one split from it: two threads in blocking collectives at once would
// overlap MPI calls, which SERIALIZED forbids).
//
// Progress. MPI moves a large (rendezvous) message only while the processes at both ends are
// inside MPI calls, so compute loops call progress() between tiles. With nothing outstanding it
// costs a comparison, a compare-and-swap and a store; otherwise one MPI_Test on the oldest
// unfinished transfer: one pass of the MPI progress engine advances every transfer, so testing
// each would multiply the cost, not the progress. It never throws (an exception must not leave
// an OpenMP region): an error it meets is thrown by the next test() or wait() of that transfer.
//
// Timeouts. A blocking call polls MPI_Test without pause, as MPI_Wait does (a large message moves
// over shared memory only while a rank is inside MPI), yielding the core between polls to any
// other runnable process (sched_yield); when the node runs more ranks than cores
// (oversubscribed; RINGATTN_OVERSUBSCRIBED=1 or 0 says so where the launcher knows better, as on
// nodes that share one machine), it spins for 50 us, then sleeps 50 us growing to 200 us, leaving
// its core to a rank that computes. It throws CommError after timeout() seconds, naming this rank, the peer,
// the tag and what was awaited, and what a roll call found (roll_call.hpp): which ranks of the
// communicator did not answer within roll_call_grace() (timeout / 5, between 0.1 and 2 s) more,
// so that a collective, which cannot say who is missing, and a wait on a neighbour that is only
// waiting itself, both name the rank that stopped or died. Every blocking call answers roll
// calls. Collectives and creation use the non-blocking MPI calls (MPI_Iallreduce, ...,
// MPI_Comm_idup) for the same reason; MPI_Comm_split, which has none, is entered only after a
// bounded barrier has shown that every rank arrived.
// After a timeout, as after any CommError from test() or wait(), the request is invalid. A receive is cancelled (MPI_Cancel, MPI_Request_free),
// so a later message with its tag goes to a later receive. A send is let go (MPI_Request_free:
// Open MPI cannot cancel a rendezvous send) and is still delivered if the peer ever receives it.
// A collective can be neither cancelled nor freed and is left to MPI. The communicator stays
// usable, but a CommError is meant to end the job (exit code 4): until then MPI may still read a
// timed-out send's buffer or write a timed-out collective's.
//
// Large messages. MPI counts are int, so a transfer goes as consecutive messages of at most
// chunk_bytes (1 GiB); a receive must name the byte count of its send (checked on arrival).
// Collectives take at most 2^31 - 1 elements per rank and call (a larger one throws CommError).
//
// Counters. bytes_sent() counts isend payloads. wait_seconds() counts the time blocked in
// wait() only: the time compute waited for data ("exposed communication" in the benchmarks);
// time in collectives and in test() is not counted.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/roll_call.hpp"

namespace ringattn::comm {

class MpiCommunicator : public Communicator {
 public:
  static constexpr size_t kDefaultChunkBytes = size_t(1) << 30;

  // Works on a duplicate of `comm` (collective over it), so that its tags and its error handler
  // (MPI_ERRORS_RETURN) never meet the caller's. chunk_bytes is the largest single MPI message.
  explicit MpiCommunicator(MPI_Comm comm, size_t chunk_bytes = kDefaultChunkBytes);
  // Outstanding receives are cancelled and sends let go (MPI_Request_free); frees the duplicate.
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  MemorySpace memory() const override { return MemorySpace::host; }

  Request isend(const void* buf, size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, size_t bytes, int peer, int tag) override;
  bool test(Request& r) override;
  void wait(Request& r, const std::string& what) override;
  void progress() override;
  // Whether some thread is inside a call of this communicator's family now (tests, diagnostics).
  bool call_in_progress() const { return gate_->holder.load(std::memory_order_acquire) != std::thread::id(); }

  void allreduce(void* buf, size_t count, DType type, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override;
  void allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) override;
  void reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DType type,
                      ReduceOp op) override;
  // MPI_Ialltoallv; the point-to-point default (Communicator::alltoallv) when a size or offset
  // exceeds MPI's int.
  void alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                 std::span<const size_t> recv_bytes) override;
  void barrier() override;
  [[noreturn]] void abort(int exit_code) override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  // MPI_Comm_split_type (MPI_COMM_TYPE_SHARED), entered after a bounded barrier as split is.
  std::vector<int> node_of_ranks() override;

  MPI_Comm mpi_comm() const { return comm_; }
  // Transfers posted and not yet reported complete.
  size_t outstanding() const { return transfers_.size(); }

 private:
  // One posted isend or irecv: its MPI messages (one per chunk).
  struct Transfer {
    std::vector<MPI_Request> chunks;
    bool is_send = false;
    int peer = 0, tag = 0;
    size_t bytes = 0;
    bool mpi_done = false;
    std::string error;  // met by progress(), thrown by the next test() or wait()
  };

  // Adopts `owned` (from split), with the settings of `parent`.
  MpiCommunicator(MPI_Comm owned, const MpiCommunicator& parent);
  void adopt();

  Request post(void* buf, size_t bytes, int peer, int tag, bool is_send);
  std::map<int64_t, Transfer>::iterator find(const Request& r, const char* call);
  bool mpi_test(Transfer& t);
  void forget(std::map<int64_t, Transfer>::iterator it, Request& r);
  void release(Transfer& t);
  // Blocks until `done()`; false once timeout() seconds have passed.
  template <class Done>
  bool block(Done done);
  void finish_collective(MPI_Request& req, const std::string& what);
  // After a timeout: which ranks answer, in words ("" before the roll call exists).
  std::string roll_call_report();
  double roll_call_grace() const { return std::clamp(timeout_s_ / 5.0, 0.1, 2.0); }
  void bounded_barrier(const std::string& what);

  CommError mpi_error(int mpi_error, const std::string& call) const;
  void check(int mpi_error_code, const char* call) const;
  // Holds the family's CallGate for the lifetime of a public call, then checks the thread rule.
  class Entry;
  void check_thread(const char* call) const;
  void check_per_rank(size_t n, const char* call) const;
  int int_count(size_t n, const char* call) const;
  std::string describe(int rank) const;  // "rank 3", with the world rank in a sub-communicator
  std::string prefix() const;            // "rank 3: ", to begin error messages
  std::string transfer_text(const Transfer& t) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int tag_ub_ = 32767;
  std::vector<int> world_ranks_;  // empty when ranks here are the world's ranks
  size_t chunk_bytes_;
  // The thread that may call MPI: the creator's, or, when MPI runs at MPI_THREAD_SERIALIZED or more
  // (any_thread_), whichever thread last called in while nothing was outstanding (check_thread).
  // Atomic because compute threads read it in progress() while the owner may hand it on.
  mutable std::atomic<std::thread::id> owner_;
  bool any_thread_ = false;
  // The thread inside a call (Entry; progress() while it polls) of this communicator or of one
  // split from it, which share the gate: MPI's thread rule is per process, and a context's
  // Ulysses group talks on a split of the ring's communicator. Another thread arriving while it
  // is held would overlap MPI calls: refused. depth counts the holder's nested calls.
  struct CallGate {
    std::atomic<std::thread::id> holder{};
    int depth = 0;  // the holder's alone
  };
  std::shared_ptr<CallGate> gate_ = std::make_shared<CallGate>();
  std::map<int64_t, Transfer> transfers_;  // by request id, which grows in posting order
  std::vector<int> counts_, displacements_;  // arguments of the v-collectives
  std::vector<int> send_counts_, send_displacements_;  // alltoallv's send side
  std::unique_ptr<RollCall> roll_call_;      // on its own duplicate of comm_
};

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace ringattn::comm
