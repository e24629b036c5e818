#include "runtime/ring_plan.hpp"

#include <algorithm>

#include "runtime/errors.hpp"

namespace ringattn {

const char* schedule_name(Schedule s) { return s == Schedule::direct ? "direct" : "ring"; }

Schedule parse_schedule(const std::string& name) {
  if (name == "direct") return Schedule::direct;
  if (name == "ring") return Schedule::ring;
  throw ArgumentError("schedule", "{schedule} '" + name + "': expected direct or ring");
}

int64_t count_rows(const std::vector<RowRange>& ranges) {
  int64_t n = 0;
  for (const RowRange& r : ranges) n += r.end - r.begin;
  return n;
}

namespace {

// Sorts and merges touching or overlapping intervals.
std::vector<PosRange> merge_intervals(std::vector<PosRange> v) {
  std::sort(v.begin(), v.end(), [](const PosRange& a, const PosRange& b) { return a.lo < b.lo; });
  std::vector<PosRange> out;
  for (const PosRange& r : v) {
    if (r.empty()) continue;
    if (!out.empty() && r.lo <= out.back().hi + 1) out.back().hi = std::max(out.back().hi, r.hi);
    else out.push_back(r);
  }
  return out;
}

// Adds the keys seen by queries run.start + t*stride for t in [t0, t1), all in one block-mask row.
void add_group(const MaskView& mask, const PositionRun& run, int64_t t0, int64_t t1, int64_t seq_len,
               std::vector<PosRange>& out) {
  // key_range(i) contains i and both its ends grow with i, so for consecutive positions the union
  // is one interval; strided positions may leave gaps, so merge query by query.
  std::vector<PosRange> spans;
  if (run.stride == 1) {
    spans.push_back({key_range(mask, run.start + t0).lo, key_range(mask, run.start + t1 - 1).hi});
  } else {
    PosRange cur = key_range(mask, run.start + t0 * run.stride);
    for (int64_t t = t0 + 1; t < t1; ++t) {
      const PosRange r = key_range(mask, run.start + t * run.stride);
      if (r.lo <= cur.hi + 1) cur.hi = std::max(cur.hi, r.hi);
      else spans.push_back(cur), cur = r;
    }
    spans.push_back(cur);
  }
  for (PosRange s : spans) {
    s.lo = std::max<int64_t>(s.lo, 0);
    s.hi = std::min<int64_t>(s.hi, seq_len - 1);
    if (!mask.has_block_mask()) {
      out.push_back(s);
      continue;
    }
    const int64_t n = mask.mask_block, br = (run.start + t0 * run.stride) / n;
    auto add_blocks = [&](int64_t c0, int64_t c1) {  // nonzero block columns [c0, c1)
      const PosRange r{std::max(s.lo, c0 * n), std::min(s.hi, c1 * n - 1)};
      if (!r.empty()) out.push_back(r);
    };
    if (mask.row_run_ptr) {
      for (int64_t k = mask.row_run_ptr[br]; k < mask.row_run_ptr[br + 1]; ++k)
        add_blocks(mask.row_runs[2 * k], mask.row_runs[2 * k + 1]);
      continue;
    }
    const uint8_t* row = mask.block_mask + br * mask.block_count;
    for (int64_t c = 0; c < mask.block_count;) {
      if (!row[c]) { ++c; continue; }
      int64_t c1 = c;
      while (c1 < mask.block_count && row[c1]) ++c1;
      add_blocks(c, c1);
      c = c1;
    }
  }
}

}  // namespace

std::vector<PosRange> visible_keys(const MaskView& mask, const std::vector<PositionRun>& queries, int64_t seq_len) {
  std::vector<PosRange> out;
  for (const PositionRun& run : queries) {
    if (run.count == 0) continue;
    if (!mask.has_block_mask()) {
      add_group(mask, run, 0, run.count, seq_len, out);
      continue;
    }
    // One group per block-mask row: the block mask is constant across it.
    for (int64_t t = 0; t < run.count;) {
      const int64_t p = run.start + t * run.stride;
      const int64_t row_end = (p / mask.mask_block + 1) * mask.mask_block;  // first position of the next row
      const int64_t t_end = std::min(run.count, t + (row_end - 1 - p) / run.stride + 1);
      add_group(mask, run, t, t_end, seq_len, out);
      t = t_end;
    }
  }
  return merge_intervals(std::move(out));
}

std::vector<RowRange> rows_within(const std::vector<PositionRun>& shard, const std::vector<PosRange>& intervals) {
  std::vector<RowRange> out;
  int64_t offset = 0;
  for (const PositionRun& run : shard) {
    for (const PosRange& iv : intervals) {
      if (iv.hi < run.start || iv.lo > run.last()) continue;
      // t with lo <= start + t*stride <= hi
      const int64_t t0 = std::max<int64_t>(0, (iv.lo - run.start + run.stride - 1) / run.stride);
      const int64_t t1 = std::min<int64_t>(run.count - 1, (iv.hi - run.start) / run.stride);
      if (t0 > t1) continue;
      if (!out.empty() && out.back().end == offset + t0) out.back().end = offset + t1 + 1;
      else out.push_back(RowRange{offset + t0, offset + t1 + 1});
    }
    offset += run.count;
  }
  return out;
}

RingPlan::RingPlan(const ShardLayout& layout, const MaskView& mask, Schedule schedule, int rank)
    : schedule_(schedule), rank_(rank) {
  const int P = layout.ranks();
  const int64_t L = layout.seq_len();
  const std::vector<PositionRun> mine = layout.runs(rank);
  const std::vector<PosRange> my_keys = visible_keys(mask, mine, L);

  steps_.resize(static_cast<size_t>(P));
  steps_[0].source = rank;
  steps_[0].source_rows = {RowRange{0, layout.rows(rank)}};

  for (int k = 1; k < P; ++k) {
    RingStep& st = steps_[static_cast<size_t>(k)];
    st.step = k;
    const int from = (rank - k + P) % P;
    const std::vector<RowRange> needed = rows_within(layout.runs(from), my_keys);
    rows_needed_ += count_rows(needed);
    if (schedule == Schedule::direct) {
      const int to = (rank + k) % P;
      st.send_rows = rows_within(mine, visible_keys(mask, layout.runs(to), L));
      if (!st.send_rows.empty()) {
        st.send_peer = to;
        rows_sent_ += count_rows(st.send_rows);
      }
      if (!needed.empty()) {
        st.recv_peer = from;
        st.recv_rows = count_rows(needed);
        st.source = from;
        st.source_rows = needed;
      }
    } else {
      // Relay: receive the shard of (rank - k) from rank - 1, pass the one held to rank + 1.
      const int held = (rank - k + 1 + P) % P;
      st.recv_peer = (rank - 1 + P) % P;
      st.recv_rows = layout.rows(from);
      st.send_peer = (rank + 1) % P;
      st.send_rows = {RowRange{0, layout.rows(held)}};  // rows of the held shard (local to `held`)
      rows_sent_ += layout.rows(held);
      // Attend only where something is visible; the shard still travels on.
      if (!needed.empty()) {
        st.source = from;
        st.source_rows = {RowRange{0, layout.rows(from)}};
      }
    }
  }
}

namespace {

// How many positions of the run lie in [lo, hi].
int64_t count_within(const PositionRun& run, int64_t lo, int64_t hi) {
  if (run.count == 0 || hi < lo || hi < run.start) return 0;
  const int64_t stride = run.count > 1 ? run.stride : 1;
  const int64_t first = lo <= run.start ? 0 : (lo - run.start + stride - 1) / stride;
  const int64_t last = std::min(run.count - 1, (hi - run.start) / stride);
  return std::max<int64_t>(0, last - first + 1);
}

}  // namespace

int64_t count_visible_keys(const MaskView& mask, int64_t i, const PositionRun& keys, int64_t seq_len) {
  PosRange r = key_range(mask, i);
  r.lo = std::max<int64_t>(r.lo, 0);
  r.hi = std::min<int64_t>(r.hi, seq_len - 1);
  if (r.empty()) return 0;
  if (!mask.has_block_mask()) return count_within(keys, r.lo, r.hi);
  // Within the nonzero block columns of the query's block row (Mask::view() attaches this index).
  const int64_t n = mask.mask_block, br = i / n;
  int64_t seen = 0;
  for (int64_t k = mask.row_run_ptr[br]; k < mask.row_run_ptr[br + 1]; ++k)
    seen += count_within(keys, std::max(r.lo, int64_t{mask.row_runs[2 * k]} * n),
                         std::min(r.hi, int64_t{mask.row_runs[2 * k + 1]} * n - 1));
  return seen;
}

int64_t count_visible_pairs(const MaskView& mask, const std::vector<PositionRun>& queries, int64_t seq_len) {
  const PositionRun all_keys{0, seq_len, 1};
  int64_t pairs = 0;
  for (const PositionRun& run : queries)
    for (int64_t t = 0; t < run.count; ++t)
      pairs += count_visible_keys(mask, run.start + t * run.stride, all_keys, seq_len);
  return pairs;
}

int RingPlan::compute_steps() const {
  int n = 0;
  for (const RingStep& s : steps_) n += s.source >= 0;
  return n;
}

}  // namespace ringattn
