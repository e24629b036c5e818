// Prefill and decode against the sharded KV cache under mpirun (P = 1..4), every output's O and
// LSE against fp64 attention over the whole sequence under the error rule: GQA and MQA, causal
// windows, a batch of sequences of different lengths, chunked prefill by both methods and the
// rule's choice, speculative tokens, interleaved placement; and the bad inputs, each an
// ArgumentError naming its argument on every rank with the cache unchanged.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/error_rule.hpp"
#include "kernels/mask/mask.hpp"
#include "kernels/reference.hpp"
#include "runtime/inference/decode.hpp"
#include "runtime/inference/prefill.hpp"
#include "runtime/session.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn::testing {
namespace {

using inference::CacheShape;
using inference::DecodeRequest;
using inference::KVCache;
using inference::PrefillMethod;
using inference::PrefillRequest;

// The session on the environment's backend and communicator (RINGATTN_TEST_BACKEND,
// RINGATTN_TEST_COMM; default cpu and mpi): the CUDA runs are the emulated builds' tests.
std::unique_ptr<Session> open_session() {
  SessionOptions options;
  options.context.threads = 1;
  options.context.timeout_s = 30.0;
  if (const char* b = std::getenv("RINGATTN_TEST_BACKEND")) options.context.backend = b;
  if (const char* c = std::getenv("RINGATTN_TEST_COMM")) options.context.comm = c;
  auto session = std::make_unique<Session>(MPI_COMM_WORLD, options);
  EXPECT_EQ(std::string(session->backend().name()), options.context.backend);  // the kernels run there
  return session;
}

// Host bytes in the backend's memory (the calls take pointers there), and floats back.
DeviceBuffer on_backend(AttentionBackend& backend, const void* host, size_t bytes) {
  DeviceBuffer b(backend, bytes);
  if (bytes) backend.upload(b.data(), host, bytes);
  return b;
}
std::vector<float> to_host(AttentionBackend& backend, const DeviceBuffer& b) {
  std::vector<float> out(b.bytes() / sizeof(float));
  if (!out.empty()) backend.download(out.data(), b.data(), b.bytes());
  return out;
}

// Every token's q, k, v, the same on every rank (the test's oracle needs them; the ranks pass
// only what the interface says they hold).
struct Tokens {
  int64_t H, Hkv, D;
  DType dtype;
  uint64_t seed;
  std::vector<float> q(int64_t seq, int64_t pos) const { return make(seq, pos, 0, H); }
  std::vector<float> k(int64_t seq, int64_t pos) const { return make(seq, pos, 1, Hkv); }
  std::vector<float> v(int64_t seq, int64_t pos) const { return make(seq, pos, 2, Hkv); }
  std::vector<float> make(int64_t seq, int64_t pos, int which, int64_t heads) const {
    std::vector<float> x = random_vector(size_t(heads * D), seed + uint64_t(seq * 1000003 + pos * 7 + which), 1.0f);
    return dtype == DType::bf16 ? round_to_bf16(x) : x;
  }
};

// Rows of the given positions, concatenated ((rows, heads, D) per sequence), in the test's dtype.
struct Packed {
  std::vector<float> f32;
  std::vector<bf16_bits> b16;
  const void* data(DType t) const { return t == DType::bf16 ? static_cast<const void*>(b16.data()) : f32.data(); }
  size_t bytes(DType t) const { return f32.size() * size_t(dtype_bytes(t)); }
  DeviceBuffer on(AttentionBackend& backend, DType t) const { return on_backend(backend, data(t), bytes(t)); }
};
Packed pack(const std::vector<std::vector<float>>& rows, DType dtype) {
  Packed p;
  for (const auto& r : rows) p.f32.insert(p.f32.end(), r.begin(), r.end());
  if (dtype == DType::bf16) p.b16 = to_bf16(p.f32);
  return p;
}

// Checks o (rows, H, D) and lse (H, rows) of sequence `seq`'s queries at q_pos against fp64
// attention over keys 0..max(q_pos), causal with the window.
void expect_exact(const Tokens& t, int64_t seq, const std::vector<int64_t>& q_pos, const float* o, const float* lse,
                  int64_t window_left, const std::string& what,
                  kernels::SamePrecision precision = kernels::SamePrecision::fp32()) {
  const int64_t n = int64_t(q_pos.size()), keys = *std::max_element(q_pos.begin(), q_pos.end()) + 1;
  std::vector<float> q, k, v;
  for (int64_t p : q_pos) {
    auto x = t.q(seq, p);
    q.insert(q.end(), x.begin(), x.end());
  }
  std::vector<int64_t> k_pos(static_cast<size_t>(keys));
  for (int64_t j = 0; j < keys; ++j) {
    k_pos[size_t(j)] = j;
    auto a = t.k(seq, j), b = t.v(seq, j);
    k.insert(k.end(), a.begin(), a.end());
    v.insert(v.end(), b.begin(), b.end());
  }
  Mask mask;
  mask.causal = true;
  mask.window_left = window_left;
  const kernels::AttentionDims dims{1, t.H, t.Hkv, t.D, 1.0f / std::sqrt(float(t.D))};
  std::vector<double> ro(size_t(n * t.H * t.D)), rl(size_t(n * t.H));
  std::vector<float> so(ro.size()), sl(rl.size());
  kernels::reference_forward(dims, q.data(), q_pos.data(), n, k.data(), v.data(), k_pos.data(), keys, mask.view(),
                             ro.data(), rl.data());
  kernels::naive_forward_fp32(dims, q.data(), q_pos.data(), n, k.data(), v.data(), k_pos.data(), keys, mask.view(),
                              so.data(), sl.data(), precision);
  kernels::TensorError eo, el;
  for (size_t i = 0; i < ro.size(); ++i) eo.add(o[i], so[i], ro[i]);
  for (size_t i = 0; i < rl.size(); ++i) el.add(lse[i], sl[i], rl[i]);
  EXPECT_TRUE(eo.passed()) << what << ": O error " << eo.error << " bound " << eo.bound();
  EXPECT_TRUE(el.passed()) << what << ": LSE error " << el.error << " bound " << el.bound();
}

struct Scenario {
  const char* name;
  int64_t H, Hkv, D;
  DType dtype;
  int64_t window_left;
  int64_t interleave;
  std::vector<int64_t> prompt;    // per sequence: its prompt length (different lengths in one batch)
  PrefillMethod first, second;    // the two chunks' methods (the prompt split in two)
  int64_t steps, tokens;          // decode steps of `tokens` new tokens per sequence
};

class Inference : public ::testing::TestWithParam<Scenario> {};

TEST_P(Inference, MatchesFp64OverTheWholeSequence) {
  const Scenario& sc = GetParam();
  auto session = open_session();
  const int P = session->size();
  const Tokens t{sc.H, sc.Hkv, sc.D, sc.dtype, 40};
  const int64_t B = int64_t(sc.prompt.size());
  int64_t longest = *std::max_element(sc.prompt.begin(), sc.prompt.end()) + sc.steps * sc.tokens;
  const int64_t capacity = longest / P + 2 * sc.interleave + 64;
  KVCache cache(session->backend(), session->rank(), P, CacheShape{B, sc.Hkv, sc.D, capacity, sc.interleave, sc.dtype});
  const float scale = 1.0f / std::sqrt(float(sc.D));

  // Each sequence's prompt in two chunks (a prefill, then a chunked prefill on top of it).
  for (int64_t s = 0; s < B; ++s) {
    const int64_t split = sc.prompt[size_t(s)] / 3 + 5;
    for (int chunk = 0; chunk < 2; ++chunk) {
      const int64_t begin = chunk == 0 ? 0 : split, end = chunk == 0 ? split : sc.prompt[size_t(s)];
      PrefillRequest r;
      r.heads = sc.H, r.tokens = end - begin, r.scale = scale, r.window_left = sc.window_left, r.threads = 1;
      r.method = chunk == 0 ? sc.first : sc.second;
      r.sequences = {s};
      std::vector<int64_t> rel = inference::prefill_chunk_positions(*session, r, r.method), pos;
      std::vector<std::vector<float>> q, k, v;
      for (int64_t p : rel) {
        pos.push_back(begin + p);
        q.push_back(t.q(s, begin + p)), k.push_back(t.k(s, begin + p)), v.push_back(t.v(s, begin + p));
      }
      AttentionBackend& backend = session->backend();
      const DeviceBuffer qp = pack(q, sc.dtype).on(backend, sc.dtype), kp = pack(k, sc.dtype).on(backend, sc.dtype),
                         vp = pack(v, sc.dtype).on(backend, sc.dtype);
      DeviceBuffer od(backend, pos.size() * size_t(sc.H * sc.D) * sizeof(float)),
          ld(backend, pos.size() * size_t(sc.H) * sizeof(float));
      const auto stats =
          inference::prefill(*session, cache, r, qp.data(), kp.data(), vp.data(), od.as<float>(), ld.as<float>());
      const std::vector<float> o = to_host(backend, od), lse = to_host(backend, ld);
      if (r.method != PrefillMethod::automatic) {
        EXPECT_EQ(stats.method, r.method);
      }
      // lse is (H, rows): the oracle's layout for one sequence. pass-KV runs the backend's block
      // kernels (on CUDA, bf16 tensor cores round P to bf16): judged with their rounding; pass-Q
      // runs the decode kernel, fp32 throughout (or, on the CPU, a chunk that fills the query
      // tiles on the block kernels: AMX rounds P to bf16).
      const kernels::AttentionDims dims{1, sc.H, sc.Hkv, sc.D, scale};
      const kernels::SamePrecision precision = stats.method == PrefillMethod::pass_kv
                                                   ? backend.same_precision(dims, sc.dtype)
                                                   : backend.decode_same_precision(dims, r.tokens, sc.dtype);
      if (!pos.empty())
        expect_exact(t, s, pos, o.data(), lse.data(), sc.window_left,
                     std::string("prefill chunk ") + std::to_string(chunk) + " of sequence " + std::to_string(s) +
                         " by " + inference::prefill_method_name(stats.method),
                     precision);
      EXPECT_EQ(cache.length(s), end);
    }
  }
  // Decode: the whole batch, `tokens` new tokens per sequence per step.
  for (int64_t step = 0; step < sc.steps; ++step) {
    DecodeRequest r;
    r.heads = sc.H, r.tokens = sc.tokens, r.scale = scale, r.window_left = sc.window_left, r.threads = 1;
    std::vector<std::vector<float>> q, k, v;
    for (int64_t s = 0; s < B; ++s)
      for (int64_t i = 0; i < sc.tokens; ++i) {
        const int64_t p = cache.length(s) + i;
        q.push_back(t.q(s, p)), k.push_back(t.k(s, p)), v.push_back(t.v(s, p));
      }
    AttentionBackend& backend = session->backend();
    const DeviceBuffer qp = pack(q, sc.dtype).on(backend, sc.dtype), kp = pack(k, sc.dtype).on(backend, sc.dtype),
                       vp = pack(v, sc.dtype).on(backend, sc.dtype);
    DeviceBuffer od(backend, size_t(B * sc.tokens * sc.H * sc.D) * sizeof(float)),
        ld(backend, size_t(B * sc.H * sc.tokens) * sizeof(float));
    std::vector<int64_t> before = cache.lengths();
    inference::decode_step(*session, cache, r, qp.data(), kp.data(), vp.data(), od.as<float>(), ld.as<float>());
    const std::vector<float> o = to_host(backend, od), lse = to_host(backend, ld);
    for (int64_t s = 0; s < B; ++s) {
      std::vector<int64_t> pos;
      for (int64_t i = 0; i < sc.tokens; ++i) pos.push_back(before[size_t(s)] + i);
      expect_exact(t, s, pos, o.data() + s * sc.tokens * sc.H * sc.D, lse.data() + s * sc.H * sc.tokens,
                   sc.window_left, "decode step " + std::to_string(step) + " of sequence " + std::to_string(s));
    }
  }
  // No rank holds a whole sequence, and shares stay within reach of each other.
  for (int64_t s = 0; s < B; ++s) {
    int64_t total = 0, most = 0;
    for (int r = 0; r < P; ++r) total += cache.rows(s, r), most = std::max(most, cache.rows(s, r));
    EXPECT_EQ(total, cache.length(s));
    if (P > 1) {
      EXPECT_LE(most, cache.length(s) / P + 2 * sc.interleave + 2) << "sequence " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Inference,
    ::testing::Values(
        Scenario{"gqa_passkv_then_passq", 8, 2, 32, DType::f32, -1, 1, {150, 97}, PrefillMethod::pass_kv,
                 PrefillMethod::pass_q, 4, 1},
        Scenario{"mqa_window_bf16", 4, 1, 64, DType::bf16, 40, 2, {130}, PrefillMethod::pass_q, PrefillMethod::pass_kv,
                 3, 2},
        Scenario{"speculative_auto", 8, 4, 32, DType::f32, 25, 3, {90, 61, 120}, PrefillMethod::automatic,
                 PrefillMethod::automatic, 3, 3},
        Scenario{"mha_passkv_twice", 2, 2, 16, DType::f32, -1, 1, {70}, PrefillMethod::pass_kv, PrefillMethod::pass_kv,
                 2, 1}),
    [](const ::testing::TestParamInfo<Scenario>& info) { return std::string(info.param.name); });

// Bad inputs: the same ArgumentError on every rank, the cache as it was.
TEST(InferenceErrors, NameTheArgumentAndLeaveTheCacheUnchanged) {
  auto session = open_session();
  const int P = session->size();
  const int64_t H = 4, Hkv = 2, D = 16;
  KVCache cache(session->backend(), session->rank(), P, CacheShape{2, Hkv, D, 3, 1, DType::f32});
  const std::vector<float> qh(size_t(2 * H * D), 0.5f), kvh(size_t(2 * Hkv * D), 0.25f);
  AttentionBackend& backend = session->backend();
  DeviceBuffer q = on_backend(backend, qh.data(), qh.size() * sizeof(float)),
               kv = on_backend(backend, kvh.data(), kvh.size() * sizeof(float)),
               o(backend, qh.size() * sizeof(float)), lse(backend, size_t(2 * H) * sizeof(float));
  auto decode = [&](DecodeRequest r) {
    r.heads = H;
    inference::decode_step(*session, cache, r, q.data(), kv.data(), kv.data(), o.as<float>(), lse.as<float>());
  };
  auto expect_error = [&](const char* argument, const DecodeRequest& r) {
    const std::vector<int64_t> before = cache.lengths();
    const int64_t rows = cache.rows(0);
    try {
      decode(r);
      ADD_FAILURE() << "no error for " << argument;
    } catch (const ArgumentError& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
    EXPECT_EQ(cache.lengths(), before);
    EXPECT_EQ(cache.rows(0), rows);
  };
  expect_error("cache", DecodeRequest{});  // never filled
  // Fill it: one token per sequence by pass-Q.
  PrefillRequest p;
  p.heads = H, p.tokens = 1, p.method = PrefillMethod::pass_q;
  inference::prefill(*session, cache, p, q.data(), kv.data(), kv.data(), o.as<float>(), lse.as<float>());
  DecodeRequest r;
  r.sequences = {2};
  expect_error("sequences", r);
  r.sequences = {0, 0};
  expect_error("sequences", r);
  r.sequences = {1};
  r.positions = {5};
  expect_error("positions", r);
  r.positions = {1};
  decode(r);  // the next position is fine
  EXPECT_EQ(cache.length(1), 2);
  // Past the capacity: 3 rows per rank per sequence.
  DecodeRequest full;
  full.sequences = {0};
  int64_t appended = 0;
  for (;;) {
    std::vector<int64_t> added(size_t(P), 0);
    for (int owner : cache.placement(0, 1)) ++added[size_t(owner)];
    if (cache.capacity_problem(0, added, "capacity")) break;
    decode(full);
    ++appended;
  }
  EXPECT_EQ(cache.length(0), 3 * P);
  EXPECT_EQ(appended, 3 * P - 1);
  expect_error("capacity", full);
}

}  // namespace
}  // namespace ringattn::testing
