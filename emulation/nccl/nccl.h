// The subset of NCCL's API that ringattn calls, emulated over MPI on the CUDA emulation's host
// memory and streams (emulation/cuda), so that the NCCL communicator's own code runs in CI on
// machines without a GPU. Found instead of the real <nccl.h> in builds with
// -DRINGATTN_CUDA_EMULATION=ON. Declarations follow NCCL's documented API (names, argument
// order, result codes); only what the project uses is here.
//
// What is modelled (nccl_emulation.cpp):
//   - non-blocking communicators (ncclConfig_t::blocking = 0): ncclCommInitRankConfig returns
//     ncclInProgress and ncclCommGetAsyncError reports ncclInProgress until every rank has joined;
//     ncclCommFinalize likewise until the peers have finalized too;
//   - operations of one communicator complete in issue order on their stream; a receive whose
//     send never comes leaves its stream (and every later operation of the communicator) pending,
//     which host waits on events see as cudaErrorNotReady (bounded blocking calls, streams.cpp);
//   - the operations between ncclGroupStart and ncclGroupEnd are issued together as one unit;
//     group n of one rank meets group n of its peers, as on NCCL, since each rank issues them in
//     the same order;
//   - ncclCommDestroy without ncclCommFinalize waits for the peers (bounded); ncclCommAbort
//     returns at once and ends the communicator's pending work;
//   - one rank per device: two ranks of a communicator on one node with the same device is
//     ncclInvalidUsage at init;
//   - a receive smaller than its send is an asynchronous error (ncclCommGetAsyncError);
//   - ncclCommSplit: collective over the parent (which must have no operation outstanding);
//     ranks of one color form the new communicator, ranked by key, ties by their rank in the
//     parent; NCCL_SPLIT_NOCOLOR gets NULL; a negative color other than that is
//     ncclInvalidArgument; config NULL inherits the parent's (blocking or not); the new
//     communicator keeps the parent's device, and joins as init does (ncclInProgress until every
//     member has, when non-blocking).
// What is not: timing and bandwidth, NCCL's memory model (buffers are host memory, operations
// take effect only when the host polls them), communicators made by init that do not span
// MPI_COMM_WORLD in rank order of MPI's world (init requires nranks == the world's size), and
// NCCL's own failure modes (network, proxy threads).
#pragma once

#include <cstddef>

#include "emulation/cuda/cuda_emulation.hpp"

#define NCCL_MAJOR 2
#define NCCL_MINOR 99
#define NCCL_PATCH 0
#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_SPLIT_NOCOLOR -1

struct ncclComm;
typedef ncclComm* ncclComm_t;

typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

// The fields the project sets; the rest of NCCL's configuration has its defaults.
typedef struct {
  int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {1}

const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

// Emulation only: communicators this process has initialised and not yet destroyed or aborted
// (what the test "communicators per rank do not grow with P" counts).
int ncclEmulationLiveCommunicators();
