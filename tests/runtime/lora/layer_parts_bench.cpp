// The layer's overhead over its parts, measured in the same run (README "The LoRA attention layer"):
//
//   layer  = forward + backward of LoraLayer (gathers, projections, rope, biases, the ring,
//            the gradient reduce-scatter), the slowest rank's time;
//   parts  = the same projection GEMMs (projection_forward / projection_backward on this rank's
//            rows, parameters already local, on the CPU's LayerOps) + the attention as the
//            attention job runs it (the API's forward + backward on the same shard), the slowest
//            rank's time.
//
// Each is the median of --iters repetitions, interleaved so that both see the same machine. Prints
// one row and exits 1 when layer / parts exceeds --limit (default 1.15), nccl-tests style.
//   mpirun -np 2 build/ringattn_layer_parts_bench [L d_model heads kv_heads r iters limit]
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "util/stopwatch.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/lora/layer.hpp"
#include "runtime/session.hpp"
#include "tests/support/test_util.hpp"

using namespace ringattn;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double slowest(comm::Communicator& comm, double seconds) {
  comm.allreduce(&seconds, 1, DType::f64, comm::ReduceOp::max);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int code = 0;
  {
    auto comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
    auto arg = [&](int i, double fallback) { return argc > i ? std::atof(argv[i]) : fallback; };
    LayerConfig c;
    c.seq_len = int64_t(arg(1, 4096)), c.d_model = int64_t(arg(2, 1024)), c.heads = int64_t(arg(3, 8));
    c.kv_heads = int64_t(arg(4, 8)), c.lora_rank = int64_t(arg(5, 16));
    const int iters = int(arg(6, 5));
    const double limit = arg(7, 1.15);
    c.lora_alpha = double(2 * c.lora_rank);
    c.lora.fill(true);
    c.bias = {true, true, true, false};  // Qwen2-style
    c.rope.theta = 10000.0;
    c.threads = 1;
    AttentionSpec spec;
    spec.mask.causal = true;
    spec.layout = SequenceLayout::zigzag;
    ContextOptions options;
    options.threads = c.threads;
    Session session(MPI_COMM_WORLD, SessionOptions{options, {}});
    LoraLayer layer(session, c, spec);
    for (int p = 0; p < kProjections; ++p) {
      fill_normal(layer.projection(p), ProjectionPart::w0, 1, 40 + p, 0.03f);
      fill_normal(layer.projection(p), ProjectionPart::lora_a, 1, 50 + p, 0.03f);
      fill_normal(layer.projection(p), ProjectionPart::lora_b, 1, 60 + p, 0.03f);
    }
    const size_t n = layer.activation_elements();
    const int64_t N = c.batch * layer.rows(), D = c.head_dim();
    const std::vector<float> x = testing::random_vector(n, 1), dy = testing::random_vector(n, 2);
    std::vector<float> y(n), dx(n);

    // The parts: the four projections with whole local parameters, and the attention of the same
    // shape through the same session (the layer's plan).
    std::vector<std::vector<float>> storage(kProjections);
    std::vector<GatheredProjection> whole(kProjections);
    for (int p = 0; p < kProjections; ++p) {
      const ProjectionShape s = c.shape(p);
      storage[size_t(p)].resize(GatheredProjection::bytes(s, DType::f32) / sizeof(float));
      whole[size_t(p)] = GatheredProjection::at(storage[size_t(p)].data(), s, DType::f32);
      auto fill = [&](void* at, size_t n, uint64_t seed) {
        const std::vector<float> v = testing::random_vector(n, seed, 0.03f);
        std::copy(v.begin(), v.end(), static_cast<float*>(at));
      };
      fill(whole[size_t(p)].w0, size_t(s.out * s.in), 10 + p);
      fill(whole[size_t(p)].a_t, size_t(s.in * s.rank), 20 + p);
      fill(whole[size_t(p)].b, size_t(s.out * s.rank), 30 + p);
      if (s.bias) std::fill(whole[size_t(p)].bias, whole[size_t(p)].bias + s.out, 0.1f);
    }
    const std::unique_ptr<LayerOps> ops = make_layer_ops(session.backend(), c.threads);
    const Shard shard{c.batch, layer.rows(), c.heads, c.kv_heads, D, ElementType::float32};
    UlyssesAttention& attention = session.plan(shard, spec, c.seq_len).attention();
    const std::vector<float> q = testing::random_vector(size_t(N * c.heads * D), 3);
    const std::vector<float> k = testing::random_vector(size_t(N * c.kv_heads * D), 4), v = k;
    std::vector<float> o(q.size()), lse(size_t(c.batch * c.heads * layer.rows())), dq(q.size()), dk(k.size()),
        dv(k.size());
    std::vector<float> proj_out(size_t(N * c.d_model * 2)), u(size_t(N * c.lora_rank)), grads(
        size_t((2 * c.d_model) * c.lora_rank * 2)), du(u.size());
    auto parts = [&] {
      double t = 0;
      for (int p = 0; p < kProjections; ++p) {
        const Stopwatch w;
        projection_forward(*ops, whole[size_t(p)], c.scaling(), p == kOutput ? o.data() : x.data(), N,
                           proj_out.data(), u.data(), u.data());
        t += w.seconds();
      }
      comm->barrier();
      const Stopwatch a;
      attention.forward(q.data(), k.data(), v.data(), o.data(), lse.data());
      attention.backward(q.data(), k.data(), v.data(), o.data(), lse.data(), q.data(), dq.data(), dk.data(), dv.data(),
                         attention.last_forward());
      t += a.seconds();
      for (int p = kProjections - 1; p >= 0; --p) {
        const ProjectionShape& s = whole[size_t(p)].shape;
        std::fill(grads.begin(), grads.end(), 0.0f);
        const Stopwatch w;
        projection_backward(*ops, whole[size_t(p)], c.scaling(), p == kOutput ? o.data() : x.data(), u.data(),
                            p == kOutput ? dy.data() : p == kQuery ? dq.data() : dk.data(), N,
                            p == kOutput ? proj_out.data() : dx.data(), p != kValue && p != kOutput, grads.data(),
                            grads.data() + s.in * s.rank, du.data(), du.data());
        t += w.seconds();
      }
      return slowest(*comm, t);
    };
    auto whole_layer = [&] {
      comm->barrier();
      const Stopwatch t;
      layer.forward(x.data(), y.data());  // (host memory: the CPU backend's)
      layer.backward(x.data(), dy.data(), dx.data());
      return slowest(*comm, t.seconds());
    };
    parts(), whole_layer();  // warm-up
    std::vector<double> layer_s, parts_s;
    for (int i = 0; i < iters; ++i) layer_s.push_back(whole_layer()), parts_s.push_back(parts());
    const double ratio = median(layer_s) / median(parts_s);
    if (comm->rank() == 0) {
      std::printf("# layer forward+backward vs its parts (projection GEMMs + ring attention), same run, median of %d\n",
                  iters);
      std::printf("# ranks  seq_len  d_model  heads  kv  r   layer_s   parts_s   ratio  limit  #wrong\n");
      std::printf("%7d %8lld %8lld %6lld %3lld %2lld  %8.4f  %8.4f  %6.3f  %5.2f  %6d\n", comm->size(),
                  (long long)c.seq_len, (long long)c.d_model, (long long)c.heads, (long long)c.kv_heads,
                  (long long)c.lora_rank, median(layer_s), median(parts_s), ratio, limit, ratio > limit ? 1 : 0);
    }
    code = ratio > limit ? 1 : 0;
  }
  MPI_Finalize();
  return code;
}
