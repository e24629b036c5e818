// Hybrid sequence parallelism (UlyssesAttention) under mpirun against the fp64 reference, forward
// (O, LSE) and backward (dQ, dK, dV), for every U that divides P (U = 2 and 4 at P = 4, U = 3 at
// P = 3): causal zigzag, window, documents and combined masks, every layout and both schedules,
// GQA with Hkv < U (replicated K/V heads) and Hkv > U, bf16. Each rank checks its own rows; and the
// whole result, gathered, equals that of --ulysses 1 (the plain ring) to fp32 rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "runtime/backend.hpp"
#include "runtime/errors.hpp"
#include "runtime/random_inputs.hpp"
#include "runtime/placement.hpp"
#include "runtime/ulysses_attention.hpp"
#include "tests/support/mask_variants.hpp"
#include "tests/support/sharded_reference.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {
namespace {

struct Case {
  int ulysses;
  LayoutKind layout = LayoutKind::zigzag;
  Schedule schedule = Schedule::direct;
  int mask = 1;
  int64_t L = 131, B = 1, H = 0, Hkv = 0, D = 16;  // H, Hkv 0: heads_for(U)
  DType dtype = DType::f32;
};

// Heads divisible by U: 6 (3 K/V heads) for U = 3, else 8 (4 K/V heads).
Case with_heads(Case c) {
  if (c.H == 0) c.H = c.ulysses % 3 == 0 ? 6 : 8;
  if (c.Hkv == 0) c.Hkv = c.H / 2;
  return c;
}

std::string describe(const Case& c, const Mask& m) {
  return "U=" + std::to_string(c.ulysses) + " " + layout_name(c.layout) + "/" + schedule_name(c.schedule) + "/" +
         m.describe() + "/" + dtype_name(c.dtype) + " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv);
}

std::vector<float> rows_of(RandomTensor t, const Case& c, int64_t width, const std::vector<int64_t>& pos) {
  return seeded_rows(23, t, c.B, c.L, width, pos, c.dtype);
}

// The outputs of one run, each rank's rows gathered into whole (B, L, width) tensors (small L).
struct Whole {
  std::vector<float> o, lse, dq, dk, dv;  // lse as (B, H, L)
};

// Rows (B, rows, width) of every rank, placed at their positions in (B, L, width).
std::vector<float> gather(comm::Communicator& comm, const std::vector<float>& mine, const std::vector<int64_t>& pos,
                          int64_t B, int64_t L, int64_t width) {
  const int P = comm.size();
  std::vector<int64_t> counts(static_cast<size_t>(P));
  int64_t n = int64_t(pos.size());
  comm.allgather(&n, counts.data(), sizeof n);
  std::vector<size_t> pos_bytes(static_cast<size_t>(P)), val_bytes(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    pos_bytes[size_t(r)] = sizeof(int64_t) * size_t(counts[size_t(r)]);
    val_bytes[size_t(r)] = sizeof(float) * size_t(B * counts[size_t(r)] * width);
  }
  std::vector<int64_t> all_pos(static_cast<size_t>(L));
  std::vector<float> all_val(size_t(B * L * width));
  comm.allgatherv(pos.data(), all_pos.data(), pos_bytes);
  comm.allgatherv(mine.data(), all_val.data(), val_bytes);
  std::vector<float> whole(size_t(B * L * width));
  int64_t first = 0;
  for (int r = 0; r < P; ++r) {
    const int64_t rows = counts[size_t(r)];
    const float* block = all_val.data() + size_t(B * first * width);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < rows; ++i)
        std::copy_n(block + size_t((b * rows + i) * width), width,
                    whole.data() + size_t((b * L + all_pos[size_t(first + i)]) * width));
    first += rows;
  }
  return whole;
}

// The nodes the tests place groups on: those RINGATTN_TEST_NODES lists (ctest registers a run on
// round-robin pretend nodes), else MPI's. Collective (the discovery runs either way).
std::vector<int> test_nodes(comm::Communicator& comm) {
  std::vector<int> nodes = find_nodes(comm).node_of_rank;
  if (const char* pretend = std::getenv("RINGATTN_TEST_NODES"); pretend && *pretend) {
    nodes.clear();
    for (const char* c = pretend; *c;) {
      char* end = nullptr;
      nodes.push_back(int(std::strtol(c, &end, 10)));
      c = *end == ',' ? end + 1 : end;
    }
  }
  return nodes;
}

