#include "runtime/lora/projection.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "util/stopwatch.hpp"
#include "runtime/random_inputs.hpp"

namespace ringattn {

RowRange even_chunk(int64_t n, int parts, int part) {
  const int64_t base = n / parts, extra = n % parts;
  auto start = [&](int64_t c) { return c * base + std::min(c, extra); };
  return RowRange{start(part), start(part + 1)};
}

ShardedProjection::ShardedProjection(const ProjectionShape& shape, int ranks, int rank)
    : shape_(shape), ranks_(ranks), rank_(rank) {
  const RowRange r = rows();
  w0_.assign(static_cast<size_t>((r.end - r.begin) * shape.in), 0.0f);
  if (shape.bias) bias_.assign(static_cast<size_t>(r.end - r.begin), 0.0f);
  lora_.assign(a_elements(rank) + b_elements(rank), 0.0f);
}

size_t ShardedProjection::a_elements(int rank) const {
  const RowRange c = cols(rank);
  return static_cast<size_t>((c.end - c.begin) * shape_.rank);
}

size_t ShardedProjection::b_elements(int rank) const {
  const RowRange r = rows(rank);
  return static_cast<size_t>((r.end - r.begin) * shape_.rank);
}

size_t ShardedProjection::full_bytes() const {
  return sizeof(float) * static_cast<size_t>(shape_.out * shape_.in + (shape_.bias ? shape_.out : 0) +
                                             (shape_.out + shape_.in) * shape_.rank);
}

void ShardedProjection::for_each_owned(ProjectionPart part,
                                       const std::function<void(int64_t, int64_t, size_t)>& f) const {
  const RowRange r = rows(), c = cols();
  const int64_t R = shape_.rank;
  switch (part) {
    case ProjectionPart::w0:
      for (int64_t i = r.begin; i < r.end; ++i)
        for (int64_t j = 0; j < shape_.in; ++j) f(i, j, static_cast<size_t>((i - r.begin) * shape_.in + j));
      break;
    case ProjectionPart::bias:
      if (!shape_.bias) break;
      for (int64_t i = r.begin; i < r.end; ++i) f(i, 0, static_cast<size_t>(i - r.begin));
      break;
    case ProjectionPart::lora_a:  // A (r, in), held as A^T rows c.begin..c.end
      for (int64_t i = 0; i < R; ++i)
        for (int64_t j = c.begin; j < c.end; ++j) f(i, j, static_cast<size_t>((j - c.begin) * R + i));
      break;
    case ProjectionPart::lora_b: {
      const size_t offset = a_elements(rank_);
      for (int64_t i = r.begin; i < r.end; ++i)
        for (int64_t j = 0; j < R; ++j) f(i, j, offset + static_cast<size_t>((i - r.begin) * R + j));
      break;
    }
  }
}

void ShardedProjection::fill(ProjectionPart part, const std::function<float(int64_t, int64_t)>& value) {
  ++versions_[version_index(part)];
  float* dst = part == ProjectionPart::w0 ? w0_.data() : part == ProjectionPart::bias ? bias_.data() : lora_.data();
  for_each_owned(part, [&](int64_t i, int64_t j, size_t index) { dst[index] = value(i, j); });
}

namespace {

// Parts of a projection in one buffer start at multiples of this (what cudaMalloc gives a buffer,
// and more than any GEMM or copy needs).
constexpr size_t kPartAlignment = 256;

size_t aligned(size_t bytes) { return (bytes + kPartAlignment - 1) / kPartAlignment * kPartAlignment; }

// Bytes of the four parts (W0, A^T, B in `type`; bias in fp32) of `rows` rows of W0 and B and
// `cols` rows of A^T.
struct PartBytes {
  size_t w0, a_t, b, bias;
  size_t total() const { return aligned(w0) + aligned(a_t) + aligned(b) + aligned(bias); }
};
PartBytes part_bytes(const ProjectionShape& s, int64_t rows, int64_t cols, bool bias, DType type) {
  const size_t e = static_cast<size_t>(dtype_bytes(type));
  return PartBytes{e * static_cast<size_t>(rows * s.in), e * static_cast<size_t>(cols * s.rank),
                   e * static_cast<size_t>(rows * s.rank), bias ? sizeof(float) * static_cast<size_t>(rows) : 0};
}

// Where the parts start in a buffer laid out by part_bytes.
std::array<char*, 4> part_starts(void* memory, const PartBytes& b) {
  char* w0 = static_cast<char*>(memory);
  char* a_t = w0 + aligned(b.w0);
  char* bb = a_t + aligned(b.a_t);
  char* bias = bb + aligned(b.b);
  return {w0, a_t, bb, bias};
}

// fp32 values in the GEMM type, in host memory (a plain view for fp32).
const void* host_operand(std::span<const float> x, DType type, std::vector<bf16_bits>& storage) {
  if (type == DType::f32) return x.data();
  storage.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) storage[i] = float_to_bf16(x[i]);
  return storage.data();
}

}  // namespace

