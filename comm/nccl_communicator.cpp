#include "comm/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include "comm/host_staged_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "util/stopwatch.hpp"

namespace ringattn::comm {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::u8: return ncclUint8;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

std::string seconds_text(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

}  // namespace

struct NcclCommunicator::Impl {
  NcclCommunicator& self;
  std::unique_ptr<MpiCommunicator> control;      // a private MPI duplicate: setup and fallbacks
  std::unique_ptr<HostStagedCommunicator> staged;  // device buffers over `control`
  int rank = 0, size = 1, device = 0;
  std::string node;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;   // the communication stream
  cudaStream_t compute = nullptr;  // order_after's stream (not owned)
  cudaEvent_t ready = nullptr;     // recorded on `compute` before each group
  std::map<int64_t, cudaEvent_t> steps;  // posted and not yet waited for
  std::vector<cudaEvent_t> free_events;

  explicit Impl(NcclCommunicator& owner) : self(owner) {}

  std::string prefix() const { return "rank " + std::to_string(rank) + ": "; }

  // Ends the NCCL communicator now and throws the error (the job is over: exit code 4).
  [[noreturn]] void fail(const std::string& message) {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
    throw CommError(prefix() + message + "; the NCCL communicator was aborted (ncclCommAbort)");
  }
  void cuda(cudaError_t e, const char* call) {
    if (e != cudaSuccess) fail(std::string(call) + " failed: " + cudaGetErrorString(e));
  }
  std::string nccl_text(ncclResult_t r) const {
    std::string text = ncclGetErrorString(r);
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    if (last && *last) text += " (" + std::string(last) + ")";
    return text;
  }
  // A call's result: in progress (non-blocking communicator) is polled to its end, bounded.
  void nccl(ncclResult_t r, const char* call) {
    if (r == ncclInProgress) r = settle(call);
    if (r != ncclSuccess) fail(std::string(call) + " failed: " + nccl_text(r));
  }
  ncclResult_t settle(const std::string& what) {
    const ncclResult_t r = await_settled(comm);
    if (r == ncclInProgress) fail("timed out after " + seconds_text(self.timeout()) + " s in " + what);
    return r;
  }
  // Polls a non-blocking communicator until its pending call (initialisation, a split, a
  // collective, finalisation) settles: its result, or ncclInProgress once the timeout has passed.
  // The one wait every non-blocking call goes through, so none can hang a rank.
  ncclResult_t await_settled(ncclComm_t c) const {
    const Stopwatch waited;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(c, &state); r != ncclSuccess) return r;
      if (state != ncclInProgress || waited.seconds() > self.timeout()) return state;
      sched_yield();
    }
  }
  void check_usable(const char* call) {
    if (!comm) throw CommError(prefix() + call + " after the NCCL communicator was aborted");
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
  // The communication stream waits (on the device) for the compute issued so far.
  void after_compute() {
    if (!compute) return;
    cuda(cudaEventRecord(ready, compute), "cudaEventRecord");
    cuda(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
  }
  // Polls `done` until complete, bounded by the timeout, watching for asynchronous errors; then
  // later compute waits for it on the device.
  void finish(cudaEvent_t done, const std::string& what) {
    const Stopwatch waited;
    for (;;) {
      const cudaError_t e = cudaEventQuery(done);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) cuda(e, "cudaEventQuery");
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm, &state);
      if (state != ncclSuccess && state != ncclInProgress) fail("NCCL error while waiting for " + what + ": " + nccl_text(state));
      if (waited.seconds() > self.timeout())
        fail("timed out after " + seconds_text(self.timeout()) + " s waiting for " + what);
      staged->progress();
      sched_yield();
    }
    if (compute) cuda(cudaStreamWaitEvent(compute, done, 0), "cudaStreamWaitEvent");
  }
  // Runs one collective (issued by `issue` on the stream) to completion.
  template <class Issue>
  void collective(const std::string& what, Issue issue) {
    check_usable(what.c_str());
    after_compute();
    nccl(issue(), what.c_str());
    cudaEvent_t done = acquire_event();
    cuda(cudaEventRecord(done, stream), "cudaEventRecord");
    finish(done, what);
    free_events.push_back(done);
  }
  void sync_timeouts() {
    control->set_timeout(self.timeout());
    staged->set_timeout(self.timeout());
  }

  void init(MPI_Comm world, double timeout_s);
  void select_device();
  // The communication stream and its event, on `device`.
  void make_stream();
  // Polls a non-blocking init or split to its end, bounded by the timeout; then every rank of
  // `everyone` learns whether every rank succeeded (none waits on a failed peer), and fails if not.
  void agree_joined(ncclResult_t r, ncclComm_t joining, Communicator& everyone, const std::string& what);
  void teardown();
};

