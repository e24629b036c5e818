#include "comm/mpi_communicator.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <sstream>

#include "util/stopwatch.hpp"

namespace ringattn::comm {
namespace {

// Polling pace of blocking calls (see the header). A rank with a core of its own polls without
// pause, as MPI_Wait does: Open MPI moves a large message over shared memory only while a rank is
// inside an MPI call, so sleeping between polls slows the transfer itself (measured: 64 MiB took
// 182 ms with 50-200 us sleeps against 8 ms polling). Only when the node runs more ranks than it
// has cores (oversubscribed, as in tests) does a waiting rank spin briefly, then sleep, longer and
// longer, to leave the core to a rank that computes.
constexpr double kSpinSeconds = 50e-6;
constexpr double kFirstSleepSeconds = 50e-6;
constexpr double kLongestSleepSeconds = 200e-6;

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::u8: return MPI_UINT8_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16: break;  // MPI has no 16-bit floats to reduce
  }
  throw std::invalid_argument(std::string("the MPI communicator cannot reduce ") + dtype_name(t) + " values");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

const char* op_name(ReduceOp op) {
  static const char* names[] = {"sum", "max", "min"};
  return names[static_cast<int>(op)];
}

// "4 x f32, sum": what a reduction was about, for error messages.
std::string reduction_text(size_t count, DType type, ReduceOp op) {
  return std::to_string(count) + " x " + dtype_name(type) + ", " + op_name(op);
}

std::string seconds_text(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

void sleep_seconds(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// More ranks on this node than online cores (the launcher's local size, where it says one).
bool node_oversubscribed() {
  static const bool oversubscribed = [] {
    // Set by whoever knows better than the rank count of this node, e.g. launch/cluster/netns.sh,
    // whose nodes share one machine's cores.
    if (const char* forced = std::getenv("RINGATTN_OVERSUBSCRIBED"); forced && *forced)
      return std::string(forced) != "0";
    long local = 0;
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"})
      if (const char* v = std::getenv(name)) local = std::max(local, std::strtol(v, nullptr, 10));
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return local > 0 && cores > 0 && local > cores;
  }();
  return oversubscribed;
}

// Request ids are unique in the process, so a request waited on the wrong communicator is an
// error rather than someone else's transfer.
int64_t next_request_id() {
  static std::atomic<int64_t> next{0};
  return next++;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, size_t chunk_bytes)
    : chunk_bytes_(chunk_bytes), owner_(std::this_thread::get_id()) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw CommError("MpiCommunicator: MPI is not initialised (the program calls MPI_Init_thread first)");
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  any_thread_ = level >= MPI_THREAD_SERIALIZED;
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  if (chunk_bytes_ == 0 || chunk_bytes_ > size_t(INT_MAX))
    throw CommError("MpiCommunicator: chunk_bytes must be between 1 and 2^31 - 1, not " + std::to_string(chunk_bytes));
  MPI_Request req;
  check(MPI_Comm_idup(comm, &comm_, &req), "MPI_Comm_idup");
  finish_collective(req, "creating the communicator (MPI_Comm_idup)");
  adopt();
}

MpiCommunicator::MpiCommunicator(MPI_Comm owned, const MpiCommunicator& parent)
    : comm_(owned),
      chunk_bytes_(parent.chunk_bytes_),
      owner_(parent.owner_.load()),
      any_thread_(parent.any_thread_),
      gate_(parent.gate_) {
  timeout_s_ = parent.timeout_s_;
  adopt();
}

void MpiCommunicator::adopt() {
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found);
  tag_ub_ = found ? *tag_ub : 32767;  // the least MPI guarantees

  // Error messages name ranks of this communicator; in a sub-communicator also the world's.
  MPI_Group group, world;
  MPI_Comm_group(comm_, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(size_), world_ranks(size_);
  std::iota(ranks.begin(), ranks.end(), 0);
  MPI_Group_translate_ranks(group, size_, ranks.data(), world, world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size != size_ || world_ranks != ranks) world_ranks_ = std::move(world_ranks);

  MPI_Comm roll_call_comm = MPI_COMM_NULL;
  MPI_Request req;
  check(MPI_Comm_idup(comm_, &roll_call_comm, &req), "MPI_Comm_idup");
  finish_collective(req, "creating the communicator's roll call (MPI_Comm_idup)");
  roll_call_ = std::make_unique<RollCall>(roll_call_comm);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // too late to touch MPI objects; MPI_Finalize has released them
  for (auto& [id, t] : transfers_) release(t);
  MPI_Comm_free(&comm_);
}

// Every public call that reaches MPI holds the family's gate for its duration: one thread at a
// time (a nested call of the holder passes), taken by compare-and-swap before the thread check,
// so that the check and a hand-over see no other thread inside (nor its transfers changing).
class MpiCommunicator::Entry {
 public:
  Entry(const MpiCommunicator& c, const char* call) : gate_(*c.gate_) {
    if (!enter(gate_))
      throw CommError(c.prefix() + call +
                      " called from a second thread while another thread is inside a call of this communicator "
                      "(or of one split from it); MPI calls must not overlap (one thread at a time)");
    try {
      c.check_thread(call);
    } catch (...) {
      leave(gate_);
      throw;
    }
  }
  ~Entry() { leave(gate_); }
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;

  // Takes the gate for this thread (again, if it holds it); false if another thread holds it.
  static bool enter(CallGate& gate) {
    const std::thread::id self = std::this_thread::get_id();
    if (gate.holder.load(std::memory_order_acquire) == self) {
      ++gate.depth;
      return true;
    }
    std::thread::id none;
    if (!gate.holder.compare_exchange_strong(none, self, std::memory_order_acq_rel)) return false;
    gate.depth = 1;
    return true;
  }
  static void leave(CallGate& gate) {
    if (--gate.depth == 0) gate.holder.store(std::thread::id(), std::memory_order_release);
  }

 private:
  CallGate& gate_;
};

// ---- point to point ----

Request MpiCommunicator::isend(const void* buf, size_t bytes, int peer, int tag) {
  // MPI reads a send buffer only; the cast lets sends and receives share post().
  return post(const_cast<void*>(buf), bytes, peer, tag, true);
}

Request MpiCommunicator::irecv(void* buf, size_t bytes, int peer, int tag) { return post(buf, bytes, peer, tag, false); }

Request MpiCommunicator::post(void* buf, size_t bytes, int peer, int tag, bool is_send) {
  const char* call = is_send ? "isend" : "irecv";
  const Entry entry(*this, call);
  if (peer < 0 || peer >= size_)
    throw CommError(prefix() + call + " with rank " + std::to_string(peer) + ", which is not in this communicator of " +
                    std::to_string(size_) + " ranks");
  if (tag < 0 || tag > tag_ub_)
    throw CommError(prefix() + call + " with tag " + std::to_string(tag) + ", outside MPI's [0, " + std::to_string(tag_ub_) +
                    "]");
  Transfer t;
  t.is_send = is_send;
  t.peer = peer;
  t.tag = tag;
  t.bytes = bytes;
  // Consecutive chunks with one tag between one pair arrive in order (MPI's non-overtaking rule).
  size_t offset = 0;
  do {
    const int n = int(std::min(chunk_bytes_, bytes - offset));
    char* p = static_cast<char*>(buf) + offset;
    MPI_Request req;
    if (is_send)
      check(MPI_Isend(p, n, MPI_BYTE, peer, tag, comm_, &req), "MPI_Isend");
    else
      check(MPI_Irecv(p, n, MPI_BYTE, peer, tag, comm_, &req), "MPI_Irecv");
    t.chunks.push_back(req);
    offset += size_t(n);
  } while (offset < bytes);
  if (is_send) bytes_sent_ += bytes;
  const int64_t id = next_request_id();
  transfers_.emplace(id, std::move(t));
  return Request{id};
}

// Tests the chunks in order up to the first unfinished one; MPI_Test turns finished ones into
// MPI_REQUEST_NULL, so each is checked once. A failed transfer keeps its error: every later
// test says the same.
bool MpiCommunicator::mpi_test(Transfer& t) {
  auto fail = [&](std::string message) {
    t.error = std::move(message);
    return CommError(t.error);
  };
  if (!t.error.empty()) throw CommError(t.error);
  for (size_t i = 0; i < t.chunks.size() && !t.mpi_done; ++i) {
    MPI_Request& req = t.chunks[i];
    if (req == MPI_REQUEST_NULL) continue;
    int flag = 0;
    MPI_Status status;
    if (int err = MPI_Test(&req, &flag, &status); err != MPI_SUCCESS)
      throw fail(mpi_error(err, "MPI_Test of " + transfer_text(t)).what());
    if (!flag) return false;
    if (!t.is_send) {
      int received = 0;
      MPI_Get_count(&status, MPI_BYTE, &received);
      const size_t expected = std::min(chunk_bytes_, t.bytes - i * chunk_bytes_);
      if (size_t(received) != expected)
        throw fail(prefix() + "received " + std::to_string(received) + " bytes in " + transfer_text(t) + ", expected " +
                   std::to_string(expected) + " (the sender posted a different size)");
    }
  }
  t.mpi_done = true;
  return true;
}

bool MpiCommunicator::test(Request& r) {
  if (!r.valid()) return true;
  const Entry entry(*this, "test");
  auto it = find(r, "test");
  Transfer& t = it->second;
  bool done = false;
  try {
    done = mpi_test(t);
  } catch (const CommError&) {
    forget(it, r);
    throw;
  }
  if (done) forget(it, r);
  return done;
}

void MpiCommunicator::wait(Request& r, const std::string& what) {
  if (!r.valid()) return;
  const Entry entry(*this, "wait");
  auto it = find(r, "wait");
  Transfer& t = it->second;
  const Stopwatch blocked;
  bool done = false;
  try {
    done = block([&] { return mpi_test(t); });
  } catch (const CommError&) {
    forget(it, r);
    throw;
  }
  wait_seconds_ += blocked.seconds();
  if (!done) {
    const std::string message = prefix() + "timed out after " + seconds_text(timeout_s_) + " s waiting for '" + what +
                                "' " + (t.is_send ? "to reach " : "from ") + describe(t.peer) + " (tag " +
                                std::to_string(t.tag) + ", " + std::to_string(t.bytes) + " bytes)";
    const std::string found = roll_call_report();
    forget(it, r);
    throw CommError(found.empty() ? message : message + "; " + found);
  }
  forget(it, r);
}

void MpiCommunicator::progress() {
  if (std::this_thread::get_id() != owner_.load(std::memory_order_relaxed)) return;
  // Holds the gate while it may touch MPI, so that no other thread takes over meanwhile; with
  // another thread inside a call, that call polls. Ownership is checked again once held (it may
  // have passed to another thread since the check above, which spares compute threads the gate).
  if (!Entry::enter(*gate_)) return;
  struct Leave {
    CallGate& gate;
    ~Leave() { Entry::leave(gate); }
  } leave{*gate_};
  if (std::this_thread::get_id() != owner_.load(std::memory_order_relaxed) || transfers_.empty()) return;
  for (auto& [id, t] : transfers_)
    if (!t.mpi_done && t.error.empty()) {
      try {
        mpi_test(t);  // one pass of the progress engine advances every transfer
      } catch (const CommError&) {
        // kept in t.error for the next test() or wait()
      }
      return;
    }
}

std::map<int64_t, MpiCommunicator::Transfer>::iterator MpiCommunicator::find(const Request& r, const char* call) {
  auto it = transfers_.find(r.id);
  if (it == transfers_.end())
    throw CommError(prefix() + call + " of request " + std::to_string(r.id) +
                    ", which this communicator does not hold (completed already, or posted on another one)");
  return it;
}

// Drops a transfer that is done, failed or timed out, and invalidates its request.
void MpiCommunicator::forget(std::map<int64_t, Transfer>::iterator it, Request& r) {
  release(it->second);
  transfers_.erase(it);
  r.id = -1;
}

// Gives up the chunks MPI has not finished (see the header: after a timeout).
void MpiCommunicator::release(Transfer& t) {
  for (MPI_Request& req : t.chunks) {
    if (req == MPI_REQUEST_NULL) continue;
    if (!t.is_send) MPI_Cancel(&req);
    MPI_Request_free(&req);
  }
}

template <class Done>
bool MpiCommunicator::block(Done done) {
  const double start = now_seconds();
  double pause = kFirstSleepSeconds;
  for (;;) {
    if (roll_call_) roll_call_->answer();
    if (done()) return true;
    const double now = now_seconds();
    const double until_timeout = start + timeout_s_ - now;
    if (until_timeout <= 0.0) return false;
    if (node_oversubscribed() && now - start >= kSpinSeconds) {
      sleep_seconds(std::min(pause, until_timeout));
      pause = std::min(2 * pause, kLongestSleepSeconds);
    } else {
      // Poll again at once, but let a runnable thread of another process go first (as Open
      // MPI's mpi_yield_when_idle does): free when the core is ours, fair when it is not.
      sched_yield();
    }
  }
}

// ---- collectives ----

void MpiCommunicator::finish_collective(MPI_Request& req, const std::string& what) {
  const bool done = block([&] {
    int flag = 0;
    check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    return flag != 0;
  });
  if (!done) {
    const std::string found = roll_call_report();
    throw CommError(prefix() + "timed out after " + seconds_text(timeout_s_) + " s in " + what + ": " +
                    (found.empty() ? "some rank of this communicator of " + std::to_string(size_) +
                                         " ranks did not join it"
                                   : found));
  }
}

std::string MpiCommunicator::roll_call_report() {
  if (!roll_call_ || size_ == 1) return "";
  const double grace = roll_call_grace();
  return roll_call_text(roll_call_->absent(grace), size_, grace, [this](int r) { return describe(r); });
}

void MpiCommunicator::allreduce(void* buf, size_t count, DType type, ReduceOp op) {
  const Entry entry(*this, "allreduce");
  MPI_Request req;
  check(MPI_Iallreduce(MPI_IN_PLACE, buf, int_count(count, "allreduce"), mpi_type(type), mpi_op(op), comm_, &req),
        "MPI_Iallreduce");
  finish_collective(req, "allreduce (" + reduction_text(count, type, op) + ")");
}

void MpiCommunicator::broadcast(void* buf, size_t bytes, int root) {
  const Entry entry(*this, "broadcast");
  MPI_Request req;
  check(MPI_Ibcast(buf, int_count(bytes, "broadcast"), MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
  finish_collective(req, "broadcast (" + std::to_string(bytes) + " bytes from " + describe(root) + ")");
}

void MpiCommunicator::allgather(const void* send, void* recv, size_t bytes_per_rank) {
  const Entry entry(*this, "allgather");
  const int n = int_count(bytes_per_rank, "allgather");
  // This rank's block already in place: MPI forbids overlapping buffers and wants MPI_IN_PLACE.
  const void* mine = send == static_cast<char*>(recv) + size_t(rank_) * bytes_per_rank ? MPI_IN_PLACE : send;
  MPI_Request req;
  check(MPI_Iallgather(mine, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req), "MPI_Iallgather");
  finish_collective(req, "allgather (" + std::to_string(bytes_per_rank) + " bytes per rank)");
}

void MpiCommunicator::allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) {
  const Entry entry(*this, "allgatherv");
  check_per_rank(recv_bytes.size(), "allgatherv");
  // Members, not locals: MPI may read them until the operation completes, which after a
  // timeout is after this call has returned.
  counts_.resize(size_);
  displacements_.resize(size_);
  size_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    counts_[r] = int_count(recv_bytes[r], "allgatherv");
    displacements_[r] = int_count(offset, "allgatherv");
    offset += recv_bytes[r];
  }
  const void* mine = send == static_cast<char*>(recv) + displacements_[rank_] ? MPI_IN_PLACE : send;
  MPI_Request req;
  check(MPI_Iallgatherv(mine, counts_[rank_], MPI_BYTE, recv, counts_.data(), displacements_.data(), MPI_BYTE, comm_,
                        &req),
        "MPI_Iallgatherv");
  finish_collective(req, "allgatherv (" + std::to_string(offset) + " bytes in all)");
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DType type,
                                     ReduceOp op) {
  const Entry entry(*this, "reduce_scatter");
  check_per_rank(counts.size(), "reduce_scatter");
  counts_.resize(size_);  // a member for the reason given in allgatherv
  for (int r = 0; r < size_; ++r) counts_[r] = int_count(counts[r], "reduce_scatter");
  MPI_Request req;
  check(MPI_Ireduce_scatter(send, recv, counts_.data(), mpi_type(type), mpi_op(op), comm_, &req), "MPI_Ireduce_scatter");
  finish_collective(req, "reduce_scatter (" + reduction_text(counts[rank_], type, op) + " to this rank)");
}

void MpiCommunicator::alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                                std::span<const size_t> recv_bytes) {
  const Entry entry(*this, "alltoallv");
  check_per_rank(send_bytes.size(), "alltoallv");
  check_per_rank(recv_bytes.size(), "alltoallv");
  size_t send_total = 0, recv_total = 0;
  for (int r = 0; r < size_; ++r) send_total += send_bytes[r], recv_total += recv_bytes[r];
  if (send_total > size_t(INT_MAX) || recv_total > size_t(INT_MAX)) {
    Communicator::alltoallv(send, send_bytes, recv, recv_bytes);
    return;
  }
  // Members, not locals: MPI may read them until the operation completes (see allgatherv).
  counts_.resize(size_);
  displacements_.resize(size_);
  send_counts_.resize(size_);
  send_displacements_.resize(size_);
  size_t send_offset = 0, recv_offset = 0;
  for (int r = 0; r < size_; ++r) {
    send_counts_[r] = int(send_bytes[r]);
    send_displacements_[r] = int(send_offset);
    counts_[r] = int(recv_bytes[r]);
    displacements_[r] = int(recv_offset);
    send_offset += send_bytes[r];
    recv_offset += recv_bytes[r];
  }
  MPI_Request req;
  check(MPI_Ialltoallv(send, send_counts_.data(), send_displacements_.data(), MPI_BYTE, recv, counts_.data(),
                       displacements_.data(), MPI_BYTE, comm_, &req),
        "MPI_Ialltoallv");
  finish_collective(req, "alltoallv (" + std::to_string(send_total) + " bytes sent, " + std::to_string(recv_total) +
                             " received)");
}

void MpiCommunicator::barrier() {
  const Entry entry(*this, "barrier");
  bounded_barrier("barrier");
}

void MpiCommunicator::bounded_barrier(const std::string& what) {
  MPI_Request req;
  check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
  finish_collective(req, what);
}

void MpiCommunicator::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this keeps the promise of [[noreturn]]
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  const Entry entry(*this, "split");
  // MPI_Comm_split blocks without a bound; enter it only once every rank has arrived.
  bounded_barrier("split (the barrier before MPI_Comm_split)");
  MPI_Comm sub = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::unique_ptr<Communicator>(new MpiCommunicator(sub, *this));
}

