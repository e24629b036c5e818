#include "launch/plan/hybrid_report.hpp"

#include <algorithm>
#include <cstdio>

namespace ringattn {

Json print_hybrid_projection(const ClusterSpec& c, const Workload& w, const Mask& mask, const std::vector<int>& ranks,
                             std::vector<int> degrees) {
  if (degrees.empty()) {
    int largest = 1;
    for (int P : ranks) largest = std::max(largest, P);
    for (int U = 1; U <= largest; U *= 2) degrees.push_back(U);
  }
  std::printf("\n# hybrid (--ulysses U): all-to-all inside groups of U ranks (%s), the ring across the P/U groups\n"
              "#   on H/U heads; layout %s, schedule %s; a2a: all-to-all time per pass, not overlapped "
              "(hybrid_model.hpp)\n",
              c.ranks_per_node > 1 ? "a node's ranks when ranks_per_node is a multiple of U" : "consecutive ranks",
              layout_name(w.layout), schedule_name(w.schedule));
  std::printf("# %6s %4s %11s %11s %11s %10s %8s %9s %10s\n", "ranks", "U", "forward_ms", "backward_ms", "total_ms",
              "a2a_ms", "exposed", "ring_GiB", "a2a_GiB");
  Json out = Json::array();
  const MaskView view = mask.view();
  for (int P : ranks) {
    int best = 0;
    double best_total = 0.0;
    for (int U : degrees) {
      if (!ulysses_fits(U, P, w.heads, w.kv_heads)) continue;
      const HybridPrediction h = predict_hybrid(c, w, view, P, U);
      const double a2a = h.a2a_forward_seconds + h.a2a_backward_seconds;
      std::printf("  %6d %4d %11.3f %11.3f %11.3f %10.3f %7.1f%% %9.3f %10.3f\n", P, U, h.forward_seconds() * 1e3,
                  h.backward_seconds() * 1e3, h.total_seconds() * 1e3, a2a * 1e3, 100 * h.exposed_forward(),
                  double(h.ring.bytes_sent) * U / double(1ull << 30), double(h.a2a_bytes_sent) / double(1ull << 30));
      Json j = Json::object();
      j["ranks"] = P;
      j["ulysses"] = U;
      j["forward_s"] = h.forward_seconds();
      j["backward_s"] = h.backward_seconds();
      j["a2a_forward_s"] = h.a2a_forward_seconds;
      j["a2a_backward_s"] = h.a2a_backward_seconds;
      j["exposed_comm_fraction"] = h.exposed_forward();
      j["comm_bytes_sent"] = double(h.ring.bytes_sent) * U;  // the U rings together
      j["a2a_bytes_sent"] = h.a2a_bytes_sent;
      out.push_back(j);
      if (best == 0 || h.total_seconds() < best_total) best = U, best_total = h.total_seconds();
    }
    if (best) std::printf("# recommended at %d ranks: --ulysses %d (%.3f ms)\n", P, best, best_total * 1e3);
  }
  std::fflush(stdout);
  return out;
}

}  // namespace ringattn