// The hybrid of degree U over comm, its groups placed on test_nodes as a session places them.
std::unique_ptr<UlyssesAttention> make_hybrid(comm::Communicator& comm, AttentionBackend& backend, LayoutKind layout,
                                              int64_t L, const Mask& mask, const RingOptions& options, int U) {
  const UlyssesPlacement placement = U > 1 ? place_ulysses_groups(test_nodes(comm), U) : UlyssesPlacement{};
  auto groups = std::make_shared<UlyssesGroups>(make_ulysses_groups(
      comm.rank(), comm.size(), placement, U, [&](int color, int key) { return comm.split(color, key); }));
  return std::make_unique<UlyssesAttention>(comm, backend, layout, L, mask, options, groups);
}

// Runs the hybrid and checks this rank's rows against fp64 (tolerance as the ring's tests: a few
// times the error of plain fp32 arithmetic); returns the gathered outputs.
Whole run_and_check(comm::Communicator& comm, const Case& given) {
  const Case c = with_heads(given);
  const Mask mask = mask_variant(c.mask, c.L);
  SCOPED_TRACE(describe(c, mask) + " P=" + std::to_string(comm.size()) + " rank " + std::to_string(comm.rank()));
  const kernels::AttentionDims dims{c.B, c.H, c.Hkv, c.D, 1.0f / std::sqrt(float(c.D))};
  auto backend = make_cpu_backend(1);
  const auto hybrid = make_hybrid(comm, *backend, c.layout, c.L, mask, RingOptions{dims, c.dtype, c.schedule}, c.ulysses);
  UlyssesAttention& attention = *hybrid;
  const std::vector<int64_t>& pos = attention.positions();
  const int64_t rows = attention.rows();
  const auto q = rows_of(RandomTensor::q, c, c.H * c.D, pos), k = rows_of(RandomTensor::k, c, c.Hkv * c.D, pos);
  const auto v = rows_of(RandomTensor::v, c, c.Hkv * c.D, pos), d = rows_of(RandomTensor::dout, c, c.H * c.D, pos);
  const auto qs = stored(q, c.dtype), ks = stored(k, c.dtype), vs = stored(v, c.dtype), ds = stored(d, c.dtype);
  std::vector<float> o(q.size()), lse(size_t(c.B * c.H * rows)), dq(q.size()), dk(k.size()), dv(v.size());
  attention.forward(qs.data(), ks.data(), vs.data(), o.data(), lse.data());
  attention.backward(qs.data(), ks.data(), vs.data(), o.data(), lse.data(), ds.data(), dq.data(), dk.data(), dv.data(),
                     attention.last_forward());

  // The all-to-all traffic of the backward pass: dO in (H/U heads of this rank's rows to each
  // other member), dQ, dK and dV back (the other members' rows of this member's heads). A K/V head
  // replicated over U/Hkv members comes back from each copy, so the count includes the copies.
  const int64_t U = c.ulysses, kv_slice = c.Hkv >= U ? c.Hkv / U : 1;
  const int64_t group_rows = attention.group_layout().rows(attention.group());
  const uint64_t expected = uint64_t(dtype_bytes(c.dtype) * c.B * rows * c.D * (c.H / U) * (U - 1) +
                                     4 * c.B * c.D * (group_rows - rows) * (c.H / U + 2 * kv_slice));
  EXPECT_EQ(attention.a2a_bytes_sent(), expected);

  ShardedReference(dims, mask, c.L, 23, c.dtype).check(pos, o, lse, dq, dk, dv);

  // LSE (B, H, rows) gathered as rows of width B*H would interleave batches: transpose to
  // (rows, B*H) first, gather with B = 1, transpose back.
  std::vector<float> lse_rows(lse.size());
  for (int64_t bh = 0; bh < c.B * c.H; ++bh)
    for (int64_t r = 0; r < rows; ++r) lse_rows[size_t(r * c.B * c.H + bh)] = lse[size_t(bh * rows + r)];
  const std::vector<float> lse_t = gather(comm, lse_rows, pos, 1, c.L, c.B * c.H);
  Whole w;
  w.lse.resize(lse_t.size());
  for (int64_t i = 0; i < c.L; ++i)
    for (int64_t bh = 0; bh < c.B * c.H; ++bh) w.lse[size_t(bh * c.L + i)] = lse_t[size_t(i * c.B * c.H + bh)];
  w.o = gather(comm, o, pos, c.B, c.L, c.H * c.D);
  w.dq = gather(comm, dq, pos, c.B, c.L, c.H * c.D);
  w.dk = gather(comm, dk, pos, c.B, c.L, c.Hkv * c.D);
  w.dv = gather(comm, dv, pos, c.B, c.L, c.Hkv * c.D);
  return w;
}

