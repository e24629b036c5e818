// Where the ranks sit: the node of every rank, found once per session, and the groups of hybrid
// parallelism (docs/hybrid.md, --ulysses U) placed on the nodes.
//
// Groups. The P ranks form G = P/U groups of U ranks. By default a group is U ranks of one node,
// so the all-to-all stays on the fast intra-node link whatever order the launcher gave the ranks
// (round-robin placement included); this needs every node to hold a multiple of U ranks, and
// otherwise the groups are U consecutive ranks (some then span nodes: a note says so, once, on
// rank 0). Groups are numbered node by node (nodes in the order of their least rank), so the ring
// across them crosses nodes as few times as the placement allows; with one node, or consecutive
// ranks per node (Open MPI's default --map-by slot, Slurm's block distribution), group g is ranks
// gU .. gU + U - 1. ShardLayout holds the placement, so the layout, the check and the output
// files know every rank's rows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "ringattn/errors.hpp"

namespace ringattn {

// The node of every rank of a communicator: node_of_rank[r] is the same for ranks that share a
// node (the least rank there).
struct NodeMap {
  std::vector<int> node_of_rank;

  int nodes() const;                  // how many distinct nodes
  int local_rank(int rank) const;     // the rank's index among the ranks of its node
  int local_ranks(int rank) const;    // how many ranks its node runs
};

// Collective over `comm`: MPI's shared-memory split (Communicator::node_of_ranks).
NodeMap find_nodes(comm::Communicator& comm);

// The first problem with a degree U for P ranks and these heads: U < 1, U not dividing P or H,
// or Hkv neither a multiple nor a divisor of U. Empty when there is none.
std::optional<ArgumentError> check_ulysses(int ulysses, int ranks, int64_t heads, int64_t kv_heads);

// Which ranks form the groups.
struct UlyssesPlacement {
  std::vector<int> members;  // members[g U + u]: the rank of member u of group g
  bool node_local = true;    // every group lies in one node
  std::string note;          // why not, when not ("" otherwise)
};
// From the node of every rank (ids: equal for ranks that share a node): when every node holds a
// multiple of U ranks, each group is U ranks of one node in rank order, groups numbered node by
// node (nodes in the order of their least rank); otherwise groups of U consecutive ranks.
UlyssesPlacement place_ulysses_groups(const std::vector<int>& node_of_rank, int ulysses);

// This rank's group: its index and member index, the placement, the communicator of its group (U
// ranks, ordered by member) and the ranks of its ring (one per group, ordered by group).
struct UlyssesGroups {
  int ulysses = 1, groups = 1, group = 0, member = 0;
  UlyssesPlacement placement;
  std::unique_ptr<comm::Communicator> group_comm;
  std::vector<int> ring_ranks;
};
// This rank's groups among `ranks` ranks under `placement`; `split(color, key)` makes the group's
// communicator (collective: Communicator::split, or what the session wraps around it). U = 1: the
// plain ring, no group communicator and no call of split.
using GroupSplit = std::function<std::unique_ptr<comm::Communicator>(int color, int key)>;
UlyssesGroups make_ulysses_groups(int rank, int ranks, const UlyssesPlacement& placement, int ulysses,
                                  const GroupSplit& split);

}  // namespace ringattn
