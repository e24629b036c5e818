#include "runtime/lora/projection.hpp"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "comm/stopwatch.hpp"
#include "runtime/random_inputs.hpp"

namespace ringattn {

namespace {

// Rows per GEMM call between progress() calls: large enough that BLAS runs at speed, small
// enough that a gather in flight is served every few hundred microseconds.
constexpr int64_t kRowBlock = 256;

void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha,
              a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace

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
  float* dst = part == ProjectionPart::w0 ? w0_.data() : part == ProjectionPart::bias ? bias_.data() : lora_.data();
  for_each_owned(part, [&](int64_t i, int64_t j, size_t index) { dst[index] = value(i, j); });
}

void GatheredProjection::release() {
  std::vector<float>().swap(w0);
  std::vector<float>().swap(bias);
  std::vector<float>().swap(a_t);
  std::vector<float>().swap(b);
}

void ProjectionGather::start(comm::Communicator& comm, const ShardedProjection& p, GatheredProjection& dst, int tag) {
  const ProjectionShape& s = p.shape();
  const int P = comm.size(), me = comm.rank();
  constexpr int kParts = 4;  // W0, A^T, B, bias
  dst.shape = s;
  dst.w0.resize(static_cast<size_t>(s.out * s.in));
  dst.bias.resize(static_cast<size_t>(s.bias ? s.out : 0));
  dst.a_t.resize(static_cast<size_t>(s.in * s.rank));
  dst.b.resize(static_cast<size_t>(s.out * s.rank));
  // Where rank q's slices go in the gathered tensors, and how long they are.
  struct Piece {
    float* at;
    size_t elements;
  };
  auto pieces = [&](int q) {
    const RowRange r = p.rows(q), c = p.cols(q);
    return std::array<Piece, kParts>{
        Piece{dst.w0.data() + r.begin * s.in, static_cast<size_t>((r.end - r.begin) * s.in)},
        Piece{dst.a_t.data() + c.begin * s.rank, p.a_elements(q)}, Piece{dst.b.data() + r.begin * s.rank, p.b_elements(q)},
        Piece{dst.bias.data() + (s.bias ? r.begin : 0), static_cast<size_t>(s.bias ? r.end - r.begin : 0)}};
  };
  const std::array<const float*, kParts> mine = {p.w0().data(), p.lora_a_t().data(), p.lora_b().data(),
                                                 p.bias().data()};
  const std::array<Piece, kParts> own = pieces(me);
  for (int part = 0; part < kParts; ++part)
    if (own[part].elements) std::memcpy(own[part].at, mine[part], own[part].elements * sizeof(float));
  for (int step = 1; step < P; ++step) {
    const int to = (me + step) % P, from = (me - step + P) % P;
    const std::array<Piece, kParts> theirs = pieces(from);
    for (int part = 0; part < kParts; ++part) {
      const int part_tag = tag * kParts + part;
      if (theirs[part].elements)
        requests_.push_back(comm.irecv(theirs[part].at, theirs[part].elements * sizeof(float), from, part_tag));
      if (own[part].elements)
        requests_.push_back(comm.isend(mine[part], own[part].elements * sizeof(float), to, part_tag));
    }
  }
}

double ProjectionGather::finish(comm::Communicator& comm, const std::string& what) {
  const comm::Stopwatch blocked;
  for (comm::Request& r : requests_) comm.wait(r, what);
  requests_.clear();
  return blocked.seconds();
}

void projection_forward(const GatheredProjection& w, float scaling, const float* x, int64_t n, float* y, float* u,
                        const std::function<void()>& progress) {
  const ProjectionShape& s = w.shape;
  for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, n - r0);
    const float* xb = x + r0 * s.in;
    float* yb = y + r0 * s.out;
    sgemm(CblasNoTrans, CblasTrans, m, s.out, s.in, 1.0f, xb, s.in, w.w0.data(), s.in, 0.0f, yb, s.out);
    if (!w.bias.empty())
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < s.out; ++j) yb[i * s.out + j] += w.bias[size_t(j)];
    if (s.has_lora()) {
      float* ub = u + r0 * s.rank;
      sgemm(CblasNoTrans, CblasNoTrans, m, s.rank, s.in, 1.0f, xb, s.in, w.a_t.data(), s.rank, 0.0f, ub, s.rank);
      sgemm(CblasNoTrans, CblasTrans, m, s.out, s.rank, scaling, ub, s.rank, w.b.data(), s.rank, 1.0f, yb, s.out);
    }
    if (progress) progress();
  }
}

void projection_backward(const GatheredProjection& w, float scaling, const float* x, const float* u, const float* dy,
                         int64_t n, float* dx, bool accumulate_dx, float* grad_a_t, float* grad_b,
                         const std::function<void()>& progress) {
  const ProjectionShape& s = w.shape;
  std::vector<float> du;
  if (s.has_lora()) {
    du.resize(static_cast<size_t>(n * s.rank));
    sgemm(CblasNoTrans, CblasNoTrans, n, s.rank, s.out, scaling, dy, s.out, w.b.data(), s.rank, 0.0f, du.data(),
          s.rank);
    sgemm(CblasTrans, CblasNoTrans, s.out, s.rank, n, scaling, dy, s.out, u, s.rank, 1.0f, grad_b, s.rank);
    sgemm(CblasTrans, CblasNoTrans, s.in, s.rank, n, 1.0f, x, s.in, du.data(), s.rank, 1.0f, grad_a_t, s.rank);
    if (progress) progress();
  }
  if (!dx) return;
  for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, n - r0);
    float* dxb = dx + r0 * s.in;
    sgemm(CblasNoTrans, CblasNoTrans, m, s.in, s.out, 1.0f, dy + r0 * s.out, s.out, w.w0.data(), s.in,
          accumulate_dx ? 1.0f : 0.0f, dxb, s.in);
    if (s.has_lora())
      sgemm(CblasNoTrans, CblasTrans, m, s.in, s.rank, 1.0f, du.data() + r0 * s.rank, s.rank, w.a_t.data(), s.rank,
            1.0f, dxb, s.in);
    if (progress) progress();
  }
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
    sgemm(CblasNoTrans, CblasTrans, rows, s.in, s.rank, scaling, p.lora_b().data(), s.rank, a_t.data(), s.rank, 1.0f,
          out.data(), s.in);
  return out;
}

void set_blas_threads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

}  // namespace ringattn
