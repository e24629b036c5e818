// The Python module's compiled half (ringattn._ringattn): the library's API (include/ringattn/
// ringattn.hpp) with tensors as data pointers and shapes, so that no libtorch is linked and one
// build serves every PyTorch. The tensor checks and autograd are in ringattn/__init__.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ringattn/ringattn.hpp"

namespace py = pybind11;
using namespace ringattn;

namespace {

bool we_initialised_mpi = false;

// MPI is started here unless the program (or mpi4py) has started it already.
void ensure_mpi() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return;
  int provided = 0;
  // SERIALIZED, not FUNNELED: autograd runs the backward of CUDA tensors on its own device thread.
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  we_initialised_mpi = true;
}

MPI_Comm comm_of(uintptr_t handle) {
  ensure_mpi();
  return handle == 0 ? MPI_COMM_WORLD : reinterpret_cast<MPI_Comm>(handle);
}

template <class T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

Shard make_shard(const std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>& s) {
  return Shard{std::get<0>(s), std::get<1>(s), std::get<2>(s), std::get<3>(s), std::get<4>(s),
               std::get<5>(s) ? ElementType::bfloat16 : ElementType::float32};
}

SequenceLayout layout_of(const std::string& name, bool causal) {
  if (name == "contiguous") return SequenceLayout::contiguous;
  if (name == "zigzag") return SequenceLayout::zigzag;
  if (name == "striped") return SequenceLayout::striped;
  return causal ? SequenceLayout::zigzag : SequenceLayout::contiguous;  // "" as on the command line
}

AttentionSpec make_spec(bool causal, int64_t window_left, int64_t window_right, std::vector<int64_t> doc_lens,
                        const py::bytes& block_mask, int64_t mask_block,
                        std::optional<std::tuple<int64_t, int64_t, int64_t>> bigbird, uint64_t seed, double scale,
                        const std::string& layout, const std::string& schedule, int ulysses) {
  AttentionSpec spec;
  spec.mask.causal = causal;
  spec.mask.window_left = window_left;
  spec.mask.window_right = window_right;
  spec.mask.doc_lens = std::move(doc_lens);
  const std::string bytes = block_mask;
  spec.mask.block_mask.assign(bytes.begin(), bytes.end());
  spec.mask.mask_block = mask_block;
  if (bigbird) {
    spec.mask.bigbird_global = std::get<0>(*bigbird);
    spec.mask.bigbird_window = std::get<1>(*bigbird);
    spec.mask.bigbird_random = std::get<2>(*bigbird);
    spec.mask.bigbird_seed = seed;
  }
  spec.softmax_scale = scale;
  spec.layout = layout_of(layout, causal);
  spec.schedule = schedule == "ring" ? KeyValueSchedule::ring : KeyValueSchedule::direct;
  spec.ulysses = ulysses;
  return spec;
}

py::dict stats_dict(const RingStats& s) {
  py::dict d;
  d["seconds"] = s.seconds;
  d["wait_seconds"] = s.wait_seconds;
  d["compute_seconds"] = s.compute_seconds;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_needed"] = s.bytes_needed;
  d["a2a_bytes_sent"] = s.a2a_bytes_sent;
  return d;
}

// A CUDA caller's stream (PyTorch's current stream, as an integer; None for host tensors): the
// call is ordered after the work queued on it and before the work queued on it later.
void use_stream(Context& c, const std::optional<uintptr_t>& stream) {
  if (stream) c.set_cuda_stream(reinterpret_cast<void*>(*stream));
}

}  // namespace

PYBIND11_MODULE(_ringattn, m) {
  m.doc() = "ringattn's compiled half: the C++ API with tensors as pointers (use the ringattn package)";
  static py::exception<ArgumentError> unused(m, "_ArgumentError");  // never raised: see the translator
  (void)unused;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ArgumentError& e) {
      PyErr_SetString(e.kind() == ArgumentError::Kind::type ? PyExc_TypeError : PyExc_ValueError, e.what());
    }
  });

  m.def("version", &version);
  m.def("bigbird_block_mask", [](int64_t blocks, int64_t global, int64_t window, int64_t random, uint64_t seed) {
    const std::vector<uint8_t> mask = bigbird_block_mask(blocks, global, window, random, seed);
    return py::bytes(reinterpret_cast<const char*>(mask.data()), mask.size());
  });
  m.def("comm_rank", [](uintptr_t h) {
    int r = 0;
    MPI_Comm_rank(comm_of(h), &r);
    return r;
  });
  m.def("comm_size", [](uintptr_t h) {
    int n = 0;
    MPI_Comm_size(comm_of(h), &n);
    return n;
  });
  m.def("finalize", [] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (we_initialised_mpi && !finalized) MPI_Finalize();
  });
  m.def("mpi_finalized", [] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    return finalized != 0;
  });

  py::class_<AttentionSpec>(m, "Spec");
  m.def("make_spec", &make_spec);

  py::class_<Context>(m, "Context")
      .def(py::init([](uintptr_t handle, const std::string& backend, const std::string& comm, int threads,
                       double timeout) {
             ContextOptions o;
             o.backend = backend;
             o.comm = comm;
             o.threads = threads;
             o.timeout_s = timeout;
             return new Context(comm_of(handle), o);
           }),
           py::arg("handle"), py::arg("backend"), py::arg("comm"), py::arg("threads"), py::arg("timeout"))
      .def("rank", &Context::rank)
      .def("size", &Context::size)
      .def("cached_plans", &Context::cached_plans)
      .def("positions",
           [](const Context& c, int64_t L, bool causal, const std::string& layout, int rank, int ulysses) {
             AttentionSpec spec;
             spec.mask.causal = causal;
             spec.layout = layout_of(layout, causal);
             spec.ulysses = ulysses;
             return c.positions(L, spec, rank);
           })
      .def("fail",
           [](Context& c, const std::string& argument, const std::string& message, bool type_error) {
             const ArgumentError e(argument, message, type_error ? ArgumentError::Kind::type : ArgumentError::Kind::value);
             c.check(Shard{}, AttentionSpec{}, &e);
           })
      .def(
          "forward",
          [](Context& c, const std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>& shard,
             const AttentionSpec& spec, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse,
             std::optional<uintptr_t> stream) {
            RingStats s;
            {
              py::gil_scoped_release release;
              use_stream(c, stream);
              s = c.forward(make_shard(shard), spec, ptr<const void>(q), ptr<const void>(k), ptr<const void>(v),
                            ptr<float>(o), ptr<float>(lse));
            }
            return stats_dict(s);
          })
      .def(
          "backward",
          [](Context& c, const std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>& shard,
             const AttentionSpec& spec, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse,
             uintptr_t dout, uintptr_t dq, uintptr_t dk, uintptr_t dv, std::optional<uintptr_t> stream) {
            RingStats s;
            {
              py::gil_scoped_release release;
              use_stream(c, stream);
              s = c.backward(make_shard(shard), spec, ptr<const void>(q), ptr<const void>(k), ptr<const void>(v),
                             ptr<const float>(o), ptr<const float>(lse), ptr<const void>(dout), ptr<float>(dq),
                             ptr<float>(dk), ptr<float>(dv));
            }
            return stats_dict(s);
          })
      .def("allgather_bytes", [](Context& c, uintptr_t send, size_t bytes, uintptr_t recv,
                                 const std::vector<size_t>& per_rank) {
        py::gil_scoped_release release;
        c.allgather_bytes(ptr<const void>(send), bytes, ptr<void>(recv), per_rank);
      });
}
