#include "runtime/shard_layout.hpp"

#include <algorithm>
#include <stdexcept>

#include "runtime/errors.hpp"

namespace ringattn {

const char* layout_name(LayoutKind kind) {
  switch (kind) {
    case LayoutKind::contiguous: return "contiguous";
    case LayoutKind::zigzag: return "zigzag";
    case LayoutKind::striped: return "striped";
  }
  return "?";
}

LayoutKind parse_layout(const std::string& name) {
  if (name == "contiguous") return LayoutKind::contiguous;
  if (name == "zigzag") return LayoutKind::zigzag;
  if (name == "striped") return LayoutKind::striped;
  throw ArgumentError("layout", "{layout} '" + name + "': expected contiguous, zigzag or striped");
}

ShardLayout::ShardLayout(LayoutKind kind, int64_t seq_len, int ranks, int ulysses, std::vector<int> members)
    : kind_(kind), seq_len_(seq_len), ranks_(ranks), ulysses_(ulysses) {
  if (ranks < 1) throw std::invalid_argument("ShardLayout: no ranks");
  if (ulysses < 1 || ranks % ulysses != 0)
    throw ArgumentError("ulysses", "{ulysses} " + std::to_string(ulysses) + " does not divide the " +
                                       std::to_string(ranks) + " ranks");
  if (seq_len < ranks)
    throw ArgumentError("seq_len", "{seq_len} " + std::to_string(seq_len) + " is smaller than the number of ranks " +
                                       std::to_string(ranks) + ": every rank needs at least one position");
  if (members.empty()) return;
  std::vector<int> slots(static_cast<size_t>(ranks), -1);
  bool identity = members.size() == static_cast<size_t>(ranks);
  for (size_t s = 0; s < members.size() && identity; ++s) {
    const int r = members[s];
    identity = r >= 0 && r < ranks && slots[static_cast<size_t>(r)] < 0;
    if (identity) slots[static_cast<size_t>(r)] = static_cast<int>(s);
  }
  if (!identity) throw std::invalid_argument("ShardLayout: the group placement is not a permutation of the ranks");
  if (std::is_sorted(members.begin(), members.end())) return;  // consecutive ranks after all
  members_ = std::move(members);
  slot_of_rank_ = std::move(slots);
}

int ShardLayout::member_rank(int group, int member) const {
  const int s = group * ulysses_ + member;
  return members_.empty() ? s : members_[static_cast<size_t>(s)];
}

int64_t ShardLayout::chunk_start(int64_t c, int64_t n) const {
  const int64_t base = seq_len_ / n, extra = seq_len_ % n;
  return c * base + std::min(c, extra);  // the first `extra` chunks are one longer
}

std::vector<PositionRun> ShardLayout::runs(int rank) const {
  if (ulysses_ == 1) return group_runs(slot(rank));
  // Member u's part of its group's rows, cut out of the group's runs.
  const std::vector<PositionRun> group = group_runs(group_of(rank));
  int64_t group_rows = 0;
  for (const PositionRun& r : group) group_rows += r.count;
  const int u = member_of(rank);
  const int64_t begin = member_begin(group_rows, u), end = member_begin(group_rows, u + 1);
  std::vector<PositionRun> out;
  int64_t offset = 0;
  for (const PositionRun& r : group) {
    const int64_t a = std::max(begin, offset), b = std::min(end, offset + r.count);
    if (b > a) out.push_back(PositionRun{r.start + (a - offset) * r.stride, b - a, r.stride});
    offset += r.count;
  }
  return out;
}

std::vector<PositionRun> ShardLayout::group_runs(int rank) const {
  const int64_t P = groups();
  switch (kind_) {
    case LayoutKind::contiguous: {
      const int64_t a = chunk_start(rank, P), b = chunk_start(rank + 1, P);
      return {PositionRun{a, b - a, 1}};
    }
    case LayoutKind::zigzag: {
      std::vector<PositionRun> out;
      for (int64_t c : {int64_t{rank}, 2 * P - 1 - rank}) {
        const int64_t a = chunk_start(c, 2 * P), b = chunk_start(c + 1, 2 * P);
        if (b > a) out.push_back(PositionRun{a, b - a, 1});
      }
      return out;
    }
    case LayoutKind::striped:
      return {PositionRun{rank, (seq_len_ - rank + P - 1) / P, P}};
  }
  return {};
}

int64_t ShardLayout::rows(int rank) const {
  int64_t n = 0;
  for (const PositionRun& r : runs(rank)) n += r.count;
  return n;
}

int64_t ShardLayout::max_rows() const {
  int64_t m = 0;
  for (int r = 0; r < ranks_; ++r) m = std::max(m, rows(r));
  return m;
}

std::vector<int64_t> ShardLayout::positions(int rank) const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(rows(rank)));
  for (const PositionRun& r : runs(rank))
    for (int64_t t = 0; t < r.count; ++t) out.push_back(r.start + t * r.stride);
  return out;
}

int64_t ShardLayout::position(int rank, int64_t local_row) const {
  for (const PositionRun& r : runs(rank)) {
    if (local_row < r.count) return r.start + local_row * r.stride;
    local_row -= r.count;
  }
  return -1;
}

ShardLayout::Location ShardLayout::locate(int64_t pos) const {
  const Location at = locate_in_group(pos);
  if (ulysses_ == 1) return {member_rank(at.rank, 0), at.row};
  int64_t group_rows = 0;
  for (const PositionRun& r : group_runs(at.rank)) group_rows += r.count;
  int u = ulysses_ - 1;
  while (member_begin(group_rows, u) > at.row) --u;
  return {member_rank(at.rank, u), at.row - member_begin(group_rows, u)};
}

ShardLayout::Location ShardLayout::locate_in_group(int64_t pos) const {
  const int64_t P = groups();
  if (kind_ == LayoutKind::striped) return {static_cast<int>(pos % P), pos / P};
  const int64_t n = kind_ == LayoutKind::zigzag ? 2 * P : P;
  // Chunk c holds [chunk_start(c), chunk_start(c + 1)); the first `extra` chunks are one longer.
  const int64_t base = seq_len_ / n, extra = seq_len_ % n;
  const int64_t long_span = extra * (base + 1);
  const int64_t c = pos < long_span ? pos / (base + 1) : extra + (pos - long_span) / base;
  const int64_t within = pos - chunk_start(c, n);
  if (kind_ == LayoutKind::contiguous) return {static_cast<int>(c), within};
  if (c < P) return {static_cast<int>(c), within};
  const int rank = static_cast<int>(2 * P - 1 - c);
  return {rank, (chunk_start(rank + 1, n) - chunk_start(rank, n)) + within};  // after the rank's first chunk
}

}  // namespace ringattn
