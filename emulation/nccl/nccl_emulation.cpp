// NCCL's API (the subset in nccl.h) over MPI, on the CUDA emulation's streams: what the header
// says is modelled, and how.
//
// A communicator is a duplicate of MPI_COMM_WORLD made with MPI_Comm_idup and an exchange of
// (rank, device, node, id) made with MPI_Iallgather, both advanced by ncclCommGetAsyncError: a
// non-blocking init that never blocks the caller. An operation is queued on its stream as work
// that posts its MPI requests the first time the stream reaches it (after everything issued
// before it on that stream is complete: issue order) and is done when they are. Point-to-point
// operations of one communicator use one tag, so MPI's non-overtaking rule matches the n-th send
// of a pair to the n-th receive, as NCCL does.
//
// ncclCommSplit gathers every parent rank's (color, key) with MPI_Iallgather over the parent;
// once that completes, each member makes the new MPI communicator of its color's ranks in (key,
// parent rank) order with MPI_Comm_create_group (a collective over the members alone, all of
// which have entered the split), and joins it as init does.
#include "emulation/nccl/nccl.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr int kPointToPointTag = 7;
constexpr int kSplitTag = 11;  // MPI_Comm_create_group's

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double block_seconds() {
  const char* v = std::getenv("RINGATTN_EMULATION_BLOCK_SECONDS");
  const double s = v ? std::atof(v) : 0.0;
  return s > 0.0 ? s : 600.0;
}

int g_live = 0;

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;  // fp16/bf16 reductions are not emulated
  }
}

MPI_Op mpi_op(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: return MPI_OP_NULL;  // ncclAvg is not emulated
  }
}

// What outlives a communicator handle: the work queued on streams refers to this.
struct State {
  enum Phase { duplicating, splitting, exchanging, ready, finalizing, finalized, failed, aborted, destroyed };
  Phase phase = duplicating;
  int rank = 0, nranks = 1, device = 0;
  bool blocking = true;  // its configuration, which a split inherits
  MPI_Comm mpi = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;  // the join or finalize in progress
  ncclResult_t async = ncclInProgress;
  std::string last_error;
  std::vector<int> mpi_rank;  // by communicator rank
  struct Join {
    int64_t rank, device, node, id;
  };
  Join mine{};
  std::vector<Join> all;
  int64_t id = 0;
  // A split in progress: every parent rank's (color, key), gathered over the parent's MPI comm.
  struct SplitEntry {
    int64_t color, key;
  };
  MPI_Comm parent = MPI_COMM_NULL;
  SplitEntry split_mine{};
  std::vector<SplitEntry> split_all;

  bool usable() const { return phase == ready || phase == finalizing || phase == finalized; }
  void fail(ncclResult_t r, const std::string& message) {
    if (async == ncclSuccess || async == ncclInProgress) async = r;
    if (last_error.empty()) last_error = message;
    if (phase != aborted && phase != destroyed) phase = failed;
  }
};

}  // namespace

struct ncclComm {
  std::shared_ptr<State> state;
};

namespace {

// One queued unit: the operations of one group on one stream (or one operation).
struct Unit {
  std::shared_ptr<State> state;
  std::vector<std::function<int(std::vector<MPI_Request>&)>> posts;  // each posts its requests
  std::vector<MPI_Request> requests;
  std::vector<bool> receives;  // by request: cancelled on abort
  bool started = false;

