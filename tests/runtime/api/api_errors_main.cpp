// A user's program of the C++ API (only <ringattn/ringattn.hpp>): makes one bad call, named by
// argv[1], and prints the ArgumentError's message, for tests/runtime/api/argument_words.py, which
// compares it with what the command line and Python say of the same bad input. Exit 0 when the
// call threw ArgumentError, 1 otherwise.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ringattn/ringattn.hpp"

namespace {

// The case's shard and spec: a sequence of `L` positions on this one rank.
struct Call {
  ringattn::Shard shard{1, 64, 8, 8, 64, ringattn::ElementType::float32};
  ringattn::AttentionSpec spec;
};

bool make_call(const std::string& name, Call& c) {
  if (name == "kv-heads") c.shard.kv_heads = 3;
  else if (name == "window") c.spec.mask.window_left = -2, c.spec.mask.window_right = 5;
  else if (name == "scale") c.spec.softmax_scale = -1.0;
  else if (name == "head-dim") c.shard.head_dim = 600;  // past every backend's kernels (CPU: 512, CUDA: 256)
  else if (name == "doc-lens") c.spec.mask.doc_lens = {40, 23};
  else if (name == "ulysses") c.spec.ulysses = 2;
  else return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int code = 1;
  {
    Call c;
    if (argc != 2 || !make_call(argv[1], c)) {
      std::fprintf(stderr, "usage: %s kv-heads|window|scale|head-dim|doc-lens|ulysses\n", argv[0]);
      MPI_Finalize();
      return 2;
    }
    ringattn::Context ctx;
    std::vector<float> q(size_t(c.shard.rows * c.shard.heads * 512)), kv(q.size()), o(q.size()), lse(q.size());
    try {
      ctx.forward(c.shard, c.spec, q.data(), kv.data(), kv.data(), o.data(), lse.data());
      std::printf("no error\n");
    } catch (const ringattn::ArgumentError& e) {
      std::printf("%s\n", e.what());
      code = 0;
    }
  }
  MPI_Finalize();
  return code;
}
