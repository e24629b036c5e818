#include "kernels/cudnn/step_plan.hpp"

#include <algorithm>
#include <limits>
#include <optional>

namespace ringattn::kernels::cudnn {

namespace {

constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();
// A run of at most this many rows against a run of another stride goes row by row (more calls);
// longer ones leave the step to our kernels.
constexpr int64_t kMaxRowByRow = 8;

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }  // b > 0
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// A rectangle of query rows x key rows whose positions advance by the same stride, and its band
// in row indices: keys c with lo + r <= c <= hi + r are visible to query r (absent: unbounded).
struct Rect {
  int64_t q_row0, q_rows, q_start;
  int64_t k_row0, k_rows, k_start;
  int64_t stride;
  std::optional<int64_t> lo, hi;
};

// The band of docs/reference.md's causal and window conditions between two runs of one stride.
Rect band(const MaskView& m, int64_t q_row0, int64_t q_rows, int64_t q_start, int64_t k_row0, int64_t k_rows,
          int64_t k_start, int64_t stride) {
  Rect r{q_row0, q_rows, q_start, k_row0, k_rows, k_start, stride, std::nullopt, std::nullopt};
  std::optional<int64_t> upper;  // j <= i + upper
  if (m.causal) upper = 0;
  if (m.window_right >= 0) upper = std::min(upper.value_or(m.window_right), m.window_right);
  if (upper) r.hi = floor_div(q_start - k_start + *upper, stride);
  if (m.window_left >= 0) r.lo = ceil_div(q_start - k_start - m.window_left, stride);
  return r;
}

// Drops the rows that see no key and the keys no row sees; false when nothing is visible.
bool trim(Rect& r) {
  int64_t r0 = 0, r1 = r.q_rows - 1;
  if (r.hi) r0 = std::max(r0, -*r.hi);
  if (r.lo) r1 = std::min(r1, r.k_rows - 1 - *r.lo);
  if ((r.lo && r.hi && *r.lo > *r.hi) || r0 > r1 || r.k_rows <= 0) return false;
  const int64_t c0 = std::max<int64_t>(0, r.lo ? *r.lo + r0 : 0);
  const int64_t c1 = std::min(r.k_rows - 1, r.hi ? *r.hi + r1 : r.k_rows - 1);
  if (c0 > c1) return false;
  r.q_row0 += r0, r.q_start += r0 * r.stride, r.q_rows = r1 - r0 + 1;
  r.k_row0 += c0, r.k_start += c0 * r.stride, r.k_rows = c1 - c0 + 1;
  if (r.hi) *r.hi += r0 - c0;
  if (r.lo) *r.lo += r0 - c0;
  return true;
}

// The values of one cuDNN bound that express a rectangle's band: exactly one value where the
// bound cuts the rectangle, else any value from `first` up (or none at all).
struct Admissible {
  int64_t first = 0, last = kUnbounded;  // [first, last]; last == kUnbounded: no bound needed
  bool empty() const { return first > last; }
  Admissible meet(const Admissible& o) const { return {std::max(first, o.first), std::min(last, o.last)}; }
  static Admissible exactly(int64_t v) { return {v, v}; }
  static Admissible none() { return {1, 0}; }
};

// cuDNN's keep-predicates (cudnn-frontend test/python/sdpa/fp16_ref.py, the reference its tests
// compare against): right bound R keeps c <= r + R + shift, left bound W keeps
// c >= r + shift - W + 1, with shift = 0 top-left and s_kv - s_q (per sequence) bottom-right.
struct Bounds {
  Admissible right, left;
};
Bounds admissible(const Rect& r, DiagonalAlignment a) {
  const int64_t shift = a == DiagonalAlignment::bottom_right ? r.k_rows - r.q_rows : 0;
  Bounds b;
  // Right: keep c <= r + hi; cuts when row 0 misses the last key.
  if (r.hi && *r.hi < r.k_rows - 1)
    b.right = *r.hi - shift >= 0 ? Admissible::exactly(*r.hi - shift) : Admissible::none();
  else
    b.right = {std::max<int64_t>(0, r.k_rows - 1 - shift), kUnbounded};
  // Left: keep c >= r + lo; cuts when the last row misses key 0.
  if (r.lo && *r.lo + r.q_rows - 1 > 0)
    b.left = shift + 1 - *r.lo >= 1 ? Admissible::exactly(shift + 1 - *r.lo) : Admissible::none();
  else
    b.left = {std::max<int64_t>(1, shift + r.q_rows), kUnbounded};
  return b;
}

int64_t bound_value(const Admissible& a) { return a.last == kUnbounded ? -1 : a.last; }

// Segments of one call must not share query rows (each writes its O and dQ) or key rows (dK, dV),
// and follow each other in both (ragged offsets ascend).
bool follows(const SdpaSegment& prev, const Rect& r) {
  return r.q_row0 >= prev.q_row0 + prev.q_rows && r.k_row0 >= prev.k_row0 + prev.k_rows;
}

SdpaSegment segment_of(const Rect& r) { return {r.q_row0, r.q_rows, r.k_row0, r.k_rows}; }

// A call being filled: its segments and the bounds every one of them admits, per alignment.
struct OpenCall {
  std::vector<Rect> rects;
  Bounds by_alignment[2];
  bool alive[2] = {true, true};
};

bool admits(const Bounds& b) { return !b.right.empty() && !b.left.empty(); }

void add_to(OpenCall& call, const Rect& r, const Bounds (&b)[2]) {
  for (int a = 0; a < 2; ++a) {
    if (call.rects.empty())
      call.by_alignment[a] = b[a];
    else
      call.by_alignment[a] = {call.by_alignment[a].right.meet(b[a].right), call.by_alignment[a].left.meet(b[a].left)};
    call.alive[a] = call.alive[a] && admits(call.by_alignment[a]);
  }
  call.rects.push_back(r);
}

bool can_join(const OpenCall& call, const Rect& r, const Bounds (&b)[2], bool ragged) {
  if (call.rects.empty()) return true;
  if (!ragged || !follows(segment_of(call.rects.back()), r)) return false;
  for (int a = 0; a < 2; ++a)
    if (call.alive[a] &&
        admits({call.by_alignment[a].right.meet(b[a].right), call.by_alignment[a].left.meet(b[a].left)}))
      return true;
  return false;
}

SdpaCall finish(const OpenCall& open) {
  SdpaCall call;
  for (const Rect& r : open.rects) call.segments.push_back(segment_of(r));
  if (open.rects.size() == 1) {
    // One sequence: top-left always expresses a trimmed band (the first row sees key 0's
    // diagonal or beyond), so no per-sequence length is needed...
    const Bounds b = admissible(open.rects[0], DiagonalAlignment::top_left);
    call.right_bound = bound_value(b.right);
    call.left_bound = bound_value(b.left);
    // ...except that cuDNN takes a left bound with s_q > s_kv only with its padding mask.
    call.padding = call.left_bound >= 0 && open.rects[0].q_rows > open.rects[0].k_rows;
    return call;
  }
  call.ragged = call.padding = true;
  const int a = open.alive[0] ? 0 : 1;
  call.alignment = a == 0 ? DiagonalAlignment::top_left : DiagonalAlignment::bottom_right;
  call.right_bound = bound_value(open.by_alignment[a].right);
  call.left_bound = bound_value(open.by_alignment[a].left);
  return call;
}

// Whole calls in first-fit order: each rectangle joins the first open call that admits it.
std::vector<SdpaCall> group(const std::vector<Rect>& rects, bool ragged) {
  std::vector<OpenCall> open;
  for (const Rect& r : rects) {
    const Bounds b[2] = {admissible(r, DiagonalAlignment::top_left), admissible(r, DiagonalAlignment::bottom_right)};
    auto it = std::find_if(open.begin(), open.end(), [&](const OpenCall& c) { return can_join(c, r, b, ragged); });
    if (it == open.end()) it = open.insert(open.end(), OpenCall{});
    add_to(*it, r, b);
  }
  std::vector<SdpaCall> calls;
  for (const OpenCall& c : open) calls.push_back(finish(c));
  return calls;
}

// Rows t of a run whose positions lie in document d: [first, last) in run indices.
struct Piece {
  int64_t doc, first, last;
};
std::vector<Piece> document_pieces(const MaskView& m, const PositionRunOfRows& run) {
  std::vector<Piece> out;
  const int64_t last_pos = run.start + (run.count - 1) * run.stride;
  for (int64_t d = document_of(m, run.start); d < m.num_docs && m.doc_offsets[d] <= last_pos; ++d) {
    const int64_t a = std::max<int64_t>(0, ceil_div(m.doc_offsets[d] - run.start, run.stride));
    const int64_t b = std::min(run.count, ceil_div(m.doc_offsets[d + 1] - run.start, run.stride));
    if (a < b) out.push_back({d, a, b});
  }
  return out;
}

// The tile mask of a dense rectangle of contiguous rows, one tile row per kMaskTile query rows
// from its first row (the caller cut it so that no tile straddles a mask block).
void add_tiles(const MaskView& m, const Rect& r, SdpaCall& call) {
  call.tiles_q = (r.q_rows + kMaskTile - 1) / kMaskTile;
  call.tiles_k = (r.k_rows + kMaskTile - 1) / kMaskTile;
  call.tiles.assign(static_cast<size_t>(call.tiles_q * call.tiles_k), 0);
  for (int64_t tq = 0; tq < call.tiles_q; ++tq)
    for (int64_t tk = 0; tk < call.tiles_k; ++tk)
      call.tiles[static_cast<size_t>(tq * call.tiles_k + tk)] =
          block_visible(m, r.q_start + tq * kMaskTile, r.k_start + tk * kMaskTile) ? 1 : 0;
}

// Cuts [start, start + n) of contiguous positions at multiples of kMaskTile: at most one piece
// before the first multiple (shorter than a tile), then pieces starting on multiples.
std::vector<std::pair<int64_t, int64_t>> tile_aligned_pieces(int64_t start, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> out;  // (offset, count)
  const int64_t head = std::min(n, (kMaskTile - start % kMaskTile) % kMaskTile);
  if (head > 0) out.push_back({0, head});
  if (n > head) out.push_back({head, n - head});
  return out;
}

// Whether rows [start, start + n) of contiguous positions meet each tile of a grid laid from their
// first row inside one mask block: they start on a multiple of kMaskTile, or fit before the next.
bool fits_tile_grid(int64_t start, int64_t n) { return start % kMaskTile == 0 || start % kMaskTile + n <= kMaskTile; }

std::string block_mask_calls(const MaskView& m, const Rect& trimmed, const SdpaCapabilities& caps,
                             std::vector<SdpaCall>& calls) {
  if (trimmed.stride != 1 && (trimmed.q_rows > 1 || trimmed.k_rows > 1))
    return "a block mask on rows that are not contiguous";
  for (auto [qo, qn] : tile_aligned_pieces(trimmed.q_start, trimmed.q_rows))
    for (auto [ko, kn] : tile_aligned_pieces(trimmed.k_start, trimmed.k_rows)) {
      Rect r = band(m, trimmed.q_row0 + qo, qn, trimmed.q_start + qo, trimmed.k_row0 + ko, kn, trimmed.k_start + ko, 1);
      if (!trim(r)) continue;
      // Trimming must leave every tile inside one mask block.
      if (!fits_tile_grid(r.q_start, r.q_rows) || !fits_tile_grid(r.k_start, r.k_rows))
        return "a block mask whose tiles the band would shift off the mask's blocks";
      OpenCall open;
      const Bounds b[2] = {admissible(r, DiagonalAlignment::top_left), admissible(r, DiagonalAlignment::bottom_right)};
      add_to(open, r, b);
      SdpaCall call = finish(open);
      // cudnn-frontend: "Left bound or right bound for unified SDPA node requires cuDNN 9.21.0".
      if ((call.right_bound >= 0 || call.left_bound >= 0) && !caps.block_mask_with_band)
        return "a block mask with a causal or window band in one call (cuDNN before 9.21)";
      add_tiles(m, r, call);
      if (std::none_of(call.tiles.begin(), call.tiles.end(), [](uint8_t x) { return x != 0; })) continue;
      calls.push_back(std::move(call));
    }
  return "";
}

// cuDNN refuses s_q = s_kv = 1: a call of one pair takes a neighbouring key too, masked by the
// band (the next key: right bound 0; the previous one: bottom-right, left bound 1, which keeps
// c >= r + (2 - 1) - 1 + 1). False when the step has a single key.
bool widen_single_pair(SdpaCall& c, int64_t key_rows) {
  const SdpaSegment s = c.segments[0];
  if (c.ragged || c.has_tiles() || c.segments.size() != 1 || key_rows < 2) return false;
  c = SdpaCall{};
  if (s.k_row0 + 1 < key_rows) {
    c.segments = {{s.q_row0, 1, s.k_row0, 2}};
    c.right_bound = 0;
  } else {
    c.segments = {{s.q_row0, 1, s.k_row0 - 1, 2}};
    c.alignment = DiagonalAlignment::bottom_right;
    c.left_bound = 1;
  }
  c.widened = true;
  return true;
}

StepPlan own(std::string why) {
  StepPlan p;
  p.own_reason = std::move(why);
  return p;
}

}  // namespace

