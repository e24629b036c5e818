// A session of the runtime over the ranks of an MPI communicator: the way in for everything that
// computes attention. The public Context (include/ringattn/ringattn.hpp, runtime/api/context.cpp)
// is a session plus the agreement a user's call starts with; the program's jobs (launch/), the
// LoRA layer and the benchmarks hold a session directly, having agreed on their inputs already.
//
// A session owns, once for its ranks:
//   - the node of every rank (MPI's shared-memory split), which chooses a rank's GPU and places
//     the groups of hybrid parallelism (runtime/placement.hpp);
//   - the backend (CPU, or CUDA on this rank's GPU) and its memory;
//   - the communicators: `world`, MPI on host memory for the agreements and small collectives,
//     and `transport`, what the ring's K/V and the layer's parameters move on: MPI, NCCL, or MPI
//     through pinned host memory for device buffers (HostStagedCommunicator), with an emulated
//     slower link beneath when asked (EmulatedLinkCommunicator);
//   - the plans, one per call shape (shard, spec, sequence length): the Mask built once from the
//     spec, the layout, the ring (UlyssesAttention) and its buffers. The groups' communicators of
//     each hybrid degree are shared by the plans.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "kernels/mask/mask.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/backend.hpp"
#include "runtime/placement.hpp"
#include "runtime/shard_layout.hpp"
#include "runtime/ulysses_attention.hpp"

namespace ringattn {

struct SessionOptions {
  ContextOptions context;
  // Tests on one machine only: the node of each rank for placing the hybrid's groups (one id per
  // rank; empty: the nodes MPI finds). The real nodes still choose each rank's GPU.
  std::vector<int> pretend_nodes;
};

// One call shape of a session: what a pass refers to lives here with it.
class AttentionPlan {
 public:
  AttentionPlan(uint64_t id, Mask mask, std::vector<uint8_t> block_mask) : id_(id), mask_(std::move(mask)),
                                                                           block_mask_(std::move(block_mask)) {}

  uint64_t id() const { return id_; }  // unique within the session, from 1
  const Mask& mask() const { return mask_; }
  const ShardLayout& layout() const { return attention_->layout(); }
  // This rank's global positions, ascending: the rows its tensors hold.
  const std::vector<int64_t>& positions() const { return attention_->positions(); }
  int64_t rows() const { return attention_->rows(); }
  UlyssesAttention& attention() { return *attention_; }

 private:
  friend class Session;
  uint64_t id_;
  Mask mask_;
  std::vector<uint8_t> block_mask_;  // as given, to tell a hash collision of the key from a hit
  std::unique_ptr<UlyssesAttention> attention_;
};

// The public account of one pass (RingStats) from the ring's.
RingStats ring_stats(const PassStats& pass, const UlyssesAttention& attention);

class Session {
 public:
  // Collective over `comm` (duplicated: the caller's tags never meet ours). The options are
  // checked on every rank before NCCL or a GPU is touched; one rank's bad option throws
  // ArgumentError on every rank.
  Session(MPI_Comm comm, const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  const ContextOptions& options() const { return options_.context; }
  const NodeMap& nodes() const { return nodes_; }
  comm::MpiCommunicator& world() { return *world_; }
  comm::Communicator& transport() { return *transport_; }
  AttentionBackend& backend() { return *backend_; }

  // The sharding of seq_len positions under `spec` over these ranks, with the hybrid's groups
  // placed on the nodes; throws ArgumentError when the sequence or the degree cannot be sharded.
  ShardLayout layout(int64_t seq_len, const AttentionSpec& spec) const;
  // The plan for this call shape (shard.rows is not part of it), cached. The first request of a
  // shape checks it (ArgumentError, the same on every rank for the same arguments) and builds it:
  // collective over the ranks, which must all ask for the same plans in the same order.
  AttentionPlan& plan(const Shard& shard, const AttentionSpec& spec, int64_t seq_len);
  size_t cached_plans() const { return plans_.size(); }

 private:
  // The communicator of a hybrid group: a split of MPI, under the link emulation of the groups'
  // link, and staged through host memory for device buffers; NCCL's own split with NCCL.
  std::unique_ptr<comm::Communicator> split_group(int color, int key);

  SessionOptions options_;
  std::unique_ptr<comm::MpiCommunicator> world_;
  NodeMap nodes_;
  std::vector<int> placement_nodes_;  // nodes_'s, or the test's pretend ones
  std::unique_ptr<AttentionBackend> backend_;
  std::unique_ptr<comm::Communicator> emulated_;   // the emulated link over world_, when asked
  std::unique_ptr<comm::Communicator> device_;     // NCCL or host-staged, with the CUDA backend
  comm::Communicator* transport_ = nullptr;
  std::map<int, std::shared_ptr<UlyssesGroups>> groups_;  // by degree
  std::map<std::string, std::unique_ptr<AttentionPlan>> plans_;
  uint64_t next_plan_id_ = 1;
};

}  // namespace ringattn
