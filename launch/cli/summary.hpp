// The summary of one run of the ring, as docs/reference.md "The JSON summary" names its fields: written by
// `ringattn --json` and `ringattn layer --json`, and for each point of `ringattn bench --json`
// (and its --csv). One list of fields, so that the three cannot drift apart; each adds its own
// fields after these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "launch/cli/json.hpp"

namespace ringattn {

struct RunSummary {
  int ranks = 1;
  int nodes = 1;  // how many nodes the ranks span (MPI's shared-memory split)
  int64_t batch = 1, seq_len = 0, heads = 1, kv_heads = 1, head_dim = 1;
  std::string mask, layout, schedule, dtype, backend, comm;
  int threads = 1;
  double forward_s = 0.0;                 // median over iterations of the slowest rank's time
  std::optional<double> backward_s;       // when a backward pass ran
  double flops_forward = 0.0;             // counted as docs/reference.md says, all ranks
  double gflops_per_rank = 0.0;           // forward rate (rate_per_rank; the layer counts its projections too)
  uint64_t comm_bytes_sent = 0, comm_bytes_needed = 0;  // forward K/V, summed over ranks
  double exposed_comm_fraction = 0.0;     // time waiting for data / forward time
  uint64_t peak_rss_bytes = 0;            // max over ranks
  std::optional<double> max_abs_err;      // with --check
};

// GFLOP/s per rank of `flops` done in `seconds` by `ranks` (0 when nothing was timed).
inline double rate_per_rank(double flops, double seconds, int ranks) {
  return seconds > 0 ? flops / seconds / ranks / 1e9 : 0.0;
}

// Calls visit(key, Json) for every field of docs/reference.md's summary, in its order; an absent optional
// field is visited as null (a table keeps its column).
template <class Visit>
void visit_summary(const RunSummary& s, Visit&& visit) {
  const auto optional = [](const std::optional<double>& v) { return v ? Json(*v) : Json(); };
  const std::pair<const char*, Json> fields[] = {
      {"ranks", s.ranks}, {"batch", s.batch}, {"seq_len", s.seq_len}, {"heads", s.heads},
      {"kv_heads", s.kv_heads}, {"head_dim", s.head_dim}, {"mask", s.mask},
      {"layout", s.layout}, {"schedule", s.schedule}, {"dtype", s.dtype}, {"backend", s.backend}, {"comm", s.comm},
      {"threads", s.threads}, {"forward_s", s.forward_s}, {"backward_s", optional(s.backward_s)},
      {"flops_forward", s.flops_forward}, {"gflops_per_rank", s.gflops_per_rank},
      {"comm_bytes_sent", s.comm_bytes_sent}, {"comm_bytes_needed", s.comm_bytes_needed},
      {"exposed_comm_fraction", s.exposed_comm_fraction}, {"nodes", s.nodes}, {"peak_rss_bytes", s.peak_rss_bytes},
      {"max_abs_err", optional(s.max_abs_err)}};
  for (const auto& [key, value] : fields) visit(key, value);
}

// The summary as a JSON object, without the absent optional fields.
Json summary_json(const RunSummary& s);

}  // namespace ringattn