  bool test() {
    State& s = *state;
    if (s.phase == State::aborted || s.phase == State::destroyed) return cancel();
    if (!s.usable()) return true;  // failed: nothing more will happen; the error says why
    if (!started) {
      started = true;
      for (auto& post : posts)
        if (int err = post(requests); err != MPI_SUCCESS) {
          s.fail(ncclSystemError, "emulated NCCL: posting an operation failed (MPI error " + std::to_string(err) + ")");
          return true;
        }
    }
    int flag = 0;
    std::vector<MPI_Status> statuses(requests.size());
    if (int err = MPI_Testall(int(requests.size()), requests.data(), &flag, statuses.data()); err != MPI_SUCCESS) {
      s.fail(ncclRemoteError, "emulated NCCL: an operation failed (a receive smaller than its send, or a lost peer)");
      return true;
    }
    return flag != 0;
  }
  bool cancel() {
    for (MPI_Request& r : requests)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    return true;
  }
};

struct PendingOp {
  ncclComm_t comm;
  cudaStream_t stream;
  std::function<int(std::vector<MPI_Request>&)> post;
};

thread_local int g_group_depth = 0;
thread_local std::vector<PendingOp> g_group;

void issue(std::vector<PendingOp>& ops) {
  // One unit per (communicator, stream), in the order first seen.
  std::vector<std::pair<std::pair<ncclComm_t, cudaStream_t>, std::shared_ptr<Unit>>> units;
  for (PendingOp& op : ops) {
    std::shared_ptr<Unit> unit;
    for (auto& [key, u] : units)
      if (key.first == op.comm && key.second == op.stream) unit = u;
    if (!unit) {
      unit = std::make_shared<Unit>();
      unit->state = op.comm->state;
      units.push_back({{op.comm, op.stream}, unit});
    }
    unit->posts.push_back(std::move(op.post));
  }
  for (auto& [key, unit] : units) cuda_emulation::enqueue(key.second, [unit] { return unit->test(); });
  ops.clear();
}

ncclResult_t add(ncclComm_t comm, cudaStream_t stream, std::function<int(std::vector<MPI_Request>&)> post) {
  if (!comm || !comm->state) return ncclInvalidArgument;
  State& s = *comm->state;
  if (s.phase == State::failed || s.phase == State::aborted || s.phase == State::destroyed) return s.async;
  if (s.phase != State::ready) return ncclInvalidUsage;  // init not complete, or finalized
  g_group.push_back({comm, stream, std::move(post)});
  if (g_group_depth == 0) issue(g_group);
  return ncclSuccess;
}

bool int_sized(size_t bytes) { return bytes <= size_t(INT_MAX); }

// Advances a join or finalize in progress.
void advance(State& s) {
  if (s.request == MPI_REQUEST_NULL && s.phase != State::duplicating) return;
  int flag = 0;
  if (MPI_Test(&s.request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
    s.fail(ncclSystemError, "emulated NCCL: MPI failed during init or finalize");
    return;
  }
  if (!flag) return;
  if (s.phase == State::splitting) {
    // The members of this color in (key, parent rank) order: this rank's place is its new rank.
    std::vector<int> members;
    for (int r = 0; r < int(s.split_all.size()); ++r)
      if (s.split_all[size_t(r)].color == s.split_mine.color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return s.split_all[size_t(a)].key < s.split_all[size_t(b)].key; });
    int parent_rank = 0;
    MPI_Comm_rank(s.parent, &parent_rank);
    s.nranks = int(members.size());
    s.rank = int(std::find(members.begin(), members.end(), parent_rank) - members.begin());
    s.mine.rank = s.rank;
    MPI_Group parent_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm_group(s.parent, &parent_group);
    MPI_Group_incl(parent_group, s.nranks, members.data(), &group);
    const int made = MPI_Comm_create_group(s.parent, group, kSplitTag, &s.mpi);
    MPI_Group_free(&group);
    MPI_Group_free(&parent_group);
    if (made != MPI_SUCCESS) return s.fail(ncclSystemError, "emulated NCCL: ncclCommSplit could not make its MPI comm");
    s.phase = State::duplicating;  // made: join it as init does
  }
  if (s.phase == State::duplicating) {
    MPI_Comm_set_errhandler(s.mpi, MPI_ERRORS_RETURN);
    s.all.resize(size_t(s.nranks));
    MPI_Iallgather(&s.mine, 4, MPI_INT64_T, s.all.data(), 4, MPI_INT64_T, s.mpi, &s.request);
    s.phase = State::exchanging;
  } else if (s.phase == State::exchanging) {
    s.mpi_rank.assign(size_t(s.nranks), -1);
    for (int w = 0; w < s.nranks; ++w) {
      const State::Join& j = s.all[size_t(w)];
      if (j.id != s.id) return s.fail(ncclInvalidUsage, "emulated NCCL: ranks initialised with different unique ids");
      if (j.rank < 0 || j.rank >= s.nranks || s.mpi_rank[size_t(j.rank)] >= 0)
        return s.fail(ncclInvalidUsage, "emulated NCCL: two processes claim rank " + std::to_string(j.rank));
      s.mpi_rank[size_t(j.rank)] = w;
      for (int o = 0; o < w; ++o)
        if (s.all[size_t(o)].node == j.node && s.all[size_t(o)].device == j.device)
          return s.fail(ncclInvalidUsage, "emulated NCCL: ranks " + std::to_string(s.all[size_t(o)].rank) + " and " +
                                              std::to_string(j.rank) + " use the same device " +
                                              std::to_string(j.device) + " (NCCL needs one rank per device)");
    }
    s.phase = State::ready;
    s.async = ncclSuccess;
  } else if (s.phase == State::finalizing) {
    s.phase = State::finalized;
    s.async = ncclSuccess;
  }
}

// The end of an init or split: at once for a non-blocking communicator (ncclInProgress, polled
// by ncclCommGetAsyncError), else polled here, bounded.
ncclResult_t join(State& s) {
  if (!s.blocking) return ncclInProgress;
  const double start = now_seconds();
  while (s.phase == State::duplicating || s.phase == State::splitting || s.phase == State::exchanging) {
    advance(s);
    if (now_seconds() - start > block_seconds()) return ncclSystemError;
    sched_yield();
  }
  return s.async;
}

int64_t node_hash() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  int64_t h = 1469598103934665603LL;
  for (const char* p = name; *p; ++p) h = (h ^ *p) * 1099511628211LL;
  return h;
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  return comm && comm->state ? comm->state->last_error.c_str() : "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  const int64_t v = int64_t(getpid()) * 1000003 + int64_t(now_seconds() * 1e6);
  std::memcpy(id->internal, &v, sizeof v);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (nranks != world || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  auto s = std::make_shared<State>();
  s->rank = rank;
  s->nranks = nranks;
  cudaGetDevice(&s->device);
  std::memcpy(&s->id, id.internal, sizeof s->id);
  s->mine = {rank, s->device, node_hash(), s->id};
  if (MPI_Comm_idup(MPI_COMM_WORLD, &s->mpi, &s->request) != MPI_SUCCESS) return ncclSystemError;
  *comm = new ncclComm{s};
  ++g_live;
  s->blocking = !config || config->blocking != 0;
  return join(*s);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!comm || !comm->state || !newcomm || color < NCCL_SPLIT_NOCOLOR) return ncclInvalidArgument;
  *newcomm = nullptr;
  State& parent = *comm->state;
  if (parent.phase != State::ready) return parent.phase == State::failed ? parent.async : ncclInvalidUsage;
  auto s = std::make_shared<State>();
  s->phase = State::splitting;
  s->parent = parent.mpi;
  s->device = parent.device;
  s->blocking = config ? config->blocking != 0 : parent.blocking;
  s->id = int64_t(uint64_t(parent.id) * 1000003u + uint64_t(int64_t(color)));  // the same for one color
  s->mine = {0, s->device, node_hash(), s->id};
  s->split_mine = {color, key};
  s->split_all.resize(size_t(parent.nranks));
  if (MPI_Iallgather(&s->split_mine, 2, MPI_INT64_T, s->split_all.data(), 2, MPI_INT64_T, parent.mpi, &s->request) !=
      MPI_SUCCESS)
    return ncclSystemError;
  if (color == NCCL_SPLIT_NOCOLOR) {  // in no communicator: only its part of the gather to finish
    const double start = now_seconds();
    for (int flag = 0; !flag; sched_yield()) {
      if (MPI_Test(&s->request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return ncclSystemError;
      if (!flag && now_seconds() - start > block_seconds()) return ncclSystemError;
    }
    return ncclSuccess;
  }
  *newcomm = new ncclComm{s};
  ++g_live;
  return join(*s);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm || !comm->state) return ncclInvalidArgument;
  State& s = *comm->state;
  advance(s);
  *async_error = s.async;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm || !comm->state) return ncclInvalidArgument;
  State& s = *comm->state;
  if (s.phase != State::ready) return s.phase == State::failed ? s.async : ncclInvalidUsage;
  // Every peer must finalize too: a barrier over the communicator, advanced by GetAsyncError.
  if (MPI_Ibarrier(s.mpi, &s.request) != MPI_SUCCESS) return ncclSystemError;
  s.phase = State::finalizing;
  s.async = ncclInProgress;
  return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm || !comm->state) return ncclInvalidArgument;
  State& s = *comm->state;
  ncclResult_t result = ncclSuccess;
  if (s.phase == State::ready && ncclCommFinalize(comm) == ncclInProgress) {
    // Destroying a connected communicator waits for its peers (bounded here).
    const double start = now_seconds();
    while (s.phase == State::finalizing && now_seconds() - start < block_seconds()) {
      advance(s);
      sched_yield();
    }
    if (s.phase != State::finalized) result = ncclSystemError;
  } else if (s.phase == State::finalizing) {
    result = ncclInvalidUsage;  // finalize not complete: poll ncclCommGetAsyncError first
  }
  if (result == ncclSuccess && s.mpi != MPI_COMM_NULL) MPI_Comm_free(&s.mpi);
  s.phase = State::destroyed;
  delete comm;
  --g_live;
  return result;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (comm->state) {
    State& s = *comm->state;
    // An unfinished exchange or barrier is left to MPI (a collective's request cannot be freed).
    s.phase = State::aborted;  // queued work ends (receives cancelled) when next polled
  }
  delete comm;
  --g_live;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->state->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->state->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  *device = comm->state->device;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return ncclInvalidUsage;
  if (--g_group_depth == 0) issue(g_group);
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  const size_t bytes = count * type_bytes(datatype);
  if (!comm || peer < 0 || peer >= comm->state->nranks || !int_sized(bytes)) return ncclInvalidArgument;
  std::shared_ptr<State> s = comm->state;
  return add(comm, stream, [s, sendbuff, bytes, peer](std::vector<MPI_Request>& r) {
    r.emplace_back();
    return MPI_Isend(sendbuff, int(bytes), MPI_BYTE, s->mpi_rank[size_t(peer)], kPointToPointTag, s->mpi, &r.back());
  });
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  const size_t bytes = count * type_bytes(datatype);
  if (!comm || peer < 0 || peer >= comm->state->nranks || !int_sized(bytes)) return ncclInvalidArgument;
  std::shared_ptr<State> s = comm->state;
  return add(comm, stream, [s, recvbuff, bytes, peer](std::vector<MPI_Request>& r) {
    r.emplace_back();
    return MPI_Irecv(recvbuff, int(bytes), MPI_BYTE, s->mpi_rank[size_t(peer)], kPointToPointTag, s->mpi, &r.back());
  });
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (!comm || mpi_type(datatype) == MPI_DATATYPE_NULL || mpi_op(op) == MPI_OP_NULL || !int_sized(count))
    return ncclInvalidArgument;
  std::shared_ptr<State> s = comm->state;
  const size_t bytes = count * type_bytes(datatype);
  return add(comm, stream, [=](std::vector<MPI_Request>& r) {
    if (sendbuff != recvbuff) std::memmove(recvbuff, sendbuff, bytes);
    r.emplace_back();
    return MPI_Iallreduce(MPI_IN_PLACE, recvbuff, int(count), mpi_type(datatype), mpi_op(op), s->mpi, &r.back());
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * type_bytes(datatype);
  if (!comm || root < 0 || root >= comm->state->nranks || !int_sized(bytes)) return ncclInvalidArgument;
  std::shared_ptr<State> s = comm->state;
  return add(comm, stream, [=](std::vector<MPI_Request>& r) {
    if (s->rank == root && sendbuff != recvbuff) std::memmove(recvbuff, sendbuff, bytes);
    r.emplace_back();
    return MPI_Ibcast(recvbuff, int(bytes), MPI_BYTE, s->mpi_rank[size_t(root)], s->mpi, &r.back());
  });
}

// Blocks in rank order of the communicator. MPI's collectives order blocks by MPI rank: the
// emulation requires communicator rank == world rank order for these (checked).
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = sendcount * type_bytes(datatype);
  if (!comm || !int_sized(bytes)) return ncclInvalidArgument;
  std::shared_ptr<State> s = comm->state;
  return add(comm, stream, [=](std::vector<MPI_Request>& r) {
    for (int i = 0; i < s->nranks; ++i)
      if (s->mpi_rank[size_t(i)] != i) return int(MPI_ERR_RANK);
    char* mine = static_cast<char*>(recvbuff) + size_t(s->rank) * bytes;
    if (sendbuff != mine) std::memmove(mine, sendbuff, bytes);
    r.emplace_back();
    return MPI_Iallgather(MPI_IN_PLACE, int(bytes), MPI_BYTE, recvbuff, int(bytes), MPI_BYTE, s->mpi, &r.back());
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (!comm || mpi_type(datatype) == MPI_DATATYPE_NULL || mpi_op(op) == MPI_OP_NULL || !int_sized(recvcount))
    return ncclInvalidArgument;
  std::shared_ptr<State> s = comm->state;
  return add(comm, stream, [=](std::vector<MPI_Request>& r) {
    for (int i = 0; i < s->nranks; ++i)
      if (s->mpi_rank[size_t(i)] != i) return int(MPI_ERR_RANK);
    r.emplace_back();
    return MPI_Ireduce_scatter_block(sendbuff, recvbuff, int(recvcount), mpi_type(datatype), mpi_op(op), s->mpi,
                                     &r.back());
  });
}

int ncclEmulationLiveCommunicators() { return g_live; }
