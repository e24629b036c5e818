// cuDNN's fused attention through cudnn-frontend's Graph API (kernels/cudnn/sdpa_engine.hpp), with
// libcudnn loaded when first needed (the frontend's dynamic loading: NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING,
// cudnn_frontend::cudnn_dlhandle), so that the build never links it and a machine without it, or
// with one older than 9.0, runs our kernels. RINGATTN_CUDNN_LIBRARY names the library to load
// (e.g. PyTorch's nvidia/cudnn/lib/libcudnn.so.9); else libcudnn.so.9 from the loader's path.
//
// Graphs follow cudnn-frontend's SDPA samples (samples/cpp/sdpa): bf16 I/O, fp32 intermediates and
// compute, Q, K, V, O as (batch, heads, s, D) over row-major (rows, heads, D) memory, Stats fp32
// (batch, heads, s_q, 1), ragged offsets on every token tensor of a ragged call with the padding
// mask's per-sequence lengths, the diagonal band's bounds and alignment as planned, the tile mask
// as a (batch, heads, tiles_q, ceil(tiles_k / 8)) uint8 tensor broadcast over batch and heads.
#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "kernels/cudnn/sdpa_engine.hpp"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's calls go through it (dynamic loading)
}

namespace ringattn::kernels::cudnn {
namespace {

namespace fe = cudnn_frontend;

constexpr int kMinimumVersion = 90000;

// The loaded library: its version, or why there is none. Loaded once per process.
struct Library {
  int version = 0;
  std::string path, why;
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    const char* forced = std::getenv("RINGATTN_CUDNN_LIBRARY");
    const std::string name = forced && *forced ? forced : "libcudnn.so.9";
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      l.why = "no cuDNN: cannot load " + name + " (" + (e ? e : "?") + "; set RINGATTN_CUDNN_LIBRARY)";
      return l;
    }
    using GetVersion = size_t (*)();
    const auto get_version = reinterpret_cast<GetVersion>(dlsym(h, "cudnnGetVersion"));
    if (!get_version) {
      l.why = "no cuDNN: " + name + " has no cudnnGetVersion";
      return l;
    }
    const int v = int(get_version());
    l.path = name;
    if (v < kMinimumVersion || v / 10000 != CUDNN_MAJOR) {
      l.why = "cuDNN " + std::to_string(v) + " in " + name + " is too old or of another major version than the " +
              "build's (" + std::to_string(CUDNN_MAJOR) + ".x)";
      return l;
    }
    fe::cudnn_dlhandle = h;
    l.version = v;
    return l;
  }();
  return lib;
}

std::string version_text(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqQ,
  kSeqKV,
  kTiles,
  kRaggedQ,
  kRaggedK,
  kRaggedV,
  kRaggedO,
  kRaggedDO,
  kRaggedDQ,
  kRaggedDK,
  kRaggedDV,
};

fe::DataType_t io_type(DType t) { return t == DType::f16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16; }

