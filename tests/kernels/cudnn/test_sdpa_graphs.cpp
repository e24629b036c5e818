// cuDNN's own validation of every graph the planner makes, without a device: the distinct graph
// shapes of every ring step over realistic jobs (P = 1..8, every layout and schedule, causal,
// windows, documents, block masks, GQA, both passes, deterministic or not) are checked by
// cudnn-frontend's validate() for an H200 (SM 9.0, 132 SMs). Needs libcudnn (not a GPU) and the
// real engine; skips where none loads. In emulated builds the CPU stand-in checks the same shapes
// against the rules it transcribes.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>

#include "kernels/cudnn/sdpa_engine.hpp"
#include "kernels/mask/mask.hpp"
#include "runtime/ring_plan.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn::kernels::cudnn {
namespace {

constexpr int kSmVersion = 90, kSmCount = 132;  // H200

// The graph shapes of every step of every rank, both schedules and passes.
void collect(const Mask& mask, int64_t L, int P, LayoutKind kind, const AttentionDims& dims, bool deterministic,
             std::unordered_map<size_t, SdpaGraphShape>& shapes) {
  const ShardLayout layout(kind, L, P);
  const MaskView m = mask.view();
  const SdpaCapabilities caps = capabilities(91900, kSmVersion, dims.batch * L * dims.heads * dims.head_dim);
  for (Schedule schedule : {Schedule::direct, Schedule::ring})
    for (int rank = 0; rank < P; ++rank) {
      const std::vector<int64_t> qp = layout.positions(rank);
      const RingPlan ring(layout, m, schedule, rank);
      for (const RingStep& st : ring.steps()) {
        if (st.source < 0) continue;
        std::vector<int64_t> kp;
        const std::vector<int64_t> all = layout.positions(st.source);
        for (const RowRange& r : st.source_rows) kp.insert(kp.end(), all.begin() + r.begin, all.begin() + r.end);
        for (SdpaPass pass : {SdpaPass::forward, SdpaPass::backward}) {
          const StepPlan plan =
              plan_step(m, {qp.data(), int64_t(qp.size())}, {kp.data(), int64_t(kp.size())}, caps, pass);
          for (const SdpaCall& c : plan.calls) {
            const SdpaGraphShape g =
                graph_shape(c, pass, dims, DType::bf16, int64_t(qp.size()), int64_t(kp.size()), deterministic);
            shapes.emplace(g.hash(), g);
          }
        }
      }
    }
}

TEST(CudnnGraphs, EveryPlannedGraphPassesCudnnValidation) {
  const std::unique_ptr<SdpaEngine> engine = make_sdpa_engine();
  if (!engine->available()) GTEST_SKIP() << engine->describe();
  std::vector<std::pair<std::string, Mask>> masks;
  auto add = [&](const std::string& name) -> Mask& { return masks.emplace_back(name, Mask{}).second; };
  add("none");
  add("causal").causal = true;
  Mask& w = add("causal+window(1000,-1)");
  w.causal = true, w.window_left = 1000;
  Mask& b = add("window(300,300)");
  b.window_left = b.window_right = 300;
  Mask& d = add("causal+docs");
  d.causal = true, d.set_documents({1500, 3000, 1, 777, 2914});
  Mask& dw = add("docs+window(200,0)");
  dw.window_left = 200, dw.window_right = 0, dw.set_documents({4096, 2000, 2096});
  Mask& bm = add("causal+block mask");
  const int64_t L = 8192, n = L / 128;
  bm.causal = true, bm.set_block_mask(bigbird_block_mask(n, 1, 2, 2, 7), n, 128);
  std::unordered_map<size_t, SdpaGraphShape> shapes;
  for (const AttentionDims& dims : {AttentionDims{1, 16, 4, 128, 0.088f}, AttentionDims{2, 8, 8, 64, 0.125f}})
    for (const auto& [name, mask] : masks)
      for (int P : {1, 2, 3, 4, 8})
        for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
          for (bool det : {false, true}) collect(mask, L, P, kind, dims, det, shapes);
  std::map<std::string, int> failures;
  for (const auto& [hash, g] : shapes) {
    const std::string why = validate_graph_offline(g, kSmVersion, kSmCount);
    if (!why.empty() && failures[why]++ < 3) ADD_FAILURE() << g.describe() << ": " << why;
  }
  std::printf("[ graphs   ] %zu distinct graphs validated by %s for SM %d\n", shapes.size(), engine->describe().c_str(),
              kSmVersion);
  EXPECT_GT(shapes.size(), 50u);
}

}  // namespace
}  // namespace ringattn::kernels::cudnn
