// The LoRA attention layer under mpirun against the fp64 reference of the whole layer
// (lora_reference.hpp): Y, dX and dA, dB of every projection for every layout x schedule x mask,
// GQA/MQA, batch 2, partial LoRA and bf16; rotary embeddings (both pairings, partial rotary,
// per-document positions) with biases on every layout; one SGD and one AdamW step; training and the demo
// independent of the number of ranks; merged weights; parameter memory per rank. Each rank checks
// its own rows and its own parameter slices. Registered at 1, 2, 3 and 4 ranks.
//
// The layer runs where RINGATTN_TEST_BACKEND and RINGATTN_TEST_COMM say (default cpu and mpi): the
// emulated build also registers it on --backend cuda --comm nccl (the CUDA emulation, cuBLAS served
// by the CPU GEMM).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/test_util.hpp"
#include "comm/mpi_communicator.hpp"
#include "tests/runtime/lora/lora_reference.hpp"
#include "tests/support/mask_variants.hpp"
#include "runtime/lora/demo.hpp"
#include "runtime/lora/layer.hpp"
#include "runtime/lora/training.hpp"

namespace ringattn::testing {
namespace {

// The context options of the environment's backend and communicator.
ContextOptions context_options() {
  ContextOptions o;
  if (const char* b = std::getenv("RINGATTN_TEST_BACKEND")) o.backend = b;
  if (const char* c = std::getenv("RINGATTN_TEST_COMM")) o.comm = c;
  o.threads = 1;
  o.timeout_s = 60.0;
  return o;
}

// A communicator for the tests' own host-side collectives and the layer's context over the same
// ranks: all of them, or each rank alone. Collective over MPI_COMM_WORLD.
struct Ranks {
  MPI_Comm mpi = MPI_COMM_NULL;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<Session> session;

  explicit Ranks(bool alone) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_split(MPI_COMM_WORLD, alone ? rank : 0, 0, &mpi);
    comm = comm::make_mpi_communicator(mpi);
    comm->set_timeout(60.0);
    ContextOptions options = context_options();
    // A rank alone moves nothing; over MPI (host-staged with CUDA), since emulated NCCL
    // communicators span every rank of the job.
    if (alone) options.comm = "mpi";
    session = std::make_unique<Session>(mpi, SessionOptions{options, {}});
  }
  ~Ranks() {
    session.reset();
    comm.reset();
    MPI_Comm_free(&mpi);
  }
};

// The layer's passes on host vectors, through its memory (the backend's).
std::vector<float> forward(LoraLayer& layer, std::vector<float> x) {
  std::vector<float> y(x.size());
  MirroredFloats in(layer.backend(), x), out(layer.backend(), y);
  in.upload();
  layer.forward(in.data(), out.data());
  out.download();
  return y;
}
std::vector<float> backward(LoraLayer& layer, std::vector<float> x, std::vector<float> dy) {
  std::vector<float> dx(x.size());
  MirroredFloats in(layer.backend(), x), grad(layer.backend(), dy), out(layer.backend(), dx);
  in.upload(), grad.upload();
  layer.backward(in.data(), grad.data(), out.data());
  out.download();
  return dx;
}
double step(comm::Communicator& comm, LoraLayer& layer, LoraOptimizer& optimizer, std::vector<float> x,
            const std::vector<float>& target) {
  MirroredFloats in(layer.backend(), x);
  in.upload();
  std::vector<float> y;
  return train_step(comm, layer, optimizer, in.data(), LossKind::mse, target.data(), y);
}


struct LayerCase {
  LayoutKind layout = LayoutKind::contiguous;
  Schedule schedule = Schedule::direct;
  int mask = 0;  // tests/support/mask_variants.hpp
  int64_t B = 2, L = 67, d = 64, H = 4, Hkv = 2, r = 4;
  double alpha = 8.0;
  std::array<bool, kProjections> lora{true, true, true, true};
  std::array<bool, kProjections> bias{};
  RopeConfig rope;
  DType dtype = DType::f32;