// One SDPA graph of `shape` (forward or backward), not yet validated; for a target GPU without a
// device when sm_version > 0 (the frontend picks the SDPA implementation when the node is added,
// so the target must be known before).
std::shared_ptr<fe::graph::Graph> make_graph(const SdpaGraphShape& g, int sm_version = 0, int sm_count = 0) {
  auto graph = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) graph->set_sm_version(sm_version).set_sm_count(sm_count);
  graph->set_io_data_type(io_type(g.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t H = g.heads, Hkv = g.kv_heads, D = g.head_dim;
  const int64_t q_batch = (g.q_rows && !g.ragged ? g.q_rows : g.s_q) * H * D;
  const int64_t k_batch = (g.k_rows && !g.ragged ? g.k_rows : g.s_kv) * Hkv * D;
  auto ragged = [&](int64_t uid) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_uid(uid)
                             .set_name("ragged_offset_" + std::to_string(uid))
                             .set_dim({g.batch + 1, 1, 1, 1})
                             .set_stride({1, 1, 1, 1})
                             .set_data_type(fe::DataType_t::INT32));
  };
  auto token_tensor = [&](int64_t uid, const char* name, bool query_side, int64_t ragged_uid) {
    auto t = graph->tensor(fe::graph::Tensor_attributes()
                               .set_uid(uid)
                               .set_name(name)
                               .set_dim({g.batch, query_side ? H : Hkv, query_side ? g.s_q : g.s_kv, D})
                               .set_stride({query_side ? q_batch : k_batch, D, (query_side ? H : Hkv) * D, 1}));
    if (g.ragged) t->set_ragged_offset(ragged(ragged_uid));
    return t;
  };
  auto set_output = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, bool query_side,
                        int64_t ragged_uid) {
    t->set_output(true).set_uid(uid).set_dim({g.batch, query_side ? H : Hkv, query_side ? g.s_q : g.s_kv, D});
    t->set_stride({query_side ? q_batch : k_batch, D, (query_side ? H : Hkv) * D, 1});
    if (g.ragged) t->set_ragged_offset(ragged(ragged_uid));
  };
  auto lengths = [&](int64_t uid, const char* name) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_uid(uid)
                             .set_name(name)
                             .set_dim({g.batch, 1, 1, 1})
                             .set_stride({1, 1, 1, 1})
                             .set_data_type(fe::DataType_t::INT32));
  };
  const fe::DiagonalAlignment_t alignment = g.alignment == DiagonalAlignment::top_left
                                                ? fe::DiagonalAlignment_t::TOP_LEFT
                                                : fe::DiagonalAlignment_t::BOTTOM_RIGHT;

  auto Q = token_tensor(kQ, "Q", true, kRaggedQ);
  auto K = token_tensor(kK, "K", false, kRaggedK);
  auto V = token_tensor(kV, "V", false, kRaggedV);
  if (g.pass == SdpaPass::forward) {
    auto a = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(g.scale);
    a.set_diagonal_alignment(alignment);
    if (g.right_bound >= 0) a.set_diagonal_band_right_bound(int(g.right_bound));
    if (g.left_bound >= 0) a.set_diagonal_band_left_bound(int(g.left_bound));
    if (g.padding)
      a.set_padding_mask(true).set_seq_len_q(lengths(kSeqQ, "seq_q")).set_seq_len_kv(lengths(kSeqKV, "seq_kv"));
    if (g.tiles_q > 0) {
      const int64_t bytes = (g.tiles_k + 7) / 8;
      a.set_block_mask(graph->tensor(fe::graph::Tensor_attributes()
                                         .set_uid(kTiles)
                                         .set_name("block_mask")
                                         .set_dim({g.batch, H, g.tiles_q, bytes})
                                         .set_stride({0, 0, bytes, 1})
                                         .set_data_type(fe::DataType_t::UINT8)));
    }
    auto [O, Stats] = graph->sdpa(Q, K, V, a);
    set_output(O, kO, true, kRaggedO);
    Stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
    Stats->set_dim({g.batch, H, g.s_q, 1}).set_stride({H * g.s_q, g.s_q, 1, 1});
    return graph;
  }
  auto O = token_tensor(kO, "O", true, kRaggedO);
  auto dO = token_tensor(kDO, "dO", true, kRaggedDO);
  auto Stats = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_uid(kStats)
                                 .set_name("Stats")
                                 .set_dim({g.batch, H, g.s_q, 1})
                                 .set_stride({H * g.s_q, g.s_q, 1, 1})
                                 .set_data_type(fe::DataType_t::FLOAT));
  auto a = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(g.scale);
  a.set_diagonal_alignment(alignment);
  if (g.right_bound >= 0) a.set_diagonal_band_right_bound(int(g.right_bound));
  if (g.left_bound >= 0) a.set_diagonal_band_left_bound(int(g.left_bound));
  if (g.padding)
    a.set_padding_mask(true).set_seq_len_q(lengths(kSeqQ, "seq_q")).set_seq_len_kv(lengths(kSeqKV, "seq_kv"));
  a.set_deterministic_algorithm(g.deterministic);
  auto [dQ, dK, dV] = graph->sdpa_backward(Q, K, V, O, dO, Stats, a);
  set_output(dQ, kDQ, true, kRaggedDQ);
  set_output(dK, kDK, false, kRaggedDK);
  set_output(dV, kDV, false, kRaggedDV);
  return graph;
}

std::string message(fe::error_t e) { return e.get_message().empty() ? "cuDNN refused the graph" : e.get_message(); }