size_t GatheredProjection::bytes(const ProjectionShape& s, DType type) {
  return part_bytes(s, s.out, s.in, s.bias, type).total();
}

GatheredProjection GatheredProjection::at(void* memory, const ProjectionShape& s, DType type) {
  const PartBytes b = part_bytes(s, s.out, s.in, s.bias, type);
  const std::array<char*, 4> at = part_starts(memory, b);
  return GatheredProjection{s, type, at[0], at[1], at[2], s.bias ? reinterpret_cast<float*>(at[3]) : nullptr};
}

void SliceMirror::refresh(const ShardedProjection& p, AttentionBackend& backend, DType type) {
  const ProjectionShape& s = p.shape();
  const std::span<const float> w0 = p.w0(), lora = p.lora(), bias = p.bias();
  if (backend.memory() == comm::MemorySpace::host && type == DType::f32) {  // the host copy itself
    slices_ = ProjectionSlices{w0.data(), p.lora_a_t().data(), p.lora_b().data(), s.bias ? bias.data() : nullptr};
    return;
  }
  const RowRange rows = p.rows(), cols = p.cols();
  const PartBytes b = part_bytes(s, rows.end - rows.begin, cols.end - cols.begin, s.bias, type);
  if (!storage_.data() && b.total() > 0) storage_ = DeviceBuffer(backend, b.total());
  const std::array<char*, 4> at = part_starts(storage_.data(), b);
  slices_ = ProjectionSlices{at[0], at[1], at[2], s.bias ? reinterpret_cast<const float*>(at[3]) : nullptr};
  std::vector<bf16_bits> staging;
  auto upload = [&](void* to, const void* from, size_t bytes) {
    if (bytes) backend.upload(to, from, bytes);
  };
  auto bring = [&](ProjectionPart part, size_t index, auto copy) {
    if (copied_ && versions_[index] == p.version(part)) return;
    copy();
    versions_[index] = p.version(part);
  };
  bring(ProjectionPart::w0, 0, [&] { upload(at[0], host_operand(w0, type, staging), b.w0); });
  bring(ProjectionPart::lora_a, 1, [&] {  // A^T rows then B rows: lora()'s layout
    const char* from = static_cast<const char*>(host_operand(lora, type, staging));
    upload(at[1], from, b.a_t);
    upload(at[2], from + b.a_t, b.b);
  });
  bring(ProjectionPart::bias, 2, [&] { upload(at[3], bias.data(), b.bias); });
  copied_ = true;
}

void ProjectionGather::start(comm::Communicator& comm, LayerOps& ops, const ShardedProjection& p,
                             const ProjectionSlices& mine, const GatheredProjection& dst) {
  const ProjectionShape& s = p.shape();
  const int P = comm.size(), me = comm.rank();
  const size_t e = static_cast<size_t>(dtype_bytes(dst.type));
  constexpr int kParts = 4;  // W0, A^T, B, bias
  // Where rank q's slices go in the gathered tensors, and how many bytes they are.
  struct Piece {
    char* at;
    size_t bytes;
  };
  auto pieces = [&](int q) {
    const RowRange r = p.rows(q), c = p.cols(q);
    const size_t rows = static_cast<size_t>(r.end - r.begin);
    return std::array<Piece, kParts>{
        Piece{static_cast<char*>(dst.w0) + e * static_cast<size_t>(r.begin * s.in), e * rows * size_t(s.in)},
        Piece{static_cast<char*>(dst.a_t) + e * static_cast<size_t>(c.begin * s.rank), e * p.a_elements(q)},
        Piece{static_cast<char*>(dst.b) + e * static_cast<size_t>(r.begin * s.rank), e * p.b_elements(q)},
        Piece{s.bias ? reinterpret_cast<char*>(dst.bias + r.begin) : nullptr, s.bias ? sizeof(float) * rows : 0}};
  };
  const std::array<const void*, kParts> from = {mine.w0, mine.a_t, mine.b, mine.bias};
  const std::array<Piece, kParts> own = pieces(me);
  for (int part = 0; part < kParts; ++part) ops.copy(own[part].at, from[part], own[part].bytes);
  // Sends to and receives from each peer in part order: within a step, transfers between one
  // pair match in the order listed.
  std::vector<comm::StepTransfer> transfers;
  for (int step = 1; step < P; ++step) {
    const int to = (me + step) % P, from_rank = (me - step + P) % P;
    const std::array<Piece, kParts> theirs = pieces(from_rank);
    for (int part = 0; part < kParts; ++part) {
      if (theirs[part].bytes)
        transfers.push_back(comm::StepTransfer::recv(theirs[part].at, theirs[part].bytes, from_rank));
      if (own[part].bytes) transfers.push_back(comm::StepTransfer::send(from[part], own[part].bytes, to));
    }
  }
  step_ = comm.post_step(transfers);
}