  LayerConfig config() const {
    LayerConfig c;
    c.batch = B, c.seq_len = L, c.d_model = d, c.heads = H, c.kv_heads = Hkv;
    c.lora_rank = r, c.lora_alpha = alpha, c.lora = lora, c.dtype = dtype, c.threads = 1;
    c.bias = bias, c.rope = rope;
    return c;
  }
  AttentionSpec spec() const {
    AttentionSpec s = spec_variant(mask, L);
    s.layout = layout == LayoutKind::zigzag    ? SequenceLayout::zigzag
               : layout == LayoutKind::striped ? SequenceLayout::striped
                                               : SequenceLayout::contiguous;
    s.schedule = schedule == Schedule::ring ? KeyValueSchedule::ring : KeyValueSchedule::direct;
    return s;
  }
  std::string describe(const Mask& m, int P) const {
    return std::string(layout_name(layout)) + "/" + schedule_name(schedule) + "/" + m.describe() + "/" +
           dtype_name(dtype) + " B=" + std::to_string(B) + " L=" + std::to_string(L) + " H=" + std::to_string(H) +
           " Hkv=" + std::to_string(Hkv) + " P=" + std::to_string(P) +
           (rope.enabled() ? std::string(" rope(") + (rope.interleaved ? "interleaved" : "rotate_half") + ",dims " +
                                 std::to_string(rope.dims) + (rope.per_document ? ",per-document)" : ")")
                           : "") +
           (bias[0] || bias[3] ? " biases" : "");
  }
};

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// Whole parameters, drawn in fp32 (so the layer and the reference see the same values), the same
// on every rank.
RefLayer make_reference(const LayerCase& c, const Mask& mask, uint64_t seed) {
  RefLayer ref;
  ref.batch = c.B, ref.seq_len = c.L, ref.d_model = c.d, ref.heads = c.H, ref.kv_heads = c.Hkv;
  ref.scaling = c.alpha / double(c.r);
  ref.mask = mask.view();
  ref.rope_theta = c.rope.theta, ref.rope_interleaved = c.rope.interleaved, ref.rope_dims = c.rope.dims;
  ref.rope_per_document = c.rope.per_document, ref.doc_offsets = mask.doc_offsets();
  const LayerConfig config = c.config();
  for (int p = 0; p < kProjections; ++p) {
    const ProjectionShape s = config.shape(p);
    RefProjection& r = ref.proj[size_t(p)];
    r.out = s.out, r.in = s.in, r.rank = s.rank;
    const float w = float(1.0 / std::sqrt(double(s.in)));
    r.w0 = to_double(random_vector(size_t(s.out * s.in), seed + 10 * p, w));
    r.a = to_double(random_vector(size_t(s.rank * s.in), seed + 10 * p + 1, w));
    r.b = to_double(random_vector(size_t(s.out * s.rank), seed + 10 * p + 2, 0.3f));
    if (s.bias) ref.bias[size_t(p)] = to_double(random_vector(size_t(s.out), seed + 10 * p + 3, 0.5f));
  }
  return ref;
}

void load(LoraLayer& layer, const RefLayer& ref) {
  for (int p = 0; p < kProjections; ++p) {
    const RefProjection& r = ref.proj[size_t(p)];
    ShardedProjection& proj = layer.projection(p);
    proj.fill(ProjectionPart::w0, [&](int64_t i, int64_t j) { return float(r.w0[size_t(i * r.in + j)]); });
    if (!ref.bias[size_t(p)].empty())
      proj.fill(ProjectionPart::bias, [&](int64_t i, int64_t) { return float(ref.bias[size_t(p)][size_t(i)]); });
    if (r.rank == 0) continue;
    proj.fill(ProjectionPart::lora_a, [&](int64_t i, int64_t j) { return float(r.a[size_t(i * r.in + j)]); });
    proj.fill(ProjectionPart::lora_b, [&](int64_t i, int64_t j) { return float(r.b[size_t(i * r.rank + j)]); });
  }
}

// This rank's rows of a (B, L, width) tensor.
template <class T>
std::vector<T> rows_of(const std::vector<T>& full, int64_t B, int64_t L, int64_t width,
                       const std::vector<int64_t>& pos) {
  std::vector<T> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t : pos)
      out.insert(out.end(), full.begin() + (b * L + t) * width, full.begin() + (b * L + t + 1) * width);
  return out;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

// The owned elements of A or B of projection p from `slice` (laid out as lora()), next to the
// reference tensor's values at the same coordinates.
void owned_pairs(const ShardedProjection& proj, ProjectionPart part, std::span<const float> slice,
                 const std::vector<double>& ref, std::vector<double>& got, std::vector<double>& want) {
  const int64_t cols = part == ProjectionPart::lora_a ? proj.shape().in : proj.shape().rank;
  proj.for_each_owned(part, [&](int64_t i, int64_t j, size_t index) {
    got.push_back(slice[index]);
    want.push_back(ref[size_t(i * cols + j)]);
  });
}

// |got - want| <= tol * max |want| (the whole tensor's scale, at least 1: a gradient that is
// exactly zero in fp64, e.g. dQ of a row that sees only itself, is fp32 rounding noise here).
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double scale, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double err = max_abs_diff(got, want);
  EXPECT_LE(err, tol * std::max(scale, 1.0)) << what << ": max error " << err << ", scale " << scale;
}

