// Hybrid sequence parallelism (UlyssesAttention) under mpirun against the fp64 reference, forward
// (O, LSE) and backward (dQ, dK, dV), for every U that divides P (U = 2 and 4 at P = 4, U = 3 at
// P = 3): causal zigzag, window, documents and combined masks, every layout and both schedules,
// GQA with Hkv < U (replicated K/V heads) and Hkv > U, bf16. Each rank checks its own rows; and the
// whole result, gathered, equals that of --ulysses 1 (the plain ring) to fp32 rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "kernels/reference.hpp"
#include "runtime/backend.hpp"
#include "runtime/errors.hpp"
#include "runtime/random_inputs.hpp"
#include "runtime/ulysses_attention.hpp"
#include "tests/support/mask_variants.hpp"
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
  std::vector<float> x(size_t(c.B * int64_t(pos.size()) * width));
  random_rows(x.data(), 23, t, c.B, c.L, width, pos.data(), int64_t(pos.size()));
  return c.dtype == DType::bf16 ? round_to_bf16(x) : x;
}

std::vector<uint8_t> stored(const std::vector<float>& x, DType dtype) {
  std::vector<uint8_t> b;
  if (dtype == DType::f32) {
    b.resize(x.size() * 4);
    std::memcpy(b.data(), x.data(), b.size());
  } else {
    const std::vector<bf16_bits> h = to_bf16(x);
    b.resize(h.size() * 2);
    std::memcpy(b.data(), h.data(), b.size());
  }
  return b;
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

// Runs the hybrid and checks this rank's rows against fp64 (tolerance as the ring's tests: a few
// times the error of plain fp32 arithmetic); returns the gathered outputs.
Whole run_and_check(comm::Communicator& comm, const Case& given) {
  const Case c = with_heads(given);
  const Mask mask = mask_variant(c.mask, c.L);
  const MaskView mv = mask.view();
  SCOPED_TRACE(describe(c, mask) + " P=" + std::to_string(comm.size()) + " rank " + std::to_string(comm.rank()));
  const kernels::AttentionDims dims{c.B, c.H, c.Hkv, c.D, 1.0f / std::sqrt(float(c.D))};
  auto backend = make_cpu_backend(1);
  UlyssesAttention attention(comm, *backend, c.layout, c.L, mask, RingOptions{dims, c.dtype, c.schedule}, c.ulysses);
  const std::vector<int64_t>& pos = attention.positions();
  const int64_t rows = attention.rows();
  const auto q = rows_of(RandomTensor::q, c, c.H * c.D, pos), k = rows_of(RandomTensor::k, c, c.Hkv * c.D, pos);
  const auto v = rows_of(RandomTensor::v, c, c.Hkv * c.D, pos), d = rows_of(RandomTensor::dout, c, c.H * c.D, pos);
  const auto qs = stored(q, c.dtype), ks = stored(k, c.dtype), vs = stored(v, c.dtype), ds = stored(d, c.dtype);
  std::vector<float> o(q.size()), lse(size_t(c.B * c.H * rows)), dq(q.size()), dk(k.size()), dv(v.size());
  attention.forward(qs.data(), ks.data(), vs.data(), o.data(), lse.data());
  attention.backward(qs.data(), ks.data(), vs.data(), o.data(), lse.data(), ds.data(), dq.data(), dk.data(), dv.data());

  // The all-to-all traffic of the backward pass: dO in (H/U heads of this rank's rows to each
  // other member), dQ, dK and dV back (the other members' rows of this member's heads). A K/V head
  // replicated over U/Hkv members comes back from each copy, so the count includes the copies.
  const int64_t U = c.ulysses, kv_slice = c.Hkv >= U ? c.Hkv / U : 1;
  const int64_t group_rows = attention.group_layout().rows(attention.group());
  const uint64_t expected = uint64_t(dtype_bytes(c.dtype) * c.B * rows * c.D * (c.H / U) * (U - 1) +
                                     4 * c.B * c.D * (group_rows - rows) * (c.H / U + 2 * kv_slice));
  EXPECT_EQ(attention.a2a_bytes_sent(), expected);

  // References over the whole (small) sequence.
  const std::vector<int64_t> all = iota_positions(c.L);
  const auto qa = rows_of(RandomTensor::q, c, c.H * c.D, all), ka = rows_of(RandomTensor::k, c, c.Hkv * c.D, all);
  const auto va = rows_of(RandomTensor::v, c, c.Hkv * c.D, all), da = rows_of(RandomTensor::dout, c, c.H * c.D, all);
  std::vector<double> ro(qa.size()), rl(size_t(c.B * c.H * c.L)), rd(rl.size());
  kernels::reference_forward(dims, qa.data(), all.data(), c.L, ka.data(), va.data(), all.data(), c.L, mv, ro.data(),
                             rl.data());
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t i = 0; i < c.L; ++i)
      for (int64_t h = 0; h < c.H; ++h) {
        double s = 0;
        for (int64_t e = 0; e < c.D; ++e) {
          const size_t x = size_t(((b * c.L + i) * c.H + h) * c.D + e);
          s += ro[x] * da[x];
        }
        rd[size_t((b * c.H + h) * c.L + i)] = s;
      }
  std::vector<double> rdq(qa.size(), 0.0), rdk(ka.size(), 0.0), rdv(ka.size(), 0.0);
  kernels::reference_backward(dims, qa.data(), all.data(), c.L, ka.data(), va.data(), all.data(), c.L, da.data(),
                              rl.data(), rd.data(), mv, rdq.data(), rdk.data(), rdv.data());
  std::vector<float> no(qa.size()), nl(rl.size()), nd(rl.size());
  kernels::naive_forward_fp32(dims, qa.data(), all.data(), c.L, ka.data(), va.data(), all.data(), c.L, mv, no.data(),
                              nl.data());
  kernels::attention_delta(dims, c.L, no.data(), da.data(), DType::f32, nd.data());
  std::vector<float> ndq(qa.size(), 0.0f), ndk(ka.size(), 0.0f), ndv(ka.size(), 0.0f);
  // bf16 inputs on the bf16 dot-product kernels round P and dS to bf16 (FlashAttention-2's
  // contract), and so does the baseline they are judged against.
  kernels::naive_backward_fp32(dims, qa.data(), all.data(), c.L, ka.data(), va.data(), all.data(), c.L, da.data(),
                               nl.data(), nd.data(), mv, ndq.data(), ndk.data(), ndv.data(),
                               kernels::cpu_same_precision(c.dtype));

  auto mine = [&](const auto& full, int64_t width) {
    std::vector<double> out(size_t(c.B * rows * width));
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < width; ++e)
          out[size_t((b * rows + r) * width + e)] = full[size_t((b * c.L + pos[size_t(r)]) * width + e)];
    return out;
  };
  auto mine_lse = [&](const auto& full) {
    std::vector<double> out(size_t(c.B * c.H * rows));
    for (int64_t bh = 0; bh < c.B * c.H; ++bh)
      for (int64_t r = 0; r < rows; ++r) out[size_t(bh * rows + r)] = full[size_t(bh * c.L + pos[size_t(r)])];
    return out;
  };
  auto check = [&](const char* what, const std::vector<float>& got, const std::vector<double>& ref,
                   const std::vector<double>& naive) {
    const double err = max_abs_diff(got, ref), base = max_abs_diff(naive, ref);
    EXPECT_LE(err, 4.0 * base + 2e-6) << what << ": error " << err << " vs fp32 naive " << base;
  };
  check("o", o, mine(ro, c.H * c.D), mine(no, c.H * c.D));
  check("lse", lse, mine_lse(rl), mine_lse(nl));
  check("dq", dq, mine(rdq, c.H * c.D), mine(ndq, c.H * c.D));
  check("dk", dk, mine(rdk, c.Hkv * c.D), mine(ndk, c.Hkv * c.D));
  check("dv", dv, mine(rdv, c.Hkv * c.D), mine(ndv, c.Hkv * c.D));

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
    UlyssesAttention a(*comm, *backend, LayoutKind::zigzag, 101, mask, RingOptions{dims}, U);
    EXPECT_EQ(a.group_comm() ? a.group_comm()->size() : 1, U);
    EXPECT_EQ(a.ring_comm().size(), comm->size() / U);
    EXPECT_EQ(a.ring().plan().steps().size(), size_t(comm->size() / U));
    // Every position is held by exactly one rank.
    const std::vector<float> whole = gather(*comm, std::vector<float>(a.positions().begin(), a.positions().end()),
                                              a.positions(), 1, 101, 1);
    for (int64_t t = 0; t < 101; ++t) EXPECT_EQ(whole[size_t(t)], float(t));
  }
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