// The hybrid's result equals the ring's (--ulysses 1) to fp32 rounding: the same tolerance the
// fp64 checks allow, measured between the two.
void expect_equal_to_ring(comm::Communicator& comm, const Case& given) {
  const Case c = with_heads(given);
  Case ring = c;
  ring.ulysses = 1;
  const Whole a = run_and_check(comm, c), b = run_and_check(comm, ring);
  const char* names[] = {"o", "lse", "dq", "dk", "dv"};
  const std::vector<float>* x[] = {&a.o, &a.lse, &a.dq, &a.dk, &a.dv};
  const std::vector<float>* y[] = {&b.o, &b.lse, &b.dq, &b.dk, &b.dv};
  for (int i = 0; i < 5; ++i) {
    double scale = 0;
    for (float e : *y[i]) scale = std::max(scale, double(std::fabs(e)));
    EXPECT_LE(max_abs_diff(*x[i], *y[i]), 1e-5 * std::max(1.0, scale))
        << names[i] << " at U=" << c.ulysses << " differs from --ulysses 1";
  }
}

class UlyssesMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
    comm->set_timeout(60.0);
  }
  // Every U > 1 that divides P (up to 4); 1 alone on one rank.
  std::vector<int> ulysses_degrees() const {
    std::vector<int> u;
    for (int d = 2; d <= std::min(comm->size(), 4); ++d)
      if (comm->size() % d == 0) u.push_back(d);
    if (u.empty()) u.push_back(1);
    return u;
  }
  std::unique_ptr<comm::Communicator> comm;
};

TEST_F(UlyssesMpi, GroupsPartitionTheSequence) {
  for (int U : ulysses_degrees()) {
    const Mask mask;
    const kernels::AttentionDims dims{1, 12, 12, 16, 0.25f};
    auto backend = make_cpu_backend(1);
    const auto hybrid = make_hybrid(*comm, *backend, LayoutKind::zigzag, 101, mask, RingOptions{dims}, U);
    UlyssesAttention& a = *hybrid;
    EXPECT_EQ(a.group_comm() ? a.group_comm()->size() : 1, U);
    EXPECT_EQ(a.ring().plan().steps().size(), size_t(comm->size() / U));
    EXPECT_EQ(a.ring().rank_at(a.group()), comm->rank());
    EXPECT_EQ(a.layout().group_of(comm->rank()), a.group());
    EXPECT_EQ(a.layout().member_of(comm->rank()), a.member());
    // Every position is held by exactly one rank.
    const std::vector<float> whole = gather(*comm, std::vector<float>(a.positions().begin(), a.positions().end()),
                                              a.positions(), 1, 101, 1);
    for (int64_t t = 0; t < 101; ++t) EXPECT_EQ(whole[size_t(t)], float(t));
  }
}

// A group is U ranks of one node whenever every node holds a multiple of U ranks (whatever the
// ranks' order), else U consecutive ranks. Under RINGATTN_TEST_NODES (registered with
// round-robin pretend nodes) every test of this file runs on such a placement.
TEST_F(UlyssesMpi, GroupsAreRanksOfOneNode) {
  const std::vector<int> nodes = test_nodes(*comm);
  for (int U : ulysses_degrees()) {
    if (U == 1) continue;
    const Mask mask;
    const kernels::AttentionDims dims{1, 12, 12, 16, 0.25f};
    auto backend = make_cpu_backend(1);
    const auto hybrid = make_hybrid(*comm, *backend, LayoutKind::zigzag, 101, mask, RingOptions{dims}, U);
    UlyssesAttention& a = *hybrid;
    // The group's members, by member index, and their nodes.
    std::vector<int> members(static_cast<size_t>(U));
    const int me = comm->rank();
    a.group_comm()->allgather(&me, members.data(), sizeof me);
    bool one_node = true;
    for (int u = 0; u < U; ++u) {
      EXPECT_EQ(members[size_t(u)], a.layout().member_rank(a.group(), u));
      one_node = one_node && nodes[size_t(members[size_t(u)])] == nodes[size_t(me)];
    }
    std::vector<int> per_node(static_cast<size_t>(comm->size()), 0);
    for (int n : nodes) ++per_node[size_t(std::find(nodes.begin(), nodes.end(), n) - nodes.begin())];
    const bool fits = std::all_of(per_node.begin(), per_node.end(), [&](int c) { return c % U == 0; });
    EXPECT_EQ(a.placement().node_local, fits) << "U=" << U;
    if (fits) EXPECT_TRUE(one_node) << "U=" << U << ": rank " << me << "'s group spans nodes";
    else EXPECT_EQ(members[0], a.group() * U) << "U=" << U << ": the fallback is consecutive ranks";
  }
}