class LoraLayerMpi : public ::testing::Test {
 protected:
  void SetUp() override { world = std::make_unique<Ranks>(false); }
  void TearDown() override { world.reset(); }
  std::unique_ptr<Ranks> world;
};

// Forward and backward of one case on the context's ranks, each rank checking its rows and slices.
void check_against_fp64(Session& session, const LayerCase& c, double tol) {
  const int P = session.size();
  const Mask mask = mask_variant(c.mask, c.L);
  SCOPED_TRACE(c.describe(mask, P) + " rank " + std::to_string(session.rank()) + " on " + session.options().backend);
  LoraLayer layer(session, c.config(), c.spec());
  const RefLayer ref = make_reference(c, mask, 100);
  load(layer, ref);
  const std::vector<float> x = random_vector(size_t(c.B * c.L * c.d), 7), dy = random_vector(x.size(), 8);
  const std::vector<float> xr = rows_of(x, c.B, c.L, c.d, layer.positions());
  const std::vector<float> dyr = rows_of(dy, c.B, c.L, c.d, layer.positions());
  const std::vector<float> y = forward(layer, xr), dx = backward(layer, xr, dyr);

  const std::vector<double> ry = reference_layer_forward(ref, to_double(x));
  const RefGrads rg = reference_layer_backward(ref, to_double(x), to_double(dy));
  expect_close(to_double(y), rows_of(ry, c.B, c.L, c.d, layer.positions()), max_abs(ry), tol, "y");
  expect_close(to_double(dx), rows_of(rg.dx, c.B, c.L, c.d, layer.positions()), max_abs(rg.dx), tol, "dx");
  for (int p = 0; p < kProjections; ++p) {
    const std::string name = projection_name(p);
    if (!c.lora[size_t(p)]) {
      EXPECT_TRUE(layer.lora_grad(p).empty()) << name;
      continue;
    }
    std::vector<double> got, want;
    owned_pairs(layer.projection(p), ProjectionPart::lora_a, layer.lora_grad(p), rg.da[size_t(p)], got, want);
    expect_close(got, want, max_abs(rg.da[size_t(p)]), tol, "dA of " + name);
    got.clear(), want.clear();
    owned_pairs(layer.projection(p), ProjectionPart::lora_b, layer.lora_grad(p), rg.db[size_t(p)], got, want);
    expect_close(got, want, max_abs(rg.db[size_t(p)]), tol, "dB of " + name);
  }
}

constexpr double kFp32Tolerance = 2e-5;  // relative to the tensor's largest value

TEST_F(LoraLayerMpi, EveryLayoutScheduleAndMaskMatchesFp64) {
  for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
    for (Schedule schedule : {Schedule::direct, Schedule::ring})
      for (int m = 0; m < kMaskVariants; ++m) {
        LayerCase c;
        c.layout = layout, c.schedule = schedule, c.mask = m;
        check_against_fp64(*world->session, c, kFp32Tolerance);
      }
}