class CudnnEngine final : public SdpaEngine {
 public:
  CudnnEngine() {
    int device = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess)
      sm_ = prop.major * 10 + prop.minor;
    else
      cudaGetLastError();
  }
  ~CudnnEngine() override {
    graphs_.clear();
    if (handle_) fe::detail::destroy_handle(handle_);
  }

  int version() const override { return library().version; }
  std::string describe() const override {
    const Library& l = library();
    return l.version ? "cuDNN " + version_text(l.version) + " (" + l.path + ")" : l.why;
  }
  int sm_version() const override { return sm_; }

  bool prepare(const SdpaGraphShape& shape, std::string* why) override {
    if (graphs_.count(shape.hash())) return true;
    auto fail = [&](const std::string& m) {
      if (why) *why = m;
      return false;
    };
    if (!version()) return fail(describe());
    if (!handle_ && fe::detail::create_handle(&handle_) != CUDNN_STATUS_SUCCESS) {
      handle_ = nullptr;
      return fail("cudnnCreate failed (no usable GPU?)");
    }
    std::shared_ptr<fe::graph::Graph> graph;
    try {  // the frontend reports some refusals by exception
      graph = make_graph(shape);
      fe::error_t e = graph->validate();
      if (e.is_good()) e = graph->build_operation_graph(handle_);
      if (e.is_good()) e = graph->create_execution_plans({fe::HeurMode_t::A});
      if (e.is_good()) e = graph->check_support();
      if (e.is_good()) e = graph->build_plans();
      if (!e.is_good()) return fail(shape.describe() + ": " + message(e));
    } catch (const std::exception& e) {
      return fail(shape.describe() + ": " + e.what());
    }
    int64_t ws = 0;
    if (!graph->get_workspace_size(ws).is_good()) return fail(shape.describe() + ": no workspace size");
    graphs_[shape.hash()] = Entry{graph, size_t(ws)};
    return true;
  }

  size_t workspace_bytes(const SdpaGraphShape& shape) const override {
    const auto it = graphs_.find(shape.hash());
    return it == graphs_.end() ? 0 : it->second.workspace;
  }

  void run_forward(const SdpaGraphShape& g, const SdpaForwardArgs& a) override {
    std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(a.q)},
                                            {kK, const_cast<void*>(a.k)},
                                            {kV, const_cast<void*>(a.v)},
                                            {kO, a.o},
                                            {kStats, a.stats}};
    add_metadata(g, pack, a.seq_len_q, a.seq_len_kv, a.ragged_q, a.ragged_kv);
    if (g.tiles_q > 0) pack[kTiles] = const_cast<uint8_t*>(a.tile_mask);
    if (g.ragged) pack[kRaggedO] = const_cast<int32_t*>(a.ragged_q);
    execute(g, pack, a.workspace, a.stream);
  }

  void run_backward(const SdpaGraphShape& g, const SdpaBackwardArgs& a) override {
    std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(a.q)},
                                            {kK, const_cast<void*>(a.k)},
                                            {kV, const_cast<void*>(a.v)},
                                            {kO, const_cast<void*>(a.o)},
                                            {kDO, const_cast<void*>(a.dout)},
                                            {kStats, const_cast<float*>(a.stats)},
                                            {kDQ, a.dq},
                                            {kDK, a.dk},
                                            {kDV, a.dv}};
    add_metadata(g, pack, a.seq_len_q, a.seq_len_kv, a.ragged_q, a.ragged_kv);
    if (g.ragged) {
      for (int64_t uid : {kRaggedO, kRaggedDO, kRaggedDQ}) pack[uid] = const_cast<int32_t*>(a.ragged_q);
      for (int64_t uid : {kRaggedDK, kRaggedDV}) pack[uid] = const_cast<int32_t*>(a.ragged_kv);
    }
    execute(g, pack, a.workspace, a.stream);
  }

 private:
  struct Entry {
    std::shared_ptr<fe::graph::Graph> graph;
    size_t workspace = 0;
  };

  static void add_metadata(const SdpaGraphShape& g, std::unordered_map<int64_t, void*>& pack, const int32_t* seq_q,
                           const int32_t* seq_kv, const int32_t* ragged_q, const int32_t* ragged_kv) {
    if (g.padding) pack[kSeqQ] = const_cast<int32_t*>(seq_q), pack[kSeqKV] = const_cast<int32_t*>(seq_kv);
    if (g.ragged) {
      pack[kRaggedQ] = const_cast<int32_t*>(ragged_q);
      pack[kRaggedK] = pack[kRaggedV] = const_cast<int32_t*>(ragged_kv);
    }
  }

  void execute(const SdpaGraphShape& g, std::unordered_map<int64_t, void*>& pack, void* workspace, void* stream) {
    const auto it = graphs_.find(g.hash());
    if (it == graphs_.end()) throw std::logic_error("cuDNN: a call of an unprepared graph: " + g.describe());
    if (fe::detail::set_stream(handle_, static_cast<cudaStream_t>(stream)) != CUDNN_STATUS_SUCCESS)
      throw std::runtime_error("cuDNN: cudnnSetStream failed");
    const fe::error_t e = it->second.graph->execute(handle_, pack, workspace);
    if (!e.is_good()) throw std::runtime_error("cuDNN: " + g.describe() + ": " + message(e));
  }

  cudnnHandle_t handle_ = nullptr;
  int sm_ = 0;
  std::unordered_map<size_t, Entry> graphs_;
};

}  // namespace

std::unique_ptr<SdpaEngine> make_sdpa_engine() { return std::make_unique<CudnnEngine>(); }

std::string validate_graph_offline(const SdpaGraphShape& shape, int sm_version, int sm_count) {
  if (!library().version) return library().why;
  try {  // the frontend reports some refusals by exception
    const fe::error_t e = make_graph(shape, sm_version, sm_count)->validate();
    return e.is_good() ? "" : message(e);
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace ringattn::kernels::cudnn
