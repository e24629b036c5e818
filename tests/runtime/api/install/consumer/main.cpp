// Causal attention over 256 positions sharded over the ranks, through the installed library:
// each rank's o against an fp64 computation of its rows, a backward pass, and a bad argument
// (heads that differ between ranks) reported on every rank. Exits 0 when all holds.
#include <ringattn/ringattn.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

float value(int64_t pos, int64_t c, int tensor) { return std::sin(0.37 * double(pos) + 0.11 * double(c) + tensor); }

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int failures = 0;
  {
    ringattn::ContextOptions options;
    options.threads = 1;
    options.timeout_s = 30;
    ringattn::Context ctx(MPI_COMM_WORLD, options);
    const int64_t L = 256, H = 2, D = 16;
    ringattn::AttentionSpec spec;
    spec.mask.causal = true;
    const std::vector<int64_t> pos = ctx.positions(L, spec);
    const int64_t rows = static_cast<int64_t>(pos.size());
    std::vector<float> q(rows * H * D), k(q.size()), v(q.size()), dout(q.size(), 1.0f);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t c = 0; c < H * D; ++c) {
        q[t * H * D + c] = value(pos[t], c, 0);
        k[t * H * D + c] = value(pos[t], c, 1);
        v[t * H * D + c] = value(pos[t], c, 2);
      }
    std::vector<float> o(q.size()), lse(H * rows), dq(q.size()), dk(q.size()), dv(q.size());
    const ringattn::Shard shard{1, rows, H, H, D, ringattn::ElementType::float32};
    ctx.forward(shard, spec, q.data(), k.data(), v.data(), o.data(), lse.data());
    ctx.backward(shard, spec, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                 dv.data());
    double err = 0.0;
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> p(pos[t] + 1);
        double m = -1e300, sum = 0.0;
        for (int64_t j = 0; j <= pos[t]; ++j) {
          double s = 0.0;
          for (int64_t d = 0; d < D; ++d) s += double(value(pos[t], h * D + d, 0)) * value(j, h * D + d, 1);
          p[j] = s / std::sqrt(double(D));
          m = std::max(m, p[j]);
        }
        for (double& x : p) sum += (x = std::exp(x - m));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j <= pos[t]; ++j) acc += p[j] * value(j, h * D + d, 2);
          err = std::max(err, std::abs(acc / sum - o[t * H * D + h * D + d]));
        }
      }
    if (!(err < 1e-4)) {
      std::fprintf(stderr, "rank %d: o differs from fp64 by %g\n", ctx.rank(), err);
      ++failures;
    }
    // One rank's k has other heads than the others': every rank hears of it, naming k.
    ringattn::Shard wrong = shard;
    if (ctx.rank() == 0) wrong.kv_heads = 1;
    try {
      ctx.forward(wrong, spec, q.data(), k.data(), v.data(), o.data(), lse.data());
      std::fprintf(stderr, "rank %d: a wrong shard was accepted\n", ctx.rank());
      ++failures;
    } catch (const ringattn::ArgumentError& e) {
      if (e.argument() != "k") ++failures;
    }
    if (ctx.rank() == 0) std::printf("consumer: %d ranks, max |o - fp64| %.2e, plans %zu\n", ctx.size(), err,
                                     ctx.cached_plans());
  }
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}
