#include "comm/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/host_staged_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/nccl_schedule.hpp"
#include "comm/stopwatch.hpp"

namespace ringattn::comm {

namespace {

constexpr int kAnnounceTag = 1;  // on the private MPI duplicate

// What a sender tells its receiver about each message, in posting order.
struct Announcement {
  int64_t tag = 0;
  uint64_t bytes = 0;
};

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::u8:
      return ncclUint8;
    case DataType::i32:
      return ncclInt32;
    case DataType::i64:
      return ncclInt64;
    case DataType::f32:
      return ncclFloat32;
    case DataType::f64:
      return ncclFloat64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

void sleep_briefly(double waited_s) {
  // Spin for the first 50 us, then leave the core to ranks that compute.
  if (waited_s > 50e-6) std::this_thread::sleep_for(std::chrono::microseconds(waited_s > 1e-3 ? 200 : 50));
}

}  // namespace

struct NcclCommunicator::Impl {
  // One posted isend or irecv.
  struct Transfer {
    bool is_send = false;
    int peer = 0;
    int64_t tag = 0;
    size_t bytes = 0;          // the caller's size
    size_t message_bytes = 0;  // receives: the matched message's size
    void* user = nullptr;      // the caller's buffer
    void* device = nullptr;    // what the transfer reads or writes: user, or a temporary (host user)
    bool host_user = false;
    bool launched = false;
    cudaStream_t stream = nullptr;
    cudaEvent_t event = nullptr;  // recorded after the transfer on `stream`
    Announcement announcement;    // sends: what the receiver is told (MPI reads it until control completes)
    Request control;
  };
  // A message announced to this rank and not yet received; self-sends carry their transfer.
  struct Incoming {
    int64_t tag;
    size_t bytes;
    int64_t self_send = -1;
  };
  // A message received before its irecv was posted.
  struct Early {
    int64_t tag;
    size_t bytes;
    void* buffer;
    cudaEvent_t event;
  };

  explicit Impl(NcclCommunicator& owner) : self(owner) {}

  NcclCommunicator& self;
  std::unique_ptr<MpiCommunicator> control;
  int rank = 0, size = 1, device = 0;
  std::string node;
  ncclComm_t world = nullptr;
  cudaStream_t coll_stream = nullptr, self_stream = nullptr;
  std::vector<ncclComm_t> send_comm, recv_comm;  // by peer; this rank's entry unused
  std::vector<cudaStream_t> send_stream, recv_stream;
  void* scratch = nullptr;  // device bytes for connecting and barrier
  bool aborted = false;
  std::string error;  // met by progress(), thrown by the next call

  std::map<int64_t, Transfer> transfers;
  int64_t next_id = 0;
  std::vector<std::deque<Incoming>> announced;  // by sender, in its posting order
  std::vector<std::deque<int64_t>> posted;      // by sender: irecvs not yet launched, in posting order
  std::vector<std::deque<Early>> early;         // by sender
  std::vector<Announcement> announce_in;        // standing control receives, by sender
  std::vector<Request> announce_request;
  std::vector<cudaEvent_t> free_events;

  std::string prefix() const { return "rank " + std::to_string(rank) + " (nccl, " + node + "): "; }

  [[noreturn]] void fail(const std::string& what) {
    abort_all();
    throw CommError(prefix() + what);
  }

  void cuda(cudaError_t e, const char* call) {
    if (e != cudaSuccess) fail(std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }

  void nccl(ncclResult_t r, const char* call) {
    if (r != ncclSuccess && r != ncclInProgress) fail(std::string(call) + ": " + ncclGetErrorString(r));
  }

  // Aborts every NCCL communicator (never waits on them); the object is unusable afterwards.
  void abort_all() {
    if (aborted) return;
    aborted = true;
    for (ncclComm_t& c : send_comm)
      if (c) ncclCommAbort(c), c = nullptr;
    for (ncclComm_t& c : recv_comm)
      if (c) ncclCommAbort(c), c = nullptr;
    if (world) ncclCommAbort(world), world = nullptr;
  }

  void check_usable() {
    if (!error.empty()) {
      const std::string e = error;
      error.clear();
      fail(e);
    }
    if (aborted) throw CommError(prefix() + "the NCCL communicator was aborted after an earlier error");
  }

  // ncclCommGetAsyncError on a communicator a wait depends on.
  void check_async(ncclComm_t comm, const std::string& what) {
    if (!comm) return;
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || (state != ncclSuccess && state != ncclInProgress))
      fail("NCCL error while waiting for " + what + ": " + ncclGetErrorString(state));
  }

