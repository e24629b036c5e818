// The exact merge of partial attention states (O, LSE) held by the ranks, each over its own
// disjoint rows of the keys, into the state over all of them, on every rank (decode, pass-Q).
//
// Two collectives do it exactly; the cheaper one for the payload is used:
//   gather: the ranks that hold visible rows send their states to every rank (allgatherv; a rank
//           with none sends nothing), and each rank merges them in rank order;
//   reduce: an allreduce-max of LSE, then one allreduce-sum of (O w, w) with w = exp(LSE - max),
//           O = sum(O w) / sum(w) (a ring allreduce moves about 2 (P - 1) / P of its buffer per rank).
// Both give the same bits on every rank. An empty share (LSE = -inf, O = 0) adds nothing, and a
// row no rank's keys are visible to comes out O = 0, LSE = -inf.
#pragma once

#include <cstdint>

#include "comm/communicator.hpp"
#include "runtime/backend.hpp"

namespace ringattn::inference {

enum class MergeCollective { none, gather, reduce };
const char* merge_collective_name(MergeCollective c);  // "none", "allgather", "allreduce"

struct MergeStats {
  MergeCollective collective = MergeCollective::none;
  int active_ranks = 0;      // ranks whose share held a visible row
  uint64_t bytes_moved = 0;  // summed over ranks (the collective's model: what each rank receives)
};

// Backend memory the merge of these states needs for its temporaries at `ranks` ranks.
size_t merge_scratch_bytes(int ranks, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim);

// o (batch, rows, heads, head_dim) and lse (batch, heads, rows), fp32 in `backend`'s memory: this
// rank's partial state in, the merged state out (complete on return). `active`: this rank's share
// held any visible row. `world` (host memory) agrees on who is active; `states` moves the states
// (a communicator on the backend's memory: MPI for the CPU, NCCL or host-staged MPI for CUDA);
// `scratch` holds merge_scratch_bytes in backend memory.
MergeStats merge_across_ranks(comm::Communicator& world, comm::Communicator& states, AttentionBackend& backend,
                              void* scratch, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim, bool active,
                              float* o, float* lse);

}  // namespace ringattn::inference