double ProjectionGather::finish(comm::Communicator& comm, const std::string& what) {
  const Stopwatch blocked;
  comm.wait_step(step_, what);
  return blocked.seconds();
}

void projection_forward(LayerOps& ops, const GatheredProjection& w, float scaling, const void* x, int64_t n, float* y,
                        float* u, void* u_op) {
  const ProjectionShape& s = w.shape;
  ops.gemm(Op::n, Op::t, n, s.out, s.in, 1.0f, x, s.in, w.w0, s.in, w.type, 0.0f, y, s.out);
  if (w.bias) ops.add_bias(y, w.bias, n, s.out);
  if (!s.has_lora()) return;
  ops.gemm(Op::n, Op::n, n, s.rank, s.in, 1.0f, x, s.in, w.a_t, s.rank, w.type, 0.0f, u, s.rank);
  if (w.type == DType::bf16) ops.round_to_bf16(static_cast<bf16_bits*>(u_op), u, static_cast<size_t>(n * s.rank));
  ops.gemm(Op::n, Op::t, n, s.out, s.rank, scaling, u_op, s.rank, w.b, s.rank, w.type, 1.0f, y, s.out);
}

void projection_backward(LayerOps& ops, const GatheredProjection& w, float scaling, const void* x, const void* u_op,
                         const void* dy_op, int64_t n, float* dx, bool accumulate_dx, float* grad_a_t, float* grad_b,
                         float* du, void* du_op) {
  const ProjectionShape& s = w.shape;
  if (s.has_lora()) {
    ops.gemm(Op::n, Op::n, n, s.rank, s.out, scaling, dy_op, s.out, w.b, s.rank, w.type, 0.0f, du, s.rank);
    if (w.type == DType::bf16) ops.round_to_bf16(static_cast<bf16_bits*>(du_op), du, static_cast<size_t>(n * s.rank));
    ops.gemm(Op::t, Op::n, s.out, s.rank, n, scaling, dy_op, s.out, u_op, s.rank, w.type, 1.0f, grad_b, s.rank);
    ops.gemm(Op::t, Op::n, s.in, s.rank, n, 1.0f, x, s.in, du_op, s.rank, w.type, 1.0f, grad_a_t, s.rank);
  }
  if (!dx) return;
  ops.gemm(Op::n, Op::n, n, s.in, s.out, 1.0f, dy_op, s.out, w.w0, s.in, w.type, accumulate_dx ? 1.0f : 0.0f, dx, s.in);
  if (s.has_lora())
    ops.gemm(Op::n, Op::t, n, s.in, s.rank, 1.0f, du_op, s.rank, w.a_t, s.rank, w.type, 1.0f, dx, s.in);
}

void fill_normal(ShardedProjection& p, ProjectionPart part, uint64_t seed, uint64_t stream, float scale) {
  const int64_t cols = part == ProjectionPart::lora_b ? p.shape().rank : p.shape().in;
  p.fill(part, [&](int64_t i, int64_t j) { return scale * random_normal(seed, stream, uint64_t(i * cols + j)); });
}

void init_lora_factors(ShardedProjection& p, uint64_t seed, uint64_t stream) {
  fill_normal(p, ProjectionPart::lora_a, seed, stream, float(1.0 / std::sqrt(3.0 * double(p.shape().in))));
  p.fill(ProjectionPart::lora_b, [](int64_t, int64_t) { return 0.0f; });
}

std::vector<float> merge_rows(const ShardedProjection& p, std::span<const float> a_t, float scaling) {
  const ProjectionShape& s = p.shape();
  std::vector<float> out(p.w0().begin(), p.w0().end());
  const int64_t rows = p.rows().end - p.rows().begin;
  if (s.has_lora())
    host_sgemm(Op::n, Op::t, rows, s.in, s.rank, scaling, p.lora_b().data(), s.rank, a_t.data(), s.rank, 1.0f,
               out.data(), s.in);
  return out;
}

}  // namespace ringattn
