// The merge of partial states across ranks: the choice of collective and the two ways, on the
// backend's memory (the arithmetic is the backend's: AttentionBackend::merge_states and the
// all-reduce's halves).
#include "runtime/inference/rank_merge.hpp"

#include <limits>
#include <vector>

namespace ringattn::inference {

const char* merge_collective_name(MergeCollective c) {
  switch (c) {
    case MergeCollective::gather: return "allgather";
    case MergeCollective::reduce: return "allreduce";
    default: return "none";
  }
}

size_t merge_scratch_bytes(int ranks, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim) {
  const size_t state = size_t(batch * rows * heads * (head_dim + 1)) * sizeof(float);
  // gather: this rank's state and every active rank's; reduce: the max LSE and the sums.
  return ranks > 1 ? size_t(ranks + 1) * state : 0;
}

MergeStats merge_across_ranks(comm::Communicator& world, comm::Communicator& states, AttentionBackend& backend,
                              void* scratch, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim, bool active,
                              float* o, float* lse) {
  const int P = world.size();
  MergeStats stats;
  if (P == 1) {
    stats.active_ranks = active ? 1 : 0;
    backend.synchronize();
    return stats;
  }
  const size_t o_elems = size_t(batch * rows * heads * head_dim), lse_elems = size_t(batch * heads * rows);
  const size_t state_bytes = (o_elems + lse_elems) * sizeof(float);
  std::vector<int32_t> flags(size_t(P), 0);
  const int32_t mine = active ? 1 : 0;
  world.allgather(&mine, flags.data(), sizeof mine);
  for (int32_t f : flags) stats.active_ranks += f;
  const uint64_t A = uint64_t(stats.active_ranks);
  // What each way moves, summed over the ranks' receives.
  const uint64_t gather_bytes = A * uint64_t(P - 1) * state_bytes;
  const uint64_t reduce_bytes = 2 * uint64_t(P - 1) * (state_bytes + lse_elems * sizeof(float));
  const kernels::AttentionDims dims{batch, heads, heads, head_dim, 1.0f};
  auto* buffer = static_cast<float*>(scratch);
  if (gather_bytes <= reduce_bytes) {
    stats.collective = MergeCollective::gather;
    stats.bytes_moved = gather_bytes;
    std::vector<size_t> counts(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r) counts[size_t(r)] = flags[size_t(r)] ? state_bytes : 0;
    float* send = buffer;  // this rank's O, then its LSE
    float* all = buffer + o_elems + lse_elems;
    if (active) {
      backend.copy(send, o, o_elems * sizeof(float));
      backend.copy(send + o_elems, lse, lse_elems * sizeof(float));
    }
    backend.synchronize();  // a host-staged communicator reads the buffer now
    states.allgatherv(send, all, counts);
    backend.fill(o, o_elems, 0.0f);
    backend.fill(lse, lse_elems, -std::numeric_limits<float>::infinity());
    const float* src = all;
    for (int r = 0; r < P; ++r) {
      if (!flags[size_t(r)]) continue;
      backend.merge_states(dims, rows, kernels::AttentionState{o, lse}, src, src + o_elems);
      src += o_elems + lse_elems;
    }
    backend.synchronize();
    return stats;
  }
  stats.collective = MergeCollective::reduce;
  stats.bytes_moved = reduce_bytes;
  float* max_lse = buffer;
  float* sums = buffer + lse_elems;  // (O w, w) with w = exp(lse - max)
  backend.copy(max_lse, lse, lse_elems * sizeof(float));
  backend.synchronize();
  states.allreduce(max_lse, lse_elems, DType::f32, comm::ReduceOp::max);
  backend.weigh_states(dims, rows, o, lse, max_lse, sums);
  backend.synchronize();
  states.allreduce(sums, o_elems + lse_elems, DType::f32, comm::ReduceOp::sum);
  backend.finish_weighted_states(dims, rows, sums, max_lse, o, lse);
  backend.synchronize();
  return stats;
}

}  // namespace ringattn::inference