void NcclCommunicator::Impl::make_stream() {
  cuda(cudaSetDevice(device), "cudaSetDevice");
  int least = 0, greatest = 0;
  cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  // The highest priority, so that transfers are not starved by compute.
  cuda(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
  cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

void NcclCommunicator::Impl::agree_joined(ncclResult_t r, ncclComm_t joining, Communicator& everyone,
                                          const std::string& what) {
  if (r == ncclInProgress && joining) r = await_settled(joining);
  int32_t bad = r == ncclSuccess ? 0 : 1;
  const std::string mine = r == ncclSuccess ? ""
                           : r == ncclInProgress
                               ? what + " did not finish within " + seconds_text(self.timeout()) + " s"
                               : what + " failed: " + nccl_text(r);
  everyone.allreduce(&bad, 1, DType::i32, ReduceOp::max);
  if (bad) {
    if (joining && joining != comm) ncclCommAbort(joining);
    fail(mine.empty() ? what + " failed on another rank (see its error)" : mine);
  }
}

void NcclCommunicator::Impl::select_device() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  node.assign(name, size_t(len));
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
    device = gpu_for_local_rank(local_rank, local_ranks, devices, node);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  // Every rank fails if one does (the others would wait for it in the NCCL init).
  int32_t bad = problem.empty() ? 0 : 1;
  control->allreduce(&bad, 1, DType::i32, ReduceOp::max);
  if (bad)
    throw std::runtime_error(problem.empty() ? "NCCL communicator: another node has more ranks than GPUs (see its error)"
                                             : problem);
}

void NcclCommunicator::Impl::init(MPI_Comm world, double timeout_s) {
  control = std::make_unique<MpiCommunicator>(world);
  self.set_timeout(timeout_s);
  staged = std::make_unique<HostStagedCommunicator>(*control);
  sync_timeouts();
  rank = control->rank();
  size = control->size();
  select_device();
  make_stream();

  ncclUniqueId id{};
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) std::memset(&id, 0, sizeof id);  // fails below, on every rank
  control->broadcast(&id, sizeof id, 0);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // bounded by the timeout, polled below
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  agree_joined(r, comm, *control, "NCCL initialisation");
}

void NcclCommunicator::Impl::teardown() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm && !finalized) {
    // Finalize flushes this rank's operations and waits for the peers; destroy then frees.
    ncclResult_t r = ncclCommFinalize(comm);
    if (r == ncclInProgress) r = await_settled(comm);
    if (r == ncclSuccess)
      ncclCommDestroy(comm);
    else
      ncclCommAbort(comm);  // a peer is gone: do not wait for it
    comm = nullptr;
  }
  for (auto& [id, e] : steps) cudaEventDestroy(e);
  for (cudaEvent_t e : free_events) cudaEventDestroy(e);
  if (ready) cudaEventDestroy(ready);
  if (stream) cudaStreamDestroy(stream);
  staged.reset();
  control.reset();
}