int64_t SdpaCall::max_q_rows() const {
  int64_t n = 0;
  for (const SdpaSegment& s : segments) n = std::max(n, s.q_rows);
  return n;
}

int64_t SdpaCall::max_k_rows() const {
  int64_t n = 0;
  for (const SdpaSegment& s : segments) n = std::max(n, s.k_rows);
  return n;
}

std::vector<PositionRunOfRows> arithmetic_runs(StepRows rows) {
  std::vector<PositionRunOfRows> runs;
  for (int64_t t = 0; t < rows.rows;) {
    PositionRunOfRows run{t, 1, rows.pos[t], 1};
    if (t + 1 < rows.rows) {
      run.stride = rows.pos[t + 1] - rows.pos[t];
      while (t + run.count < rows.rows && rows.pos[t + run.count] - rows.pos[t + run.count - 1] == run.stride)
        ++run.count;
    }
    runs.push_back(run);
    t += run.count;
  }
  return runs;
}

StepPlan plan_step(const MaskView& mask, StepRows queries, StepRows keys, const SdpaCapabilities& caps, SdpaPass pass) {
  const bool blocks = mask.has_block_mask();
  if (blocks) {
    if (pass == SdpaPass::backward) return own("a block mask in the backward (cuDNN's backward has no block mask)");
    if (!caps.block_mask_forward) return own("a block mask (this cuDNN has no block mask before 9.14)");
    if (mask.mask_block % kMaskTile != 0) return own("mask blocks that are not multiples of 128");
    if (mask.has_docs()) return own("a block mask with documents");
  }
  const std::vector<PositionRunOfRows> qruns = arithmetic_runs(queries), kruns = arithmetic_runs(keys);
  std::vector<Rect> rects;
  StepPlan plan;
  plan.cudnn = true;
  auto pair_runs = [&](const PositionRunOfRows& a, const PositionRunOfRows& b) -> std::string {
    const int64_t stride = a.count > 1 ? a.stride : b.count > 1 ? b.stride : 1;
    if (!mask.has_docs()) {
      Rect r = band(mask, a.row0, a.count, a.start, b.row0, b.count, b.start, stride);
      if (!trim(r)) return "";
      if (!blocks) {
        rects.push_back(r);
        return "";
      }
      return block_mask_calls(mask, r, caps, plan.calls);
    }
    const std::vector<Piece> qp = document_pieces(mask, a), kp = document_pieces(mask, b);
    for (size_t x = 0, y = 0; x < qp.size() && y < kp.size();) {
      if (qp[x].doc != kp[y].doc) {
        ++(qp[x].doc < kp[y].doc ? x : y);
        continue;
      }
      Rect r = band(mask, a.row0 + qp[x].first, qp[x].last - qp[x].first, a.start + qp[x].first * a.stride,
                    b.row0 + kp[y].first, kp[y].last - kp[y].first, b.start + kp[y].first * b.stride, stride);
      if (trim(r)) rects.push_back(r);
      ++x, ++y;
    }
    return "";
  };
  // A short run of another stride than its partner's goes row by row (a run of one row takes any stride).
  auto rows_of = [](const PositionRunOfRows& r) {
    std::vector<PositionRunOfRows> out;
    for (int64_t t = 0; t < r.count; ++t) out.push_back({r.row0 + t, 1, r.start + t * r.stride, 1});
    return out;
  };
  for (const PositionRunOfRows& a : qruns)
    for (const PositionRunOfRows& b : kruns) {
      std::string why;
      if (a.count == 1 || b.count == 1 || a.stride == b.stride) {
        why = pair_runs(a, b);
      } else if (std::min(a.count, b.count) <= kMaxRowByRow) {
        if (a.count <= b.count)
          for (const PositionRunOfRows& row : rows_of(a)) why += pair_runs(row, b);
        else
          for (const PositionRunOfRows& row : rows_of(b)) why += pair_runs(a, row);
      } else {
        why = "query and key rows of different strides";
      }
      if (!why.empty()) return own(why);
    }
  if (!blocks) {
    // A ragged call of single pairs only is still s_q = s_kv = 1: its pairs go one call each.
    for (SdpaCall& c : group(rects, caps.ragged)) {
      if (!c.ragged || c.max_q_rows() > 1 || c.max_k_rows() > 1) {
        plan.calls.push_back(std::move(c));
        continue;
      }
      for (const SdpaSegment& s : c.segments) {
        SdpaCall one;
        one.segments = {s};
        plan.calls.push_back(std::move(one));
      }
    }
  }
  for (SdpaCall& c : plan.calls)
    if (c.max_q_rows() == 1 && c.max_k_rows() == 1 && !widen_single_pair(c, keys.rows))
      return own("a single query and key (cuDNN refuses s_q = s_kv = 1)");
  return plan;
}

}  // namespace ringattn::kernels::cudnn