  cudaEvent_t acquire_event() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }

  void* temporary(size_t bytes, cudaStream_t stream) {
    void* p = nullptr;
    // Stream-ordered: unlike cudaMalloc/cudaFree, never waits for the device (where NCCL kernels
    // may be waiting for peers that wait for us).
    cuda(cudaMallocAsync(&p, bytes ? bytes : 1, stream), "cudaMallocAsync");
    return p;
  }

  // Blocks until `event` completed, bounded by the timeout; `comm` is checked for async errors.
  void wait_event(cudaEvent_t event, ncclComm_t comm, const std::string& what) {
    const Stopwatch clock;
    for (;;) {
      const cudaError_t e = cudaEventQuery(event);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda(e, "cudaEventQuery");
      check_async(comm, what);
      if (clock.seconds() > self.timeout())
        fail("timed out after " + std::to_string(self.timeout()) + " s waiting for " + what);
      sleep_briefly(clock.seconds());
    }
  }

  cudaStream_t receive_stream(int peer) const { return peer == rank ? self_stream : recv_stream[size_t(peer)]; }
  ncclComm_t receive_comm(int peer) const { return peer == rank ? nullptr : recv_comm[size_t(peer)]; }

  // Receives announced message `in` from `peer` into `dst`, recording `event` after it.
  void launch_receive(int peer, const Incoming& in, void* dst, cudaEvent_t event) {
    cudaStream_t stream = receive_stream(peer);
    if (peer == rank) {
      Transfer& s = transfers.at(in.self_send);
      if (in.bytes) cuda(cudaMemcpyAsync(dst, s.device, in.bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
      cuda(cudaEventRecord(s.event, stream), "cudaEventRecord");
      s.launched = true;
    } else if (in.bytes) {
      nccl(ncclRecv(dst, in.bytes, ncclUint8, 0, recv_comm[size_t(peer)], stream), "ncclRecv");
    }
    cuda(cudaEventRecord(event, stream), "cudaEventRecord");
  }

  // Launches the receives of `peer`'s announced messages, in its order (see the header).
  void advance(int peer) {
    auto& queue = announced[size_t(peer)];
    auto& waiting = posted[size_t(peer)];
    while (!queue.empty()) {
      const Incoming in = queue.front();
      auto match =
          std::find_if(waiting.begin(), waiting.end(), [&](int64_t id) { return transfers.at(id).tag == in.tag; });
      if (match != waiting.end()) {
        Transfer& t = transfers.at(*match);
        if (in.bytes > t.bytes)
          fail("a message of " + std::to_string(in.bytes) + " bytes from rank " + std::to_string(peer) + " (tag " +
               std::to_string(in.tag) + ") is larger than its receive of " + std::to_string(t.bytes) + " bytes");
        launch_receive(peer, in, t.device, t.event);
        t.launched = true;
        t.message_bytes = in.bytes;
        waiting.erase(match);
        queue.pop_front();
        continue;
      }
      // No receive posted for the oldest message: receive it early only if a later message of
      // this sender is wanted already (NCCL delivers them in order).
      bool later_wanted = false;
      for (size_t k = 1; k < queue.size() && !later_wanted; ++k)
        for (int64_t id : waiting) later_wanted = later_wanted || transfers.at(id).tag == queue[k].tag;
      if (!later_wanted) return;
      Early e{in.tag, in.bytes, temporary(in.bytes, receive_stream(peer)), acquire_event()};
      launch_receive(peer, in, e.buffer, e.event);
      early[size_t(peer)].push_back(e);
      queue.pop_front();
    }
  }

  // Collects announcements that arrived and launches what they allow.
  void poll() {
    control->progress();
    for (int x = 0; x < size; ++x) {
      if (x == rank) continue;
      bool any = false;
      while (announce_request[size_t(x)].valid() && control->test(announce_request[size_t(x)])) {
        const Announcement& a = announce_in[size_t(x)];
        announced[size_t(x)].push_back(Incoming{a.tag, size_t(a.bytes)});
        announce_request[size_t(x)] = control->irecv(&announce_in[size_t(x)], sizeof(Announcement), x, kAnnounceTag);
        any = true;
      }
      if (any) advance(x);
    }
  }

  // Completes a transfer whose event has fired: copies a staged receive to the host, frees
  // temporaries, recycles the event.
  void complete(Transfer& t) {
    if (t.host_user) {
      if (!t.is_send && t.message_bytes) {
        cuda(cudaMemcpyAsync(t.user, t.device, t.message_bytes, cudaMemcpyDeviceToHost, t.stream), "cudaMemcpyAsync");
        cuda(cudaStreamSynchronize(t.stream), "cudaStreamSynchronize");
      }
      cuda(cudaFreeAsync(t.device, t.stream), "cudaFreeAsync");
    }
    free_events.push_back(t.event);
  }

  std::string describe(const Transfer& t) const {
    return std::string(t.is_send ? "send of " : "receive of ") + std::to_string(t.bytes) + " bytes " +
           (t.is_send ? "to" : "from") + " rank " + std::to_string(t.peer) + ", tag " + std::to_string(t.tag);
  }

  // A device pointer for `bytes` of `p` on the collective stream (a temporary for host memory).
  void* device_view(const void* p, size_t bytes, bool copy_in) {
    if (bytes == 0 || is_device_pointer(p)) return const_cast<void*>(p);
    void* d = temporary(bytes, coll_stream);
    if (copy_in) cuda(cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, coll_stream), "cudaMemcpyAsync");
    return d;
  }

  void finish_collective(const std::string& what) {
    cudaEvent_t e = acquire_event();
    cuda(cudaEventRecord(e, coll_stream), "cudaEventRecord");
    wait_event(e, world, what);
    free_events.push_back(e);
  }

  void copy_out(void* host, void* device_copy, size_t bytes) {
    if (device_copy == host) return;
    cuda(cudaMemcpyAsync(host, device_copy, bytes, cudaMemcpyDeviceToHost, coll_stream), "cudaMemcpyAsync");
    cuda(cudaFreeAsync(device_copy, coll_stream), "cudaFreeAsync");
    cuda(cudaStreamSynchronize(coll_stream), "cudaStreamSynchronize");
  }

  void drop(const void* user, void* device_copy) {
    if (device_copy != user) cuda(cudaFreeAsync(device_copy, coll_stream), "cudaFreeAsync");
  }

  void init(MPI_Comm comm, int chosen_device);
  ~Impl();
};

void NcclCommunicator::Impl::init(MPI_Comm comm, int chosen_device) {
  control = std::make_unique<MpiCommunicator>(comm);
  control->set_timeout(self.timeout());
  rank = control->rank();
  size = control->size();
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  node.assign(name, size_t(len));

  if (chosen_device < 0) {
    MPI_Comm node_comm;
    MPI_Comm_split_type(control->mpi_comm(), MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm);
    int local_rank = 0, local_ranks = 1;
    MPI_Comm_rank(node_comm, &local_rank);
    MPI_Comm_size(node_comm, &local_ranks);
    MPI_Comm_free(&node_comm);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) {
      cudaGetLastError();
      devices = 0;
    }
    std::string problem;
    try {
      chosen_device = gpu_for_local_rank(local_rank, local_ranks, devices, node);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    // Every rank fails if one does (the others would wait in ncclCommInitRank forever).
    int32_t bad = problem.empty() ? 0 : 1;
    control->allreduce(&bad, 1, DataType::i32, ReduceOp::max);
    if (bad)
      throw std::runtime_error(
          problem.empty() ? "NCCL communicator: another node has more ranks than GPUs (see its error)" : problem);
  }
  device = chosen_device;
  cuda(cudaSetDevice(device), "cudaSetDevice");
  int least = 0, greatest = 0;
  cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  // Communication streams get the highest priority, so transfers are not starved by compute.
  auto make_stream = [&](cudaStream_t& s) {
    cuda(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
  };
  make_stream(coll_stream);
  make_stream(self_stream);
  cuda(cudaMalloc(&scratch, size_t(2 * size + 16)), "cudaMalloc");

  ncclUniqueId id{};
  if (rank == 0) nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  control->broadcast(&id, sizeof id, 0);
  nccl(ncclCommInitRank(&world, size, id, rank), "ncclCommInitRank (world)");

  announced.resize(size_t(size));
  posted.resize(size_t(size));
  early.resize(size_t(size));
  announce_in.resize(size_t(size));
  announce_request.resize(size_t(size));
  send_comm.assign(size_t(size), nullptr);
  recv_comm.assign(size_t(size), nullptr);
  send_stream.assign(size_t(size), nullptr);
  recv_stream.assign(size_t(size), nullptr);
  if (size == 1) return;

  // One two-rank communicator per ordered pair: sender is rank 0 in it, receiver rank 1.
  std::vector<ncclUniqueId> mine(static_cast<size_t>(size)), all(static_cast<size_t>(size) * size_t(size));
  for (int y = 0; y < size; ++y)
    if (y != rank) nccl(ncclGetUniqueId(&mine[size_t(y)]), "ncclGetUniqueId");
  control->allgather(mine.data(), all.data(), sizeof(ncclUniqueId) * size_t(size));
  for (int x = 0; x < size; ++x) {
    if (x == rank) continue;
    make_stream(send_stream[size_t(x)]);
    make_stream(recv_stream[size_t(x)]);
  }
  // Create and connect the pair communicators in tournament rounds (nccl_schedule.hpp): both
  // sides of a pair reach it in the same round, and each call below blocks until they do (the
  // first transfer on a pair sets up its connection, which would otherwise block a later isend
  // until the peer posts its side). Within a round: lower rank -> higher first, then back.
  auto* bytes = static_cast<unsigned char*>(scratch);
  for (int round = 0; round < round_robin_rounds(size); ++round) {
    const int partner = round_robin_partner(rank, round, size);
    if (partner < 0) continue;
    const int lo = std::min(rank, partner), hi = std::max(rank, partner);
    for (const auto& [from, to] : {std::pair{lo, hi}, std::pair{hi, lo}}) {
      const ncclUniqueId& pair_id = all[size_t(from) * size_t(size) + size_t(to)];
      if (rank == from) {
        nccl(ncclCommInitRank(&send_comm[size_t(to)], 2, pair_id, 0), "ncclCommInitRank (pair, sender)");
        nccl(ncclSend(bytes + to, 1, ncclUint8, 1, send_comm[size_t(to)], send_stream[size_t(to)]),
             "ncclSend (connect)");
      } else {
        nccl(ncclCommInitRank(&recv_comm[size_t(from)], 2, pair_id, 1), "ncclCommInitRank (pair, receiver)");
        nccl(ncclRecv(bytes + size + from, 1, ncclUint8, 0, recv_comm[size_t(from)], recv_stream[size_t(from)]),
             "ncclRecv (connect)");
      }
    }
  }
  for (int x = 0; x < size; ++x) {
    if (x == rank) continue;
    for (cudaStream_t s : {send_stream[size_t(x)], recv_stream[size_t(x)]}) {
      cudaEvent_t e = acquire_event();
      cuda(cudaEventRecord(e, s), "cudaEventRecord");
      wait_event(e, world, "connecting to rank " + std::to_string(x));
      free_events.push_back(e);
    }
  }
  for (int x = 0; x < size; ++x)
    if (x != rank)
      announce_request[size_t(x)] = control->irecv(&announce_in[size_t(x)], sizeof(Announcement), x, kAnnounceTag);
}

NcclCommunicator::Impl::~Impl() {
  // With transfers outstanding (an error, a caller that gave up), do not wait for them.
  if (!transfers.empty()) abort_all();
  if (!aborted) {
    for (ncclComm_t c : send_comm)
      if (c) ncclCommDestroy(c);
    for (ncclComm_t c : recv_comm)
      if (c) ncclCommDestroy(c);
    if (world) ncclCommDestroy(world);
  }
  for (auto& list : early)
    for (Early& e : list) cudaFreeAsync(e.buffer, coll_stream), cudaEventDestroy(e.event);
  for (cudaEvent_t e : free_events) cudaEventDestroy(e);
  if (coll_stream) cudaStreamSynchronize(coll_stream);
  for (cudaStream_t s : send_stream)
    if (s) cudaStreamDestroy(s);
  for (cudaStream_t s : recv_stream)
    if (s) cudaStreamDestroy(s);
  if (self_stream) cudaStreamDestroy(self_stream);
  if (coll_stream) cudaStreamDestroy(coll_stream);
  if (scratch) cudaFree(scratch);
}

NcclCommunicator::NcclCommunicator(MPI_Comm comm) : NcclCommunicator(comm, -1) {}

NcclCommunicator::NcclCommunicator(MPI_Comm comm, int device) : impl_(std::make_unique<Impl>(*this)) {
  impl_->init(comm, device);
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
int NcclCommunicator::device() const { return impl_->device; }

Request NcclCommunicator::isend(const void* buf, size_t bytes, int peer, int tag) {
  Impl& m = *impl_;
  m.check_usable();
  if (peer < 0 || peer >= m.size)
    throw CommError(m.prefix() + "isend to rank " + std::to_string(peer) + " of " + std::to_string(m.size));
  const int64_t id = m.next_id++;
  Impl::Transfer& t = m.transfers[id];
  t.is_send = true, t.peer = peer, t.tag = tag, t.bytes = bytes;
  t.user = const_cast<void*>(buf);
  t.stream = peer == m.rank ? m.self_stream : m.send_stream[size_t(peer)];
  t.event = m.acquire_event();
  t.host_user = bytes > 0 && !is_device_pointer(buf);
  t.device = t.user;
  if (t.host_user) {
    t.device = m.temporary(bytes, t.stream);
    m.cuda(cudaMemcpyAsync(t.device, buf, bytes, cudaMemcpyHostToDevice, t.stream), "cudaMemcpyAsync");
  }
  bytes_sent_ += bytes;
  if (peer == m.rank) {  // launched when a receive matches it
    m.announced[size_t(peer)].push_back(Impl::Incoming{tag, bytes, id});
    m.advance(peer);
    return Request{id};
  }
  if (bytes) m.nccl(ncclSend(t.device, bytes, ncclUint8, 1, m.send_comm[size_t(peer)], t.stream), "ncclSend");
  m.cuda(cudaEventRecord(t.event, t.stream), "cudaEventRecord");
  t.launched = true;
  t.announcement = Announcement{tag, bytes};
  t.control = m.control->isend(&t.announcement, sizeof(Announcement), peer, kAnnounceTag);
  return Request{id};
}

Request NcclCommunicator::irecv(void* buf, size_t bytes, int peer, int tag) {
  Impl& m = *impl_;
  m.check_usable();
  if (peer < 0 || peer >= m.size)
    throw CommError(m.prefix() + "irecv from rank " + std::to_string(peer) + " of " + std::to_string(m.size));
  const int64_t id = m.next_id++;
  Impl::Transfer& t = m.transfers[id];
  t.peer = peer, t.tag = tag, t.bytes = bytes, t.user = buf;
  t.stream = m.receive_stream(peer);
  t.event = m.acquire_event();
  t.host_user = bytes > 0 && !is_device_pointer(buf);
  t.device = t.host_user ? m.temporary(bytes, t.stream) : buf;
  // The oldest message with this tag that arrived before any receive wanted it?
  auto& early = m.early[size_t(peer)];
  auto e = std::find_if(early.begin(), early.end(), [&](const Impl::Early& x) { return x.tag == tag; });
  if (e != early.end()) {
    if (e->bytes > bytes)
      m.fail("a message of " + std::to_string(e->bytes) + " bytes from rank " + std::to_string(peer) + " (tag " +
             std::to_string(tag) + ") is larger than its receive of " + std::to_string(bytes) + " bytes");
    m.cuda(cudaStreamWaitEvent(t.stream, e->event, 0), "cudaStreamWaitEvent");
    if (e->bytes)
      m.cuda(cudaMemcpyAsync(t.device, e->buffer, e->bytes, cudaMemcpyDeviceToDevice, t.stream), "cudaMemcpyAsync");
    m.cuda(cudaEventRecord(t.event, t.stream), "cudaEventRecord");
    m.cuda(cudaFreeAsync(e->buffer, t.stream), "cudaFreeAsync");
    m.free_events.push_back(e->event);
    t.launched = true;
    t.message_bytes = e->bytes;
    early.erase(e);
    return Request{id};
  }
  m.posted[size_t(peer)].push_back(id);
  m.advance(peer);
  return Request{id};
}

void NcclCommunicator::progress() {
  try {
    if (impl_->error.empty() && !impl_->aborted) impl_->poll();
  } catch (const std::exception& e) {
    if (impl_->error.empty()) impl_->error = e.what();
  }
}

bool NcclCommunicator::test(Request& r) {
  if (!r.valid()) return true;
  Impl& m = *impl_;
  m.check_usable();
  auto it = m.transfers.find(r.id);
  if (it == m.transfers.end()) throw CommError(m.prefix() + "test() of an unknown or completed request");
  m.poll();
  Impl::Transfer& t = it->second;
  if (!t.launched) return false;
  const cudaError_t e = cudaEventQuery(t.event);
  if (e == cudaErrorNotReady) {
    m.check_async(t.is_send ? m.send_comm[size_t(t.peer)] : m.receive_comm(t.peer), m.describe(t));
    return false;
  }
  m.cuda(e, "cudaEventQuery");
  if (t.control.valid() && !m.control->test(t.control)) return false;  // the announcement is still being sent
  m.complete(t);
  m.transfers.erase(it);
  r.id = -1;
  return true;
}

void NcclCommunicator::wait(Request& r, const std::string& what) {
  if (!r.valid()) return;
  Impl& m = *impl_;
  m.check_usable();
  auto it = m.transfers.find(r.id);
  if (it == m.transfers.end()) throw CommError(m.prefix() + "wait() of an unknown or completed request");
  const std::string text = m.describe(it->second);
  const Stopwatch clock;
  while (!test(r)) {
    if (clock.seconds() > timeout()) {
      wait_seconds_ += clock.seconds();
      m.fail("timed out after " + std::to_string(timeout()) + " s waiting for " + what + " (" + text + ")");
    }
    sleep_briefly(clock.seconds());
  }
  wait_seconds_ += clock.seconds();
}

void NcclCommunicator::allreduce(void* buf, size_t count, DataType type, ReduceOp op) {
  Impl& m = *impl_;
  m.check_usable();
  const size_t bytes = count * data_type_size(type);
  void* d = m.device_view(buf, bytes, true);
  m.nccl(ncclAllReduce(d, d, count, nccl_type(type), nccl_op(op), m.world, m.coll_stream), "ncclAllReduce");
  m.finish_collective("allreduce of " + std::to_string(count) + " elements");
  m.copy_out(buf, d, bytes);
}

void NcclCommunicator::broadcast(void* buf, size_t bytes, int root) {
  Impl& m = *impl_;
  m.check_usable();
  void* d = m.device_view(buf, bytes, m.rank == root);
  m.nccl(ncclBroadcast(d, d, bytes, ncclUint8, root, m.world, m.coll_stream), "ncclBroadcast");
  m.finish_collective("broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root));
  m.copy_out(buf, d, bytes);
}

void NcclCommunicator::allgather(const void* send, void* recv, size_t bytes_per_rank) {
  Impl& m = *impl_;
  m.check_usable();
  void* s = m.device_view(send, bytes_per_rank, true);
  void* d = m.device_view(recv, bytes_per_rank * size_t(m.size), false);
  m.nccl(ncclAllGather(s, d, bytes_per_rank, ncclUint8, m.world, m.coll_stream), "ncclAllGather");
  m.finish_collective("allgather of " + std::to_string(bytes_per_rank) + " bytes per rank");
  m.drop(send, s);
  m.copy_out(recv, d, bytes_per_rank * size_t(m.size));
}

void NcclCommunicator::allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) {
  Impl& m = *impl_;
  m.check_usable();
  if (recv_bytes.size() != size_t(m.size)) throw CommError(m.prefix() + "allgatherv needs one count per rank");
  std::vector<size_t> offset(size_t(m.size) + 1, 0);
  for (int r = 0; r < m.size; ++r) offset[size_t(r) + 1] = offset[size_t(r)] + recv_bytes[size_t(r)];
  const size_t mine = recv_bytes[size_t(m.rank)];
  void* s = m.device_view(send, mine, true);
  void* d = m.device_view(recv, offset.back(), false);
  auto* out = static_cast<unsigned char*>(d);
  if (mine)
    m.cuda(cudaMemcpyAsync(out + offset[size_t(m.rank)], s, mine, cudaMemcpyDeviceToDevice, m.coll_stream),
           "cudaMemcpyAsync");
  m.nccl(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < m.size; ++r) {
    if (r == m.rank) continue;
    if (mine) m.nccl(ncclSend(s, mine, ncclUint8, r, m.world, m.coll_stream), "ncclSend");
    if (recv_bytes[size_t(r)])
      m.nccl(ncclRecv(out + offset[size_t(r)], recv_bytes[size_t(r)], ncclUint8, r, m.world, m.coll_stream),
             "ncclRecv");
  }
  m.nccl(ncclGroupEnd(), "ncclGroupEnd (allgatherv)");
  m.finish_collective("allgatherv");
  m.drop(send, s);
  m.copy_out(recv, d, offset.back());
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DataType type,
                                      ReduceOp op) {
  Impl& m = *impl_;
  m.check_usable();
  if (counts.size() != size_t(m.size)) throw CommError(m.prefix() + "reduce_scatter needs one count per rank");
  const size_t tsize = data_type_size(type);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t mine = counts[size_t(m.rank)];
  void* s = m.device_view(send, total * tsize, true);
  void* d = m.device_view(recv, mine * tsize, false);
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
  if (equal) {
    m.nccl(ncclReduceScatter(s, d, counts[0], nccl_type(type), nccl_op(op), m.world, m.coll_stream),
           "ncclReduceScatter");
  } else {  // one reduce per block, rooted at the block's owner
    m.nccl(ncclGroupStart(), "ncclGroupStart");
    size_t offset = 0;
    for (int r = 0; r < m.size; ++r) {
      const size_t n = counts[size_t(r)];
      if (n)
        m.nccl(ncclReduce(static_cast<const unsigned char*>(s) + offset * tsize, d, n, nccl_type(type), nccl_op(op), r,
                          m.world, m.coll_stream),
               "ncclReduce");
      offset += n;
    }
    m.nccl(ncclGroupEnd(), "ncclGroupEnd (reduce_scatter)");
  }
  m.finish_collective("reduce_scatter");
  m.drop(send, s);
  m.copy_out(recv, d, mine * tsize);
}

void NcclCommunicator::barrier() {
  Impl& m = *impl_;
  m.check_usable();
  void* one = static_cast<unsigned char*>(m.scratch) + 2 * m.size;
  m.nccl(ncclAllReduce(one, one, 1, ncclUint8, ncclMax, m.world, m.coll_stream), "ncclAllReduce (barrier)");
  m.finish_collective("barrier");
}

void NcclCommunicator::abort(int exit_code) {
  impl_->abort_all();
  impl_->control->abort(exit_code);
  std::abort();  // not reached: MPI_Abort ends the process
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  Impl& m = *impl_;
  m.check_usable();
  m.control->barrier();  // bounded: every rank arrived before the unbounded MPI_Comm_split
  MPI_Comm child = MPI_COMM_NULL;
  MPI_Comm_split(m.control->mpi_comm(), color < 0 ? MPI_UNDEFINED : color, key, &child);
  if (child == MPI_COMM_NULL) return nullptr;
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(child, m.device));
  MPI_Comm_free(&child);
  c->set_timeout(timeout());
  return c;
}

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm) { return std::make_unique<NcclCommunicator>(comm); }

}  // namespace ringattn::comm