// RoPE with every row at its global position (or its offset in its document) on every layout,
// in both pairings, whole and partial rotary, with biases on all four projections.
TEST_F(LoraLayerMpi, RopeAndBiasesMatchFp64OnEveryLayout) {
  for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
    for (bool interleaved : {false, true})
      for (int64_t dims : {0, 8}) {
        LayerCase c;
        c.layout = layout, c.mask = 1;
        c.bias = {true, true, true, true};
        c.rope.theta = 10000.0, c.rope.interleaved = interleaved, c.rope.dims = dims;
        check_against_fp64(*world->session, c, kFp32Tolerance);
        c.mask = 5;  // causal over two packed documents: positions restart in the second
        c.rope.per_document = true;
        c.rope.theta = 500.0;
        check_against_fp64(*world->session, c, kFp32Tolerance);
      }
  LayerCase qwen;  // Qwen2: biases on q, k, v only, rope over the whole head, MQA, two LoRA targets
  qwen.bias = {true, true, true, false};
  qwen.lora = {true, false, true, false};
  qwen.Hkv = 1, qwen.mask = 7, qwen.layout = LayoutKind::zigzag;
  qwen.rope.theta = 1e6;
  check_against_fp64(*world->session, qwen, kFp32Tolerance);
}

TEST_F(LoraLayerMpi, PartialLoraMqaAndOneRowPerRank) {
  LayerCase c;
  c.lora = {true, false, true, false};  // PEFT's default target modules: q_proj and v_proj
  c.Hkv = 1, c.B = 1, c.d = 32, c.H = 2, c.r = 3, c.alpha = 3;
  c.mask = 1;
  c.layout = LayoutKind::zigzag;
  check_against_fp64(*world->session, c, kFp32Tolerance);
  c.L = world->comm->size();  // one position per rank
  c.layout = LayoutKind::striped;
  check_against_fp64(*world->session, c, kFp32Tolerance);
}

// bf16: the ring stores Q, K, V and dO in bf16 and every GEMM takes bf16 operands (8 bits of
// mantissa), summing in fp32.
TEST_F(LoraLayerMpi, Bf16AttentionStorageAndGemms) {
  LayerCase c;
  c.dtype = DType::bf16;
  c.mask = 1;
  c.layout = LayoutKind::zigzag;
  check_against_fp64(*world->session, c, 3e-2);
  c.bias = {true, true, true, true};  // with RoPE and biases too
  c.rope.theta = 10000.0;
  c.mask = 5;
  check_against_fp64(*world->session, c, 3e-2);
}

// One training step (MSE against a target) against the fp64 step, comparing the updates.
void check_training_step(Ranks& ranks, OptimizerKind kind, double lr) {
  comm::Communicator& comm = *ranks.comm;
  LayerCase c;
  c.mask = 1, c.layout = LayoutKind::zigzag;
  const Mask mask = mask_variant(c.mask, c.L);
  SCOPED_TRACE(std::string(optimizer_name(kind)) + " P=" + std::to_string(comm.size()));
  LoraLayer layer(*ranks.session, c.config(), c.spec());
  RefLayer ref = make_reference(c, mask, 200);
  load(layer, ref);
  const RefLayer before = ref;
  const std::vector<float> x = random_vector(size_t(c.B * c.L * c.d), 9), target = random_vector(x.size(), 10, 0.5f);
  const std::vector<float> xr = rows_of(x, c.B, c.L, c.d, layer.positions());
  const std::vector<float> tr = rows_of(target, c.B, c.L, c.d, layer.positions());
  OptimizerOptions options;
  options.kind = kind, options.lr = lr;
  LoraOptimizer optimizer(layer, options);
  const double loss = step(comm, layer, optimizer, xr, tr);

  const std::vector<double> ry = reference_layer_forward(ref, to_double(x));
  std::vector<double> rdy(ry.size());
  double ref_loss = 0;
  for (size_t i = 0; i < ry.size(); ++i) {
    const double e = ry[i] - double(target[i]);
    ref_loss += e * e / double(ry.size());
    rdy[i] = 2.0 * e / double(ry.size());
  }
  EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
  reference_step(ref, reference_layer_backward(ref, to_double(x), rdy),
                 kind == OptimizerKind::sgd ? RefOptimizer::sgd : RefOptimizer::adamw, lr);
  for (int p = 0; p < kProjections; ++p)
    for (ProjectionPart part : {ProjectionPart::lora_a, ProjectionPart::lora_b}) {
      const std::vector<double>& now = part == ProjectionPart::lora_a ? ref.proj[size_t(p)].a : ref.proj[size_t(p)].b;
      const std::vector<double>& then =
          part == ProjectionPart::lora_a ? before.proj[size_t(p)].a : before.proj[size_t(p)].b;
      std::vector<double> update(now.size());
      for (size_t i = 0; i < now.size(); ++i) update[i] = now[i] - then[i];
      std::vector<double> got, start, want;
      const ShardedProjection& proj = std::as_const(layer).projection(p);
      owned_pairs(proj, part, proj.lora(), then, got, start);
      std::vector<double> got_update(got.size());
      for (size_t i = 0; i < got.size(); ++i) got_update[i] = got[i] - start[i];
      owned_pairs(proj, part, proj.lora(), update, got, want);
      // (fp32 parameters: an update is exact up to the rounding of the parameter itself)
      expect_close(got_update, want, max_abs(update), 1e-4,
                   std::string(projection_name(p)) + (part == ProjectionPart::lora_a ? " A update" : " B update"));
    }
}