std::vector<int> MpiCommunicator::node_of_ranks() {
  const Entry entry(*this, "node_of_ranks");
  bounded_barrier("node_of_ranks (the barrier before MPI_Comm_split_type)");
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  // The node's rank 0 (keys are ranks here) is its least rank: translate it, no communication.
  MPI_Group node_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  int first = 0, least = rank_;
  MPI_Comm_group(node, &node_group);
  MPI_Comm_group(comm_, &group);
  MPI_Group_translate_ranks(node_group, 1, &first, group, &least);
  MPI_Group_free(&node_group);
  MPI_Group_free(&group);
  MPI_Comm_free(&node);
  std::vector<int> out(static_cast<size_t>(size_));
  allgather(&least, out.data(), sizeof least);
  return out;
}

// ---- errors ----

CommError MpiCommunicator::mpi_error(int mpi_error, const std::string& call) const {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(mpi_error, text, &length) != MPI_SUCCESS) length = 0;
  return CommError(prefix() + call + " failed: " + std::string(text, size_t(length)));
}

void MpiCommunicator::check(int mpi_error_code, const char* call) const {
  if (mpi_error_code != MPI_SUCCESS) throw mpi_error(mpi_error_code, call);
}

// MPI_THREAD_FUNNELED: only the creating thread calls MPI. MPI_THREAD_SERIALIZED or more: another
// thread may take over while nothing is outstanding (PyTorch runs the backward of CUDA tensors on
// its autograd device thread, not the one that ran the forward); it then owns the communicator,
// its progress() polls, until the next hand-over. A call from a second thread while the first is
// inside a call, or while transfers of the first are outstanding, would overlap MPI calls, which
// SERIALIZED forbids: an error.
void MpiCommunicator::check_thread(const char* call) const {
  const std::thread::id self = std::this_thread::get_id();
  if (self == owner_.load(std::memory_order_relaxed)) return;
  if (any_thread_ && transfers_.empty()) {
    owner_.store(self, std::memory_order_relaxed);
    return;
  }
  throw CommError(prefix() + call +
                  (any_thread_ ? " called from a second thread while " + std::to_string(transfers_.size()) +
                                     " transfers of another are outstanding; MPI calls must not overlap"
                               : std::string(" called off the thread that created the communicator; MPI "
                                             "runs at MPI_THREAD_FUNNELED (MPI_Query_thread), where only that "
                                             "thread may call it (MPI_THREAD_SERIALIZED or more lets another "
                                             "thread take over; the Python module asks for it)")));
}

void MpiCommunicator::check_per_rank(size_t n, const char* call) const {
  if (n != size_t(size_))
    throw CommError(prefix() + call + " given " + std::to_string(n) + " sizes for a communicator of " +
                    std::to_string(size_) + " ranks");
}

int MpiCommunicator::int_count(size_t n, const char* call) const {
  if (n > size_t(INT_MAX))
    throw CommError(prefix() + call + " of " + std::to_string(n) +
                    " elements exceeds MPI's int count (2^31 - 1); split it into several calls");
  return int(n);
}

std::string MpiCommunicator::describe(int rank) const {
  std::string text = "rank " + std::to_string(rank);
  if (rank >= 0 && size_t(rank) < world_ranks_.size()) text += " (world rank " + std::to_string(world_ranks_[rank]) + ")";
  return text;
}

std::string MpiCommunicator::prefix() const { return describe(rank_) + ": "; }

std::string MpiCommunicator::transfer_text(const Transfer& t) const {
  return std::string(t.is_send ? "the send to " : "the receive from ") + describe(t.peer) + " (tag " +
         std::to_string(t.tag) + ", " + std::to_string(t.bytes) + " bytes)";
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) { return std::make_unique<MpiCommunicator>(comm); }

}  // namespace ringattn::comm
