#include "runtime/placement.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <set>

namespace ringattn {

int NodeMap::nodes() const { return static_cast<int>(std::set<int>(node_of_rank.begin(), node_of_rank.end()).size()); }

int NodeMap::local_rank(int rank) const {
  int index = 0;
  for (int r = 0; r < rank; ++r) index += node_of_rank[size_t(r)] == node_of_rank[size_t(rank)];
  return index;
}

int NodeMap::local_ranks(int rank) const {
  return static_cast<int>(std::count(node_of_rank.begin(), node_of_rank.end(), node_of_rank[size_t(rank)]));
}

NodeMap find_nodes(comm::Communicator& comm) { return NodeMap{comm.node_of_ranks()}; }

std::optional<ArgumentError> check_ulysses(int ulysses, int ranks, int64_t heads, int64_t kv_heads) {
  const std::string u = "{ulysses} " + std::to_string(ulysses);
  if (ulysses < 1) return ArgumentError("ulysses", u + " must be at least 1");
  if (ranks % ulysses != 0)
    return ArgumentError("ulysses", u + " does not divide the " + std::to_string(ranks) +
                                        " ranks: the ranks form groups of that many");
  if (heads % ulysses != 0)
    return ArgumentError("ulysses", u + " does not divide {heads} " + std::to_string(heads) +
                                        ": each rank of a group takes an equal share of the heads");
  if (kv_heads % ulysses != 0 && ulysses % kv_heads != 0)
    return ArgumentError("ulysses", u + " and {kv_heads} " + std::to_string(kv_heads) +
                                        ": one must be a multiple of the other, so that K/V heads are split or "
                                        "replicated evenly over a group");
  return std::nullopt;
}

UlyssesPlacement place_ulysses_groups(const std::vector<int>& node_of_rank, int ulysses) {
  const int P = static_cast<int>(node_of_rank.size());
  UlyssesPlacement p;
  // Nodes in the order of their least rank, each with its ranks in rank order.
  std::map<int, size_t> index;
  std::vector<std::vector<int>> nodes;
  for (int r = 0; r < P; ++r) {
    auto [it, fresh] = index.try_emplace(node_of_rank[size_t(r)], nodes.size());
    if (fresh) nodes.emplace_back();
    nodes[it->second].push_back(r);
  }
  std::string counts;
  for (const std::vector<int>& n : nodes) {
    p.node_local = p.node_local && n.size() % size_t(ulysses) == 0;
    counts += (counts.empty() ? "" : ", ") + std::to_string(n.size());
  }
  if (p.node_local) {
    for (const std::vector<int>& n : nodes) p.members.insert(p.members.end(), n.begin(), n.end());
    return p;
  }
  p.members.resize(size_t(P));
  for (int r = 0; r < P; ++r) p.members[size_t(r)] = r;
  p.note = "ulysses " + std::to_string(ulysses) + ": the " + std::to_string(nodes.size()) + " nodes hold " + counts +
           " ranks, not each a multiple of " + std::to_string(ulysses) +
           ", so the groups are consecutive ranks and some span nodes (their all-to-all crosses the link between "
           "nodes)";
  return p;
}

UlyssesGroups make_ulysses_groups(int rank, int ranks, const UlyssesPlacement& placement, int ulysses,
                                  const GroupSplit& split) {
  UlyssesGroups g;
  g.ulysses = ulysses;
  g.groups = ranks / ulysses;
  if (ulysses == 1) {  // the plain ring: no group communicator, the ring over every rank
    g.group = rank;
    return g;
  }
  g.placement = placement;
  const auto slot = std::find(placement.members.begin(), placement.members.end(), rank) - placement.members.begin();
  g.group = static_cast<int>(slot) / ulysses;
  g.member = static_cast<int>(slot) % ulysses;
  static std::atomic<bool> noted{false};
  if (!placement.note.empty() && rank == 0 && !noted.exchange(true))
    std::fprintf(stderr, "ringattn: note: %s\n", placement.note.c_str());
  for (int group = 0; group < g.groups; ++group)
    g.ring_ranks.push_back(placement.members[size_t(group * ulysses + g.member)]);
  g.group_comm = split(g.group, g.member);
  return g;
}

}  // namespace ringattn