TEST_F(LoraLayerMpi, SgdStepMatchesFp64) { check_training_step(*world, OptimizerKind::sgd, 0.5); }
TEST_F(LoraLayerMpi, AdamwStepMatchesFp64) { check_training_step(*world, OptimizerKind::adamw, 1e-2); }

// Several steps at P ranks end where one process ends, to fp32 rounding.
TEST_F(LoraLayerMpi, TrainingEqualsSingleProcess) {
  LayerCase c;
  c.mask = 2, c.layout = LayoutKind::striped;
  const Mask mask = mask_variant(c.mask, c.L);
  const std::vector<float> target = random_vector(size_t(c.B * c.L * c.d), 11, 0.5f);
  auto train = [&](Ranks& on, OptimizerKind kind) {
    auto layer = std::make_unique<LoraLayer>(*on.session, c.config(), c.spec());
    load(*layer, make_reference(c, mask, 300));
    OptimizerOptions options;
    options.kind = kind, options.lr = kind == OptimizerKind::sgd ? 0.2 : 1e-2;
    LoraOptimizer optimizer(*layer, options);
    for (int i = 0; i < 4; ++i) {
      const std::vector<float> x = random_vector(target.size(), 20 + uint64_t(i));
      step(*on.comm, *layer, optimizer, rows_of(x, c.B, c.L, c.d, layer->positions()),
           rows_of(target, c.B, c.L, c.d, layer->positions()));
    }
    return layer;
  };
  Ranks alone(true);
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    SCOPED_TRACE(optimizer_name(kind));
    const auto sharded = train(*world, kind);
    const auto single = train(alone, kind);
    for (int p = 0; p < kProjections; ++p)
      for (ProjectionPart part : {ProjectionPart::lora_a, ProjectionPart::lora_b}) {
        const ShardedProjection& whole = std::as_const(*single).projection(p);
        const int64_t cols = part == ProjectionPart::lora_a ? whole.shape().in : whole.shape().rank;
        std::vector<double> full(
            size_t(whole.shape().rank * (part == ProjectionPart::lora_a ? whole.shape().in : whole.shape().out)));
        whole.for_each_owned(part,
                             [&](int64_t i, int64_t j, size_t k) { full[size_t(i * cols + j)] = whole.lora()[k]; });
        std::vector<double> got, want;
        const ShardedProjection& mine = std::as_const(*sharded).projection(p);
        owned_pairs(mine, part, mine.lora(), full, got, want);
        expect_close(got, want, max_abs(full), 1e-5, std::string(projection_name(p)) + " after 4 steps");
      }
  }
}

