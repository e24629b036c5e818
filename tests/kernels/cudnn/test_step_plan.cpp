// The cuDNN step planner (kernels/cudnn/step_plan.hpp), exhaustively over small cases: every ring
// step of P = 1..8 ranks, every layout and schedule, uneven lengths, causal, windows, random
// documents and block masks. Each planned call is evaluated through cuDNN's own keep-predicate,
// written out below from cudnn-frontend's reference (test/python/sdpa/fp16_ref.py, the model its
// SDPA tests compare against); the calls must keep every visible (query, key) pair of our mask
// arithmetic exactly once, and nothing else.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cudnn/step_plan.hpp"
#include "kernels/mask/mask.hpp"
#include "runtime/ring_plan.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn::kernels::cudnn {
namespace {

// Whether cuDNN's SDPA keeps score (r, c) of sequence s of a call (fp16_ref.py, in its order):
// - padding mask (seq_len_q = m, seq_len_kv = n of the sequence): keys c >= n are masked and rows
//   r >= m produce nothing; the sequence's lengths are its segment's rows and keys;
// - right bound R: top-left masks triu(1 + R), i.e. keeps c <= r + R; bottom-right masks
//   triu(s_kv - s_q + 1 + R), with the sequence's lengths under the padding mask, else the
//   tensor's s_q, s_kv;
// - left bound W: top-left masks tril(-W), i.e. keeps c > r - W; bottom-right masks
//   tril(s_kv - s_q - W);
// - block mask: bit (c / 128) % 8 of byte (c / 128) / 8 in row r / 128 (LSB first), here
//   unpacked as call.tiles[(r / 128) * tiles_k + c / 128].
// A dense call's tensors are exactly its one segment (s_q = its rows, s_kv = its keys).
bool cudnn_keeps(const SdpaCall& call, size_t s, int64_t r, int64_t c) {
  const SdpaSegment& seg = call.segments[s];
  const int64_t s_q = call.padding ? seg.q_rows : call.max_q_rows();
  const int64_t s_kv = call.padding ? seg.k_rows : call.max_k_rows();
  if (r >= seg.q_rows || c >= seg.k_rows) return false;  // padding, or outside a dense call's tensors
  const int64_t shift = call.alignment == DiagonalAlignment::bottom_right ? s_kv - s_q : 0;
  if (call.right_bound >= 0 && c >= r + shift + 1 + call.right_bound) return false;
  if (call.left_bound >= 0 && c <= r + shift - call.left_bound) return false;
  if (call.has_tiles() && !call.tiles[size_t((r / kMaskTile) * call.tiles_k + c / kMaskTile)]) return false;
  return true;
}

// What cuDNN's validation (cudnn-frontend 1.32, node/scaled_dot_product_flash_attention.h and
// sdpa_support_surface.h) demands of a call's attributes.
void expect_valid(const SdpaCall& call, int64_t q_rows, int64_t k_rows, const std::string& where) {
  ASSERT_FALSE(call.segments.empty()) << where;
  EXPECT_TRUE(call.right_bound == -1 || call.right_bound >= 0) << where;
  EXPECT_TRUE(call.left_bound == -1 || call.left_bound >= 1) << where;      // "Left bound ... > 0"
  EXPECT_FALSE(call.max_q_rows() == 1 && call.max_k_rows() == 1) << where;  // "s_q = s_kv = 1 is not supported"
  if (call.ragged) EXPECT_TRUE(call.padding) << where;  // "Ragged offsets are only supported with padding mask"
  if (!call.ragged) EXPECT_EQ(call.segments.size(), 1u) << where;
  if (!call.padding && (call.left_bound >= 0 || call.alignment == DiagonalAlignment::bottom_right))
    EXPECT_LE(call.max_q_rows(), call.max_k_rows()) << where;  // "... only supported with max_s_q <= max_s_kv"
  if (call.has_tiles()) {
    EXPECT_FALSE(call.ragged) << where;
    EXPECT_EQ(call.tiles_q, (call.max_q_rows() + kMaskTile - 1) / kMaskTile) << where;
    EXPECT_EQ(call.tiles_k, (call.max_k_rows() + kMaskTile - 1) / kMaskTile) << where;
  }
  for (size_t s = 0; s < call.segments.size(); ++s) {
    const SdpaSegment& g = call.segments[s];
    EXPECT_TRUE(g.q_rows > 0 && g.k_rows > 0 && g.q_row0 >= 0 && g.k_row0 >= 0) << where;
    EXPECT_LE(g.q_row0 + g.q_rows, q_rows) << where;
    EXPECT_LE(g.k_row0 + g.k_rows, k_rows) << where;
    if (s > 0) {  // one writer per O / dQ row and per dK / dV row, ragged offsets ascending
      EXPECT_GE(g.q_row0, call.segments[s - 1].q_row0 + call.segments[s - 1].q_rows) << where;
      EXPECT_GE(g.k_row0, call.segments[s - 1].k_row0 + call.segments[s - 1].k_rows) << where;
    }
  }
}

struct Counts {
  int cudnn = 0, own = 0, calls = 0, ragged_calls = 0, bottom_right = 0, tiled_calls = 0, widened = 0;
  std::map<std::string, int> reasons;
};

// Checks one step's plan against the mask, pair by pair.
void check_step(const Mask& mask, const std::vector<int64_t>& qp, const std::vector<int64_t>& kp,
                const SdpaCapabilities& caps, SdpaPass pass, const std::string& where, Counts& counts) {
  const MaskView m = mask.view();
  const StepPlan plan = plan_step(m, {qp.data(), int64_t(qp.size())}, {kp.data(), int64_t(kp.size())}, caps, pass);
  if (!plan.cudnn) {
    ++counts.own;
    ++counts.reasons[plan.own_reason];
    EXPECT_FALSE(plan.own_reason.empty()) << where;
    return;
  }
  ++counts.cudnn;
  const size_t nq = qp.size(), nk = kp.size();
  std::vector<int> kept(nq * nk, 0);
  for (const SdpaCall& call : plan.calls) {
    ++counts.calls;
    counts.ragged_calls += call.ragged;
    counts.bottom_right += call.alignment == DiagonalAlignment::bottom_right;
    counts.tiled_calls += call.has_tiles();
    counts.widened += call.widened;
    expect_valid(call, int64_t(nq), int64_t(nk), where);
    if (pass == SdpaPass::backward) EXPECT_FALSE(call.has_tiles()) << where;
    for (size_t s = 0; s < call.segments.size(); ++s) {
      const SdpaSegment& g = call.segments[s];
      std::vector<char> row_sees(size_t(g.q_rows), 0), key_seen(size_t(g.k_rows), 0);
      for (int64_t r = 0; r < call.max_q_rows(); ++r)
        for (int64_t c = 0; c < call.max_k_rows(); ++c)
          if (cudnn_keeps(call, s, r, c)) {
            ++kept[size_t(g.q_row0 + r) * nk + size_t(g.k_row0 + c)];
            row_sees[size_t(r)] = key_seen[size_t(c)] = 1;
          }
      // Trimmed: every row of a call sees a key and every key is seen (tile masks may blank rows).
      if (!call.has_tiles()) {
        for (char x : row_sees) EXPECT_TRUE(x) << where << ": a call row that sees nothing";
        if (!call.widened)
          for (char x : key_seen) EXPECT_TRUE(x) << where << ": a call key no row sees";
      }
    }
  }
  int wrong = 0;
  for (size_t i = 0; i < nq; ++i)
    for (size_t j = 0; j < nk; ++j) {
      const int want = visible(m, qp[i], kp[j]) ? 1 : 0;
      if (kept[i * nk + j] != want && wrong++ < 3)
        ADD_FAILURE() << where << ": query " << qp[i] << " key " << kp[j] << " kept " << kept[i * nk + j]
                      << " times, visible " << want;
    }
}

// Every step of every rank of a ring over (L, P, layout, schedule): the local step, and each
// received block (direct: the rows the plan sends; ring: the whole shard of the source).
void check_ring(const Mask& mask, int64_t L, int P, LayoutKind kind, const SdpaCapabilities& caps,
                const std::string& what, Counts& counts) {
  const ShardLayout layout(kind, L, P);
  const MaskView m = mask.view();
  for (Schedule schedule : {Schedule::direct, Schedule::ring})
    for (int rank = 0; rank < P; ++rank) {
      const RingPlan plan(layout, m, schedule, rank);
      const std::vector<int64_t> qp = layout.positions(rank);
      for (const RingStep& st : plan.steps()) {
        if (st.source < 0) continue;
        std::vector<int64_t> kp;
        if (st.step == 0) {
          kp = qp;
        } else {
          const std::vector<int64_t> all = layout.positions(st.source);
          for (const RowRange& r : st.source_rows) kp.insert(kp.end(), all.begin() + r.begin, all.begin() + r.end);
        }
        for (SdpaPass pass : {SdpaPass::forward, SdpaPass::backward}) {
          const std::string where = what + " L=" + std::to_string(L) + " P=" + std::to_string(P) + " " +
                                    layout_name(kind) + " " + schedule_name(schedule) + " rank " +
                                    std::to_string(rank) + " step " + std::to_string(st.step) +
                                    (pass == SdpaPass::forward ? " fwd" : " bwd");
          check_step(mask, qp, kp, caps, pass, where, counts);
        }
      }
    }
}

std::vector<int64_t> random_documents(int64_t L, std::mt19937_64& gen) {
  std::vector<int64_t> lens;
  int64_t left = L;
  while (left > 0) {
    const int64_t n = std::min<int64_t>(left, int64_t(gen() % (L / 3 + 2)));  // zero-length ones too
    lens.push_back(n);
    left -= n;
  }
  return lens;
}

void report(const char* name, const Counts& c) {
  std::printf(
      "[ plan     ] %s: %d steps on cuDNN (%d calls: %d ragged, %d bottom-right, %d with tiles, %d widened 1 x 1), "
      "%d on ours\n",
      name, c.cudnn, c.calls, c.ragged_calls, c.bottom_right, c.tiled_calls, c.widened, c.own);
  for (const auto& [why, n] : c.reasons) std::printf("[ plan     ]   ours: %d x %s\n", n, why.c_str());
}

constexpr LayoutKind kLayouts[] = {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped};
const int64_t kLengths[] = {17, 40, 97};

TEST(CudnnStepPlan, CausalAndWindowsCoverEveryVisiblePairOnce) {
  std::vector<std::pair<std::string, Mask>> masks;
  auto add = [&](const std::string& name, bool causal, int64_t left, int64_t right) {
    Mask m;
    m.causal = causal, m.window_left = left, m.window_right = right;
    masks.push_back({name, m});
  };
  add("none", false, -1, -1);
  add("causal", true, -1, -1);
  add("causal+window(5,-1)", true, 5, -1);
  add("causal+window(0,-1)", true, 0, -1);
  add("window(7,3)", false, 7, 3);
  add("window(3,11)", false, 3, 11);
  add("window(-1,2)", false, -1, 2);
  add("window(4,-1)", false, 4, -1);
  add("window(0,0)", false, 0, 0);
  Counts all;
  for (const auto& [name, mask] : masks)
    for (int64_t L : kLengths)
      for (int P = 1; P <= 8; ++P)
        for (LayoutKind kind : kLayouts) check_ring(mask, L, P, kind, SdpaCapabilities{}, name, all);
  report("causal and windows", all);
  EXPECT_GT(all.cudnn, 10 * all.own);  // ours only for single pairs and the odd mixed-stride block
}

TEST(CudnnStepPlan, RandomDocumentsCoverEveryVisiblePairOnce) {
  std::mt19937_64 gen(26);
  Counts all, without_ragged;
  for (int trial = 0; trial < 4; ++trial)
    for (int64_t L : kLengths) {
      const std::vector<int64_t> docs = random_documents(L, gen);
      for (int variant = 0; variant < 3; ++variant) {
        Mask mask;
        mask.set_documents(docs);
        mask.causal = variant != 1;
        if (variant == 2) mask.window_left = 6;
        if (variant == 1) mask.window_left = 3, mask.window_right = 5;
        for (int P = 1; P <= 8; ++P)
          for (LayoutKind kind : kLayouts) {
            check_ring(mask, L, P, kind, SdpaCapabilities{}, "docs", all);
            if (trial == 0)
              check_ring(mask, L, P, kind, SdpaCapabilities{false, false}, "docs, no ragged", without_ragged);
          }
      }
    }
  report("documents", all);
  report("documents without ragged offsets", without_ragged);
  EXPECT_GT(all.ragged_calls, 0);
  EXPECT_GT(all.cudnn, 10 * all.own);
}

TEST(CudnnStepPlan, BlockMasksCoverEveryVisiblePairOnce) {
  std::mt19937_64 gen(9);
  Counts all, no_band, old;
  for (int64_t L : {300, 517})
    for (int64_t block : {128, 256, 64}) {
      const int64_t n = (L + block - 1) / block;
      std::vector<uint8_t> bits(size_t(n * n));
      for (uint8_t& b : bits) b = gen() % 3 != 0;
      for (int variant = 0; variant < 3; ++variant) {
        Mask mask;
        mask.set_block_mask(bits, n, block);
        mask.causal = variant >= 1;
        if (variant == 2) mask.window_left = 90;
        for (int P : {1, 2, 3, 5, 8})
          for (LayoutKind kind : kLayouts) {
            check_ring(mask, L, P, kind, SdpaCapabilities{true, true, true}, "block mask", all);
            check_ring(mask, L, P, kind, SdpaCapabilities{true, true, false}, "block mask, cuDNN 9.14-9.20", no_band);
            if (variant == 0 && P == 2) check_ring(mask, L, P, kind, SdpaCapabilities{}, "block mask, cuDNN < 9.14", old);
          }
      }
    }
  report("block masks (cuDNN 9.21 and later)", all);
  report("block masks (cuDNN 9.14 to 9.20: no band beside the tiles)", no_band);
  report("block masks before cuDNN 9.14", old);
  EXPECT_GT(all.tiled_calls, no_band.tiled_calls);
  EXPECT_GT(no_band.tiled_calls, 0);
  EXPECT_EQ(old.cudnn, 0);
}

// The two shapes the ring meets most, planned to the call: a zigzag rank's local causal step is
// its two diagonal blocks in one ragged call and the later chunk's full block against the earlier
// one; a received contiguous causal block is one full call.
TEST(CudnnStepPlan, ZigzagLocalCausalStepIsTwoCalls) {
  const ShardLayout layout(LayoutKind::zigzag, 1000, 4);
  Mask mask;
  mask.causal = true;
  const std::vector<int64_t> pos = layout.positions(1);  // chunks 1 and 6 of 8
  const StepPlan plan = plan_step(mask.view(), {pos.data(), int64_t(pos.size())}, {pos.data(), int64_t(pos.size())},
                                  SdpaCapabilities{}, SdpaPass::forward);
  ASSERT_TRUE(plan.cudnn);
  ASSERT_EQ(plan.calls.size(), 2u);
  EXPECT_TRUE(plan.calls[0].ragged);
  EXPECT_EQ(plan.calls[0].segments.size(), 2u);
  EXPECT_EQ(plan.calls[0].right_bound, 0);
  EXPECT_EQ(plan.calls[0].left_bound, -1);
  EXPECT_FALSE(plan.calls[1].ragged);
  EXPECT_EQ(plan.calls[1].right_bound, -1);  // chunk 6 sees all of chunk 1
  EXPECT_EQ(plan.calls[1].segments[0].q_row0, 125);
  EXPECT_EQ(plan.calls[1].segments[0].k_rows, 125);
}

TEST(CudnnStepPlan, LongRunsOfDifferentStridesAndLonePairsRunOnOurKernels) {
  const Mask none;
  auto plan = [&](const std::vector<int64_t>& q, const std::vector<int64_t>& k) {
    return plan_step(none.view(), {q.data(), int64_t(q.size())}, {k.data(), int64_t(k.size())}, SdpaCapabilities{},
                     SdpaPass::forward);
  };
  std::vector<int64_t> even, consecutive;
  for (int64_t t = 0; t < 9; ++t) even.push_back(2 * t), consecutive.push_back(t);
  EXPECT_FALSE(plan(even, consecutive).cudnn);
  EXPECT_TRUE(plan({0, 2, 4, 6}, consecutive).cudnn);  // a short run goes row by row
  EXPECT_FALSE(plan({5}, {5}).cudnn);
  const StepPlan widened = plan({5}, {5, 6});
  ASSERT_TRUE(widened.cudnn);
  EXPECT_EQ(widened.calls.size(), 1u);
}

}  // namespace
}  // namespace ringattn::kernels::cudnn