// The backward of tensors that are not the last forward's exchanges them again: same result.
TEST_F(UlyssesMpi, BackwardWithoutTheForwardsTensors) {
  const int U = ulysses_degrees().back();
  const Mask mask = mask_variant(1, 97);
  const kernels::AttentionDims dims{1, 12, U, 16, 0.25f};  // one K/V head per member
  Case c{U};
  c.L = 97, c.B = 1, c.H = 12, c.Hkv = U;
  auto backend = make_cpu_backend(1);
  UlyssesAttention a(*comm, *backend, LayoutKind::zigzag, c.L, mask, RingOptions{dims}, U);
  const auto& pos = a.positions();
  auto q = rows_of(RandomTensor::q, c, 12 * 16, pos), k = rows_of(RandomTensor::k, c, U * 16, pos);
  auto v = rows_of(RandomTensor::v, c, U * 16, pos), d = rows_of(RandomTensor::dout, c, 12 * 16, pos);
  std::vector<float> o(q.size()), lse(size_t(12 * a.rows())), dq1(q.size()), dk1(k.size()), dv1(v.size());
  a.forward(q.data(), k.data(), v.data(), o.data(), lse.data());
  a.backward(q.data(), k.data(), v.data(), o.data(), lse.data(), d.data(), dq1.data(), dk1.data(), dv1.data());
  std::vector<float> q2 = q, k2 = k, v2 = v, o2 = o, lse2 = lse, dq2(q.size()), dk2(k.size()), dv2(v.size());
  a.backward(q2.data(), k2.data(), v2.data(), o2.data(), lse2.data(), d.data(), dq2.data(), dk2.data(), dv2.data());
  EXPECT_EQ(dq1, dq2);
  EXPECT_EQ(dk1, dk2);
  EXPECT_EQ(dv1, dv2);
}

TEST_F(UlyssesMpi, BadDegreesAreUsageErrorsNamingBothValues) {
  auto message = [](int U, int P, int64_t H, int64_t Hkv) {
    try {
      check_ulysses(U, P, H, Hkv);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(3, 4, 12, 4).find("--ulysses 3"), std::string::npos);
  EXPECT_NE(message(3, 4, 12, 4).find("4 ranks"), std::string::npos);
  EXPECT_NE(message(4, 4, 6, 2).find("6 heads"), std::string::npos);
  EXPECT_NE(message(4, 8, 12, 6).find("--kv-heads 6"), std::string::npos);
  EXPECT_NE(message(0, 4, 12, 4).find("--ulysses 0"), std::string::npos);
  EXPECT_EQ(message(4, 8, 12, 2), "");
  EXPECT_EQ(message(2, 4, 12, 6), "");
}

}  // namespace
}  // namespace ringattn::testing