NcclCommunicator::NcclCommunicator(MPI_Comm comm, double timeout_s) : impl_(std::make_unique<Impl>(*this)) {
  try {
    impl_->init(comm, timeout_s);
  } catch (...) {
    impl_->teardown();
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() { impl_->teardown(); }

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
int NcclCommunicator::device() const { return impl_->device; }
int NcclCommunicator::nccl_communicators() const { return impl_->comm ? 1 : 0; }
void NcclCommunicator::order_after(void* compute_stream) { impl_->compute = static_cast<cudaStream_t>(compute_stream); }

// ---- steps ----

StepHandle NcclCommunicator::post_step(std::span<const StepTransfer> transfers) {
  Impl& m = *impl_;
  const int64_t id = steps_posted_++;
  if (transfers.empty()) return StepHandle{};  // nothing to launch; every rank still counts it
  m.check_usable("post_step");
  const std::string what = "step " + std::to_string(id);
  m.after_compute();
  m.nccl(ncclGroupStart(), "ncclGroupStart");
  for (const StepTransfer& t : transfers) {
    if (t.peer < 0 || t.peer >= m.size)
      m.fail(what + " names rank " + std::to_string(t.peer) + ", not in this communicator of " + std::to_string(m.size));
    ncclResult_t r = t.kind == StepTransfer::Kind::send
                         ? ncclSend(t.buf, t.bytes, ncclUint8, t.peer, m.comm, m.stream)
                         : ncclRecv(t.buf, t.bytes, ncclUint8, t.peer, m.comm, m.stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      ncclGroupEnd();
      m.fail(std::string(t.kind == StepTransfer::Kind::send ? "ncclSend" : "ncclRecv") + " of " + what +
             " failed: " + m.nccl_text(r));
    }
    if (t.kind == StepTransfer::Kind::send) bytes_sent_ += t.bytes;
  }
  m.nccl(ncclGroupEnd(), ("ncclGroupEnd of " + what).c_str());
  cudaEvent_t done = m.acquire_event();
  m.cuda(cudaEventRecord(done, m.stream), "cudaEventRecord");
  m.steps.emplace(id, done);
  return StepHandle{id};
}

void NcclCommunicator::wait_step(StepHandle& step, const std::string& what) {
  if (!step.valid()) return;
  Impl& m = *impl_;
  auto it = m.steps.find(step.id);
  if (it == m.steps.end())
    throw CommError(m.prefix() + "wait_step of step " + std::to_string(step.id) + ", which this communicator does not hold");
  m.check_usable("wait_step");
  const Stopwatch blocked;
  const cudaEvent_t done = it->second;
  m.steps.erase(it);
  const int64_t id = step.id;
  step.id = -1;
  m.free_events.push_back(done);  // reused only after this returns
  m.finish(done, "step " + std::to_string(id) + " ('" + what + "')");
  wait_seconds_ += blocked.seconds();
}

// ---- point to point over MPI (tags; not the ring's path) ----

Request NcclCommunicator::isend(const void* buf, size_t bytes, int peer, int tag) {
  impl_->sync_timeouts();
  bytes_sent_ += bytes;
  return impl_->staged->isend(buf, bytes, peer, tag);
}
Request NcclCommunicator::irecv(void* buf, size_t bytes, int peer, int tag) {
  impl_->sync_timeouts();
  return impl_->staged->irecv(buf, bytes, peer, tag);
}
bool NcclCommunicator::test(Request& r) { return impl_->staged->test(r); }
void NcclCommunicator::wait(Request& r, const std::string& what) {
  impl_->sync_timeouts();
  const Stopwatch blocked;
  impl_->staged->wait(r, what);
  wait_seconds_ += blocked.seconds();
}

// Lets the oldest step advance (the emulation moves data only when polled; on a GPU this is a
// cheap query), and MPI transfers.
void NcclCommunicator::progress() {
  Impl& m = *impl_;
  if (!m.steps.empty()) cudaEventQuery(m.steps.begin()->second);
  m.staged->progress();
}

// ---- collectives ----

void NcclCommunicator::allreduce(void* buf, size_t count, DType type, ReduceOp op) {
  Impl& m = *impl_;
  m.sync_timeouts();
  if (!is_device_pointer(buf)) return m.control->allreduce(buf, count, type, op);
  m.collective("allreduce of " + std::to_string(count) + " elements",
               [&] { return ncclAllReduce(buf, buf, count, nccl_type(type), nccl_op(op), m.comm, m.stream); });
}

void NcclCommunicator::broadcast(void* buf, size_t bytes, int root) {
  Impl& m = *impl_;
  m.sync_timeouts();
  if (!is_device_pointer(buf)) return m.control->broadcast(buf, bytes, root);
  m.collective("broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root),
               [&] { return ncclBroadcast(buf, buf, bytes, ncclUint8, root, m.comm, m.stream); });
}

void NcclCommunicator::allgather(const void* send, void* recv, size_t bytes_per_rank) {
  Impl& m = *impl_;
  m.sync_timeouts();
  if (!is_device_pointer(send) || !is_device_pointer(recv)) return m.staged->allgather(send, recv, bytes_per_rank);
  m.collective("allgather of " + std::to_string(bytes_per_rank) + " bytes per rank",
               [&] { return ncclAllGather(send, recv, bytes_per_rank, ncclUint8, m.comm, m.stream); });
}

void NcclCommunicator::allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) {
  impl_->sync_timeouts();
  impl_->staged->allgatherv(send, recv, recv_bytes);
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DType type,
                                      ReduceOp op) {
  Impl& m = *impl_;
  m.sync_timeouts();
  bool equal = counts.size() == size_t(m.size);
  for (size_t c : counts) equal = equal && c == counts[0];
  if (!equal || !is_device_pointer(send) || !is_device_pointer(recv))
    return m.staged->reduce_scatter(send, recv, counts, type, op);
  m.collective("reduce_scatter of " + std::to_string(counts[0]) + " elements per rank", [&] {
    return ncclReduceScatter(send, recv, counts[0], nccl_type(type), nccl_op(op), m.comm, m.stream);
  });
}

void NcclCommunicator::barrier() {
  impl_->sync_timeouts();
  impl_->control->barrier();
}

void NcclCommunicator::abort(int exit_code) {
  if (impl_->comm) ncclCommAbort(impl_->comm);
  impl_->comm = nullptr;
  impl_->control->abort(exit_code);
  std::_Exit(exit_code);  // not reached: MPI_Abort ends the job
}

void NcclCommunicator::alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                                 std::span<const size_t> recv_bytes) {
  Impl& m = *impl_;
  m.sync_timeouts();
  if (send_bytes.size() != size_t(m.size) || recv_bytes.size() != size_t(m.size))
    throw CommError(m.prefix() + "alltoallv given " + std::to_string(send_bytes.size()) + " send and " +
                    std::to_string(recv_bytes.size()) + " receive sizes for a communicator of " +
                    std::to_string(m.size) + " ranks");
  if (!is_device_pointer(send) || !is_device_pointer(recv))
    return m.staged->alltoallv(send, send_bytes, recv, recv_bytes);
  size_t total = 0;
  for (size_t n : send_bytes) total += n;
  m.collective("all-to-all of " + std::to_string(total) + " bytes", [&] {
    ncclResult_t r = ncclGroupStart();
    size_t in = 0, out = 0;
    for (int j = 0; j < m.size && (r == ncclSuccess || r == ncclInProgress); ++j) {
      if (recv_bytes[size_t(j)] > 0)
        r = ncclRecv(static_cast<char*>(recv) + in, recv_bytes[size_t(j)], ncclUint8, j, m.comm, m.stream);
      if (send_bytes[size_t(j)] > 0 && (r == ncclSuccess || r == ncclInProgress))
        r = ncclSend(static_cast<const char*>(send) + out, send_bytes[size_t(j)], ncclUint8, j, m.comm, m.stream);
      in += recv_bytes[size_t(j)];
      out += send_bytes[size_t(j)];
    }
    const ncclResult_t end = ncclGroupEnd();  // closes the group even after a failed call
    return r == ncclSuccess || r == ncclInProgress ? end : r;
  });
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  Impl& m = *impl_;
  m.sync_timeouts();
  m.check_usable("split");
  std::unique_ptr<Communicator> control = m.control->split(color, key);  // the new one's MPI side
  ncclComm_t sub = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // bounded by the timeout, polled in agree_joined
  const ncclResult_t r = ncclCommSplit(m.comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config);
  m.agree_joined(r, sub, *m.control, "ncclCommSplit (color " + std::to_string(color) + ")");
  if (!sub) return nullptr;
  return std::unique_ptr<Communicator>(new NcclCommunicator(*this, std::move(control), sub));
}

NcclCommunicator::NcclCommunicator(const NcclCommunicator& parent, std::unique_ptr<Communicator> control, void* comm)
    : impl_(std::make_unique<Impl>(*this)) {
  Impl& m = *impl_;
  const Impl& p = *parent.impl_;
  m.comm = static_cast<ncclComm_t>(comm);
  set_timeout(parent.timeout());
  try {
    m.control.reset(static_cast<MpiCommunicator*>(control.release()));  // MpiCommunicator::split's
    m.staged = std::make_unique<HostStagedCommunicator>(*m.control);
    m.sync_timeouts();
    m.rank = m.control->rank();
    m.size = m.control->size();
    m.device = p.device;
    m.node = p.node;
    m.compute = p.compute;
    m.make_stream();
  } catch (...) {
    m.teardown();
    throw;
  }
}

std::vector<int> NcclCommunicator::node_of_ranks() {
  impl_->sync_timeouts();
  return impl_->control->node_of_ranks();
}

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm) { return std::make_unique<NcclCommunicator>(comm); }

}  // namespace ringattn::comm
