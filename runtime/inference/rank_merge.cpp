// The merge of partial states across ranks: the choice of collective and the two ways.
#include "runtime/inference/rank_merge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_cpu.hpp"

namespace ringattn::inference {

const char* merge_collective_name(MergeCollective c) {
  switch (c) {
    case MergeCollective::gather: return "allgather";
    case MergeCollective::reduce: return "allreduce";
    default: return "none";
  }
}

MergeStats merge_across_ranks(comm::Communicator& world, int64_t batch, int64_t rows, int64_t heads,
                              int64_t head_dim, bool active, float* o, float* lse) {
  const int P = world.size();
  MergeStats stats;
  if (P == 1) {
    stats.active_ranks = active ? 1 : 0;
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
  const float inf = std::numeric_limits<float>::infinity();
  if (gather_bytes <= reduce_bytes) {
    stats.collective = MergeCollective::gather;
    stats.bytes_moved = gather_bytes;
    std::vector<size_t> counts(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r) counts[size_t(r)] = flags[size_t(r)] ? state_bytes : 0;
    std::vector<float> send;
    if (active) {
      send.assign(o, o + o_elems);
      send.insert(send.end(), lse, lse + lse_elems);
    }
    std::vector<float> all(size_t(A) * (o_elems + lse_elems));
    world.allgatherv(send.data(), all.data(), counts);
    std::fill_n(o, o_elems, 0.0f);
    std::fill_n(lse, lse_elems, -inf);
    const kernels::AttentionDims dims{batch, heads, heads, head_dim, 1.0f};
    const float* src = all.data();
    for (int r = 0; r < P; ++r) {
      if (!flags[size_t(r)]) continue;
      kernels::merge_states(dims, rows, kernels::AttentionState{o, lse}, src, src + o_elems);
      src += o_elems + lse_elems;
    }
    return stats;
  }
  stats.collective = MergeCollective::reduce;
  stats.bytes_moved = reduce_bytes;
  std::vector<float> max_lse(lse, lse + lse_elems);
  world.allreduce(max_lse.data(), lse_elems, DType::f32, comm::ReduceOp::max);
  // (O w, w) with w = exp(lse - max): 0 for an empty share or a row nobody sees.
  std::vector<float> sums(o_elems + lse_elems);
  float* w = sums.data() + o_elems;
  for (size_t i = 0; i < lse_elems; ++i)
    w[i] = max_lse[i] == -inf || lse[i] == -inf ? 0.0f : std::exp(lse[i] - max_lse[i]);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        const float wi = w[size_t((b * heads + h) * rows + i)];
        const size_t base = size_t(((b * rows + i) * heads + h) * head_dim);
        for (int64_t d = 0; d < head_dim; ++d) sums[base + size_t(d)] = o[base + size_t(d)] * wi;
      }
  world.allreduce(sums.data(), sums.size(), DType::f32, comm::ReduceOp::sum);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        const size_t s = size_t((b * heads + h) * rows + i);
        const size_t base = size_t(((b * rows + i) * heads + h) * head_dim);
        const float total = w[s];
        for (int64_t d = 0; d < head_dim; ++d) o[base + size_t(d)] = total > 0 ? sums[base + size_t(d)] / total : 0.0f;
        lse[s] = total > 0 ? max_lse[s] + std::log(total) : -inf;
      }
  return stats;
}

}  // namespace ringattn::inference
