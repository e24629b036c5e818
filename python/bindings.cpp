// The Python module's compiled half (ringattn._ringattn): the library's API (include/ringattn/
// ringattn.hpp) with tensors as data pointers and shapes, so that no libtorch is linked and one
// build serves every PyTorch. The tensor checks and autograd are in ringattn/__init__.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <string_view>
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

// A shard as the package passes it: (B, L_local, H, Hkv, D, dtype), dtype "float32", "bfloat16"
// or "float16" (the package has checked the tensors' dtypes).
using ShardTuple = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, std::string>;

Shard make_shard(const ShardTuple& s) {
  const std::string& dtype = std::get<5>(s);
  const ElementType type = dtype == "bfloat16" ? ElementType::bfloat16
                           : dtype == "float16" ? ElementType::float16
                                                : ElementType::float32;
  return Shard{std::get<0>(s), std::get<1>(s), std::get<2>(s), std::get<3>(s), std::get<4>(s), type};
}

// The layout's name (None, i.e. "", as on the command line: zigzag when causal, else contiguous);
// the one place a Python caller's layout name is judged.
SequenceLayout layout_of(const std::string& name) {
  if (name.empty()) return SequenceLayout::automatic;
  if (name == "contiguous") return SequenceLayout::contiguous;
  if (name == "zigzag") return SequenceLayout::zigzag;
  if (name == "striped") return SequenceLayout::striped;
  throw ArgumentError("layout", "{layout} '" + name + "': expected None, 'contiguous', 'zigzag' or 'striped'");
}

AttentionKernel kernel_of(const std::string& name) {
  if (name == "auto") return AttentionKernel::automatic;
  if (name == "cudnn") return AttentionKernel::cudnn;
  if (name == "own") return AttentionKernel::own;
  throw ArgumentError("kernel", "{kernel} '" + name + "': expected 'auto', 'cudnn' or 'own'");
}

KeyValueSchedule schedule_of(const std::string& name) {
  if (name == "direct") return KeyValueSchedule::direct;
  if (name == "ring") return KeyValueSchedule::ring;
  throw ArgumentError("schedule", "{schedule} '" + name + "': expected 'direct' or 'ring'");
}

// How Python names the library's arguments: the keyword where attention() has one, the tensor
// shape or option that gives the value otherwise.
std::string python_name(std::string_view argument) {
  static const std::map<std::string, std::string, std::less<>> names = {
      {"batch", "q.shape[0]"},      {"rows", "q.shape[1]"},        {"heads", "q.shape[2]"},
      {"kv_heads", "k.shape[2]"},   {"head_dim", "q.shape[3]"},    {"dtype", "q.dtype"},
      {"seq_len", "the sequence length (q.shape[1] summed over the ranks)"},
      {"backend", "the tensors' device"}, {"comm", "comm"},      {"threads", "threads"},
      {"timeout_s", "timeout"},     {"spec", "the attention keywords"}, {"options", "the context's options"},
      {"window_left", "window[0]"}, {"tokens", "q.shape[1]"}};
  const auto it = names.find(argument);
  return it != names.end() ? it->second : std::string(argument);
}

AttentionSpec make_spec(bool causal, int64_t window_left, int64_t window_right, std::vector<int64_t> doc_lens,
                        const py::bytes& block_mask, int64_t mask_block,
                        std::optional<std::tuple<int64_t, int64_t, int64_t>> bigbird, uint64_t seed, double scale,
                        const std::string& layout, const std::string& schedule, int ulysses,
                        const std::string& kernel, bool deterministic) {
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
  spec.layout = layout_of(layout);
  spec.schedule = schedule_of(schedule);
  spec.ulysses = ulysses;
  spec.kernel = kernel_of(kernel);
  spec.deterministic = deterministic;
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

// A problem the package found on this rank: (argument, message template, type error).
using FailTuple = std::tuple<std::string, std::string, bool>;
std::optional<ArgumentError> local_error(const std::optional<FailTuple>& f) {
  if (!f) return std::nullopt;
  return ArgumentError(std::get<0>(*f), std::get<1>(*f),
                       std::get<2>(*f) ? ArgumentError::Kind::type : ArgumentError::Kind::value);
}

}  // namespace