TEST(UlyssesPlacement, NodeLocalGroupsOrConsecutiveRanks) {
  // Round-robin over two nodes: groups {0,2}, {4,6} on node 0, then {1,3}, {5,7} on node 1.
  UlyssesPlacement p = place_ulysses_groups({0, 1, 0, 1, 0, 1, 0, 1}, 2);
  EXPECT_TRUE(p.node_local);
  EXPECT_EQ(p.members, (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_TRUE(p.note.empty());
  // Block placement (and one node) is consecutive ranks.
  EXPECT_EQ(place_ulysses_groups({0, 0, 0, 0, 4, 4, 4, 4}, 4).members, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(place_ulysses_groups({7, 7, 7}, 3).members, (std::vector<int>{0, 1, 2}));
  // Nodes of 3 and 1 ranks cannot hold groups of 2: consecutive ranks, and a note saying why.
  p = place_ulysses_groups({0, 0, 1, 0}, 2);
  EXPECT_FALSE(p.node_local);
  EXPECT_EQ(p.members, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_NE(p.note.find("hold 3, 1 ranks"), std::string::npos) << p.note;
  // Uneven nodes that each hold whole groups: node by node (node ids are only labels).
  EXPECT_EQ(place_ulysses_groups({5, 2, 5, 2, 5, 5}, 2).members, (std::vector<int>{0, 2, 4, 5, 1, 3}));
  // The layout over such a placement: every position held once, by the rank locate() names.
  const ShardLayout layout(LayoutKind::zigzag, 37, 6, 2, {0, 2, 4, 5, 1, 3});
  std::vector<int> holder(37, -1);
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(layout.member_rank(layout.group_of(r), layout.member_of(r)), r);
    const std::vector<int64_t> pos = layout.positions(r);
    for (size_t i = 0; i < pos.size(); ++i) {
      EXPECT_EQ(holder[size_t(pos[i])], -1);
      holder[size_t(pos[i])] = r;
      const ShardLayout::Location at = layout.locate(pos[i]);
      EXPECT_EQ(at.rank, r);
      EXPECT_EQ(at.row, int64_t(i));
    }
  }
  EXPECT_EQ(std::count(holder.begin(), holder.end(), -1), 0);
  // Rank 1 is member 0 of group 2: the rows consecutive placement gives rank 4.
  EXPECT_EQ(layout.positions(1), ShardLayout(LayoutKind::zigzag, 37, 6, 2).positions(4));
}

TEST_F(UlyssesMpi, MasksAndLayoutsMatchFp64AndTheRing) {
  for (int U : ulysses_degrees()) {
    for (int m : {1, 2, 5, 7}) expect_equal_to_ring(*comm, Case{U, LayoutKind::zigzag, Schedule::direct, m});
    for (int m : {4, 8}) run_and_check(*comm, Case{U, LayoutKind::zigzag, Schedule::direct, m});
    for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::striped})
      run_and_check(*comm, Case{U, layout, Schedule::ring, 3});
    Case batch{U, LayoutKind::zigzag, Schedule::ring, 0};
    batch.B = 2;
    run_and_check(*comm, batch);
  }
}

TEST_F(UlyssesMpi, GroupedQueryAttentionReplicatesKeyValueHeads) {
  for (int U : ulysses_degrees()) {
    const int64_t H = with_heads(Case{U}).H;
    for (int64_t Hkv = 1; Hkv <= H; ++Hkv) {
      if (H % Hkv != 0 || (Hkv % U != 0 && U % Hkv != 0)) continue;
      Case c{U, LayoutKind::zigzag, Schedule::direct, 1};
      c.Hkv = Hkv;
      if (Hkv < U)  // replicated heads: also against the ring
        expect_equal_to_ring(*comm, c);
      else
        run_and_check(*comm, c);
    }
  }
}

TEST_F(UlyssesMpi, Bf16AndOneRowPerMember) {
  for (int U : ulysses_degrees()) {
    Case c{U, LayoutKind::zigzag, Schedule::direct, 1};
    c.dtype = DType::bf16;
    run_and_check(*comm, c);
    Case tiny{U, LayoutKind::striped, Schedule::ring, 1};
    tiny.L = comm->size();  // one position per rank
    tiny.Hkv = 1;
    run_and_check(*comm, tiny);
  }
}

// A backward without the forward's handle (or with a stale one) exchanges its tensors again:
// the same result as with the handle.
TEST_F(UlyssesMpi, BackwardWithoutTheForwardsTensors) {
  const int U = ulysses_degrees().back();
  const Mask mask = mask_variant(1, 97);
  const kernels::AttentionDims dims{1, 12, U, 16, 0.25f};  // one K/V head per member
  Case c{U};
  c.L = 97, c.B = 1, c.H = 12, c.Hkv = U;
  auto backend = make_cpu_backend(1);
  const auto hybrid = make_hybrid(*comm, *backend, LayoutKind::zigzag, c.L, mask, RingOptions{dims}, U);
  UlyssesAttention& a = *hybrid;
  const auto& pos = a.positions();
  auto q = rows_of(RandomTensor::q, c, 12 * 16, pos), k = rows_of(RandomTensor::k, c, U * 16, pos);
  auto v = rows_of(RandomTensor::v, c, U * 16, pos), d = rows_of(RandomTensor::dout, c, 12 * 16, pos);
  std::vector<float> o(q.size()), lse(size_t(12 * a.rows())), dq1(q.size()), dk1(k.size()), dv1(v.size());
  a.forward(q.data(), k.data(), v.data(), o.data(), lse.data());
  const uint64_t saved = a.last_forward();
  a.backward(q.data(), k.data(), v.data(), o.data(), lse.data(), d.data(), dq1.data(), dk1.data(), dv1.data(), saved);
  std::vector<float> q2 = q, k2 = k, v2 = v, o2 = o, lse2 = lse, dq2(q.size()), dk2(k.size()), dv2(v.size());
  a.backward(q2.data(), k2.data(), v2.data(), o2.data(), lse2.data(), d.data(), dq2.data(), dk2.data(), dv2.data());
  EXPECT_EQ(dq1, dq2);
  EXPECT_EQ(dk1, dk2);
  EXPECT_EQ(dv1, dv2);
  // The handle of a forward whose copies a later exchange replaced is stale: exchanged again too.
  std::vector<float> dq3(q.size()), dk3(k.size()), dv3(v.size());
  a.backward(q2.data(), k2.data(), v2.data(), o2.data(), lse2.data(), d.data(), dq3.data(), dk3.data(), dv3.data(),
             saved);
  EXPECT_EQ(dq1, dq3);
}

TEST_F(UlyssesMpi, BadDegreesAreArgumentErrorsNamingBothValues) {
  auto message = [](int U, int P, int64_t H, int64_t Hkv) {
    const std::optional<ArgumentError> e = check_ulysses(U, P, H, Hkv);
    EXPECT_TRUE(!e || e->argument() == "ulysses");
    return e ? std::string(e->what()) : std::string();
  };
  EXPECT_NE(message(3, 4, 12, 4).find("ulysses 3"), std::string::npos);
  EXPECT_NE(message(3, 4, 12, 4).find("4 ranks"), std::string::npos);
  EXPECT_NE(message(4, 4, 6, 2).find("heads 6"), std::string::npos);
  EXPECT_NE(message(4, 8, 12, 6).find("kv_heads 6"), std::string::npos);
  EXPECT_NE(message(0, 4, 12, 4).find("ulysses 0"), std::string::npos);
  EXPECT_EQ(message(4, 8, 12, 2), "");
  EXPECT_EQ(message(2, 4, 12, 6), "");
}

}  // namespace
}  // namespace ringattn::testing