TEST_F(LoraLayerMpi, MergedWeightsGiveTheSameOutputWithoutLora) {
  LayerCase c;
  c.mask = 3;
  const Mask mask = mask_variant(c.mask, c.L);
  LoraLayer layer(*world->session, c.config(), c.spec());
  const RefLayer ref = make_reference(c, mask, 400);
  load(layer, ref);
  LayerCase plain = c;
  plain.lora.fill(false);
  LoraLayer merged(*world->session, plain.config(), plain.spec());
  for (int p = 0; p < kProjections; ++p) {
    const std::vector<float> rows = layer.merged_rows(p);
    const ShardedProjection& proj = merged.projection(p);
    ASSERT_EQ(rows.size(), proj.w0().size());
    std::vector<double> got, want;
    const std::vector<double> effective = ref.effective(p);
    proj.for_each_owned(ProjectionPart::w0, [&](int64_t i, int64_t j, size_t k) {
      got.push_back(rows[k]);
      want.push_back(effective[size_t(i * proj.shape().in + j)]);
    });
    expect_close(got, want, max_abs(effective), 1e-6, std::string("merged W of ") + projection_name(p));
    std::copy(rows.begin(), rows.end(), merged.projection(p).w0().begin());
    EXPECT_TRUE(merged.projection(p).lora().empty());
  }
  const std::vector<float> x = rows_of(random_vector(size_t(c.B * c.L * c.d), 12), c.B, c.L, c.d, layer.positions());
  const std::vector<float> y1 = forward(layer, x), y2 = forward(merged, x);
  expect_close(to_double(y2), to_double(y1), max_abs(to_double(y1)), 1e-5, "merged vs unmerged y");
}

TEST_F(LoraLayerMpi, ParametersHeldPerRankAreAboutOneOverP) {
  LayerCase c;
  c.d = 128, c.H = 8, c.Hkv = 2, c.r = 8, c.B = 1;
  const int P = world->comm->size();
  LoraLayer layer(*world->session, c.config(), c.spec());
  size_t slack = 0, largest = 0;  // one more row of W0 and B and one more column of A, per projection
  for (int p = 0; p < kProjections; ++p) {
    const ProjectionShape& s = layer.projection(p).shape();
    slack += sizeof(float) * size_t(s.in + 2 * s.rank);
    largest = std::max(largest, layer.projection(p).full_bytes());
  }
  const size_t full = layer.full_parameter_bytes(), mine = layer.shard_bytes();
  EXPECT_EQ(full, sizeof(float) * size_t(2 * 128 * 128 + 2 * 32 * 128 + 8 * (4 * 128 + 2 * 128 + 2 * 32)));
  EXPECT_LE(mine, full / size_t(P) + slack);
  EXPECT_GE(mine + slack, full / size_t(P));
  uint64_t sum = mine;
  world->comm->allreduce(&sum, 1, DType::i64, comm::ReduceOp::sum);
  EXPECT_EQ(sum, full);  // every parameter held exactly once
  const std::vector<float> x(layer.activation_elements(), 0.5f);
  backward(layer, x, forward(layer, x));
  EXPECT_GE(layer.peak_gathered_bytes(), largest);      // one projection in use ...
  EXPECT_LE(layer.peak_gathered_bytes(), 2 * largest);  // ... and at most the next one arriving
  EXPECT_EQ(layer.gathered_bytes(), 0u);                // released after the pass
}

// The demo's loss curve is the same for any number of ranks, and falls.
TEST_F(LoraLayerMpi, DemoLossCurveIsIndependentOfRanks) {
  LayerCase c;
  c.B = 1, c.L = 128, c.d = 64, c.H = 4, c.Hkv = 2, c.alpha = 4;
  c.layout = LayoutKind::zigzag, c.mask = 1;  // causal
  DemoOptions options;
  options.steps = 40;
  options.optimizer.lr = 0.02;
  auto run = [&](Ranks& on) {
    LoraLayer student(*on.session, c.config(), c.spec());
    return run_lora_demo(*on.comm, student, options);
  };
  const std::vector<double> sharded = run(*world);
  std::vector<double> single(sharded.size());
  {
    Ranks alone(true);  // (collective: every rank makes its own)
    if (world->comm->rank() == 0) single = run(alone);
  }
  world->comm->broadcast(single.data(), single.size() * sizeof(double), 0);
  ASSERT_EQ(sharded.size(), 40u);
  for (size_t i = 0; i < sharded.size(); ++i) EXPECT_NEAR(sharded[i], single[i], 1e-4 * single[i]) << "step " << i + 1;
  EXPECT_LT(single.back(), 0.5 * single.front());
}

}  // namespace
}  // namespace ringattn::testing