PYBIND11_MODULE(_ringattn, m) {
  m.doc() = "ringattn's compiled half: the C++ API with tensors as pointers (use the ringattn package)";
  static py::exception<ArgumentError> unused(m, "_ArgumentError");  // never raised: see the translator
  (void)unused;
  // The library's errors in Python's words: a bad argument is a TypeError or ValueError naming the
  // keyword (or the tensor shape) that gave it; a fault is a RuntimeError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ArgumentError& e) {
      PyErr_SetString(e.kind() == ArgumentError::Kind::type ? PyExc_TypeError : PyExc_ValueError,
                      e.render(python_name).c_str());
    } catch (const Fault& e) {
      PyErr_SetString(PyExc_RuntimeError, ArgumentError::render_template(e.what(), python_name).c_str());
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
  // (spec, None), or (None, (argument, message template, type error)) for the caller to make every
  // rank raise (Context.fail): a name the library does not know is this rank's alone to find.
  m.def("make_spec", [](py::args args) -> py::tuple {
    try {
      return py::make_tuple(py::cast(make_spec(args[0].cast<bool>(), args[1].cast<int64_t>(), args[2].cast<int64_t>(),
                                               args[3].cast<std::vector<int64_t>>(), args[4].cast<py::bytes>(),
                                               args[5].cast<int64_t>(),
                                               args[6].cast<std::optional<std::tuple<int64_t, int64_t, int64_t>>>(),
                                               args[7].cast<uint64_t>(), args[8].cast<double>(),
                                               args[9].cast<std::string>(), args[10].cast<std::string>(),
                                               args[11].cast<int>(), args[12].cast<std::string>(),
                                               args[13].cast<bool>())),
                            py::none());
    } catch (const ArgumentError& e) {
      return py::make_tuple(py::none(), py::make_tuple(e.argument(), e.message_template(),
                                                        e.kind() == ArgumentError::Kind::type));
    }
  });

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
      .def("set_cuda_stream", [](Context& c, uintptr_t stream) { c.set_cuda_stream(reinterpret_cast<void*>(stream)); })
      .def("positions",
           [](const Context& c, int64_t L, bool causal, const std::string& layout, int rank, int ulysses) {
             AttentionSpec spec;
             spec.mask.causal = causal;
             spec.layout = layout_of(layout);
             spec.ulysses = ulysses;
             return c.positions(L, spec, rank);
           })
      // A problem found on this rank only (a type, a name): every rank raises it (the agreement).
      .def("fail",
           [](Context& c, const std::string& argument, const std::string& message_template, bool type_error) {
             c.check(Shard{}, AttentionSpec{},
                     ArgumentError(argument, message_template,
                                   type_error ? ArgumentError::Kind::type : ArgumentError::Kind::value));
           })
      .def(
          "forward",
          [](Context& c, const ShardTuple& shard, const AttentionSpec& spec, uintptr_t q, uintptr_t k, uintptr_t v,
             uintptr_t o, uintptr_t lse, std::optional<uintptr_t> stream) {
            RingStats s;
            ForwardHandle saved;
            {
              py::gil_scoped_release release;
              use_stream(c, stream);
              s = c.forward(make_shard(shard), spec, ptr<const void>(q), ptr<const void>(k), ptr<const void>(v),
                            ptr<float>(o), ptr<float>(lse), &saved);
            }
            py::dict d = stats_dict(s);
            d["saved"] = py::make_tuple(saved.plan, saved.pass);  // for the backward of these tensors
            return d;
          })
      .def(
          "backward",
          [](Context& c, const ShardTuple& shard, const AttentionSpec& spec, uintptr_t q, uintptr_t k, uintptr_t v,
             uintptr_t o, uintptr_t lse, uintptr_t dout, uintptr_t dq, uintptr_t dk, uintptr_t dv,
             std::optional<uintptr_t> stream, std::optional<std::tuple<uint64_t, uint64_t>> saved) {
            RingStats s;
            {
              py::gil_scoped_release release;
              use_stream(c, stream);
              const ForwardHandle handle = saved ? ForwardHandle{std::get<0>(*saved), std::get<1>(*saved)}
                                                 : ForwardHandle{};
              s = c.backward(make_shard(shard), spec, ptr<const void>(q), ptr<const void>(k), ptr<const void>(v),
                             ptr<const float>(o), ptr<const float>(lse), ptr<const void>(dout), ptr<float>(dq),
                             ptr<float>(dk), ptr<float>(dv), saved ? &handle : nullptr);
            }
            return stats_dict(s);
          })
      .def("allgather_bytes", [](Context& c, uintptr_t send, size_t bytes, uintptr_t recv,
                                 const std::vector<size_t>& per_rank) {
        py::gil_scoped_release release;
        c.allgather_bytes(ptr<const void>(send), bytes, ptr<void>(recv), per_rank);
      });

  // The inference path (ringattn.KVCache, prefill, decode): tensors as pointers (a CUDA caller's
  // stream is the context's: Context.set_cuda_stream).
  py::class_<KVCache>(m, "KVCache")
      .def(py::init([](Context& c, int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t capacity,
                       const std::string& dtype, int64_t interleave) {
             CacheOptions o{batch, kv_heads, head_dim, capacity, interleave,
                            dtype == "bfloat16" ? ElementType::bfloat16 : ElementType::float32};
             return new KVCache(c, o);
           }),
           py::keep_alive<1, 2>())
      .def("lengths", &KVCache::lengths)
      .def("rows", &KVCache::rows, py::arg("sequence"), py::arg("rank") = -1)
      .def("prefill_positions",
           [](const KVCache& c, int64_t tokens, int64_t window_left, const std::string& method) {
             InferenceSpec spec;
             spec.window_left = window_left;
             spec.method = method == "pass-q" ? PrefillMethod::pass_q : PrefillMethod::pass_kv;
             return c.prefill_positions(tokens, spec);
           })
      .def("prefill",
           [](KVCache& c, int64_t heads, int64_t rows, int64_t window_left, const std::string& method, uintptr_t q,
              uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse, const std::optional<FailTuple>& fail) {
             InferenceSpec spec;
             spec.window_left = window_left;
             if (method == "auto") spec.method = PrefillMethod::automatic;
             else if (method == "pass-kv") spec.method = PrefillMethod::pass_kv;
             else if (method == "pass-q") spec.method = PrefillMethod::pass_q;
             std::optional<ArgumentError> problem = local_error(fail);
             if (!problem && method != "auto" && method != "pass-kv" && method != "pass-q")
               problem = ArgumentError("method", "{method} '" + method + "': expected 'auto', 'pass-kv' or 'pass-q'");
             InferenceStats st;
             {
               py::gil_scoped_release release;
               st = c.prefill(heads, spec, rows, ptr<const void>(q), ptr<const void>(k), ptr<const void>(v),
                              ptr<float>(o), ptr<float>(lse), problem);
             }
             return st.method == PrefillMethod::pass_q ? "pass-q" : "pass-kv";
           })
      .def("decode", [](KVCache& c, int64_t heads, int64_t tokens, int64_t window_left, uintptr_t q, uintptr_t k,
                        uintptr_t v, uintptr_t o, uintptr_t lse, const std::optional<FailTuple>& fail) {
        InferenceSpec spec;
        spec.window_left = window_left;
        const std::optional<ArgumentError> problem = local_error(fail);
        py::gil_scoped_release release;
        c.decode(heads, tokens, spec, ptr<const void>(q), ptr<const void>(k), ptr<const void>(v), ptr<float>(o),
                 ptr<float>(lse), problem);
      });
}
