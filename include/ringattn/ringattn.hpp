// ringattn as a library: exact attention over a sequence sharded across the ranks of an MPI
// communicator (Ring Attention with FlashAttention-2 block kernels). This is the only header a
// user includes (with ringattn/errors.hpp, which it includes); link ringattn::ringattn (CMake:
// find_package(ringattn)). docs/reference.md describes every type and argument.
//
//   ringattn::Context ctx;                                 // MPI_COMM_WORLD, CPU backend, MPI
//   ringattn::Shard shard{.batch = 1, .rows = ctx.rows(L, spec), .heads = 8, .kv_heads = 8, .head_dim = 128};
//   ctx.forward(shard, spec, q, k, v, o, lse);             // this rank's rows only
//   ctx.backward(shard, spec, q, k, v, o, lse, dout, dq, dk, dv);
//
// Tensors (docs/reference.md "Tensors and files"), row-major, this rank's rows in the layout's order:
//   q, dout (B, rows, H, D); k, v (B, rows, Hkv, D) in the shard's element type;
//   o (B, rows, H, D), lse (B, H, rows), dq (B, rows, H, D), dk, dv (B, rows, Hkv, D): float32.
// Pointers are in the backend's memory (host memory for the CPU backend, device memory for CUDA).
// Every call is collective over the context's ranks, which must make the same calls in the same
// order. The caller owns MPI_Init_thread (MPI_THREAD_FUNNELED or more) and MPI_Finalize, and calls
// from the thread that created the context; with MPI_THREAD_SERIALIZED or more, from any one
// thread at a time (a call is finished before the next begins), as PyTorch's autograd does when it
// runs the backward of CUDA tensors on its device thread.
//
// Errors (ringattn/errors.hpp). A bad argument on any rank throws ArgumentError on every rank,
// naming the argument by its name here (shard.kv_heads is "kv_heads", spec.mask.doc_lens
// "doc_lens"), before any tensor data moves (shapes that differ between ranks are bad arguments
// too). A peer that died or stopped answering throws Fault within the timeout; after that the
// context is no longer usable (end the job).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ringattn/errors.hpp"

namespace ringattn {

class Session;  // the runtime's (runtime/session.hpp)

// Element types of q, k, v and dout (o, lse and the gradients are float32). float16 runs on the
// CUDA backend only.
enum class ElementType { float32, bfloat16, float16 };
// How positions are sharded over ranks (docs/reference.md "Sharding and schedules", --layout);
// automatic = zigzag when causal, contiguous otherwise, as on the command line.
enum class SequenceLayout { automatic, contiguous, zigzag, striped };
// How K/V rows move (docs/reference.md "Sharding and schedules", --schedule).
enum class KeyValueSchedule { direct, ring };
// Which kernels run the attention steps on the CUDA backend (docs/reference.md --kernel): automatic =
// cuDNN's fused attention for the steps it can express (bf16, head dims it takes, masks its
// planner maps) and ours for the rest, or ours alone where no cuDNN loads; cudnn = the same, but
// an ArgumentError naming "kernel" where cuDNN cannot run at all (the CPU backend, fp32, no
// libcudnn); own = our kernels throughout.
enum class AttentionKernel { automatic, cudnn, own };

// The mask (docs/reference.md "Masks"): enabled conditions combine by intersection.
struct MaskSpec {
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded on that side
  std::vector<int64_t> doc_lens;                // packed documents, summing to L; empty: one
  std::vector<uint8_t> block_mask;              // (n, n), n = ceil(L / mask_block); empty: none
  int64_t mask_block = 128;
  // BigBird block mask (blocks of mask_block): used when bigbird_global/window/random is not -1.
  int64_t bigbird_global = -1, bigbird_window = -1, bigbird_random = -1;
  uint64_t bigbird_seed = 0;
  bool has_bigbird() const { return bigbird_global >= 0 || bigbird_window >= 0 || bigbird_random >= 0; }
};

// What one call computes besides the tensors.
struct AttentionSpec {
  MaskSpec mask;
  SequenceLayout layout = SequenceLayout::automatic;
  KeyValueSchedule schedule = KeyValueSchedule::direct;
  double softmax_scale = 0.0;  // 0: 1/sqrt(head_dim)
  // Hybrid sequence parallelism (DeepSpeed-Ulysses inside groups of this many ranks, the ring
  // across the groups); 1: the ring alone. Must divide the ranks and the heads. A group is that
  // many ranks of one node when every node holds a multiple of it, else consecutive ranks: take
  // each rank's rows from Context::rows/positions with this spec.
  int ulysses = 1;
  AttentionKernel kernel = AttentionKernel::automatic;  // docs/reference.md --kernel
  // docs/reference.md --deterministic: a bitwise-reproducible backward (cuDNN's deterministic algorithm where
  // its workspace stays linear in the shard, our kernels elsewhere). The forward always is.
  bool deterministic = false;
};

// This rank's shard: the tensors' shapes and element type.
struct Shard {
  int64_t batch = 1;
  int64_t rows = 0;  // this rank's sequence rows; the sequence length is their sum over ranks
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 64;
  ElementType dtype = ElementType::float32;
};

// Names what one forward pass kept for its backward (Context::forward's `saved`).
struct ForwardHandle {
  uint64_t plan = 0;  // 0: none
  uint64_t pass = 0;
};

// What one pass cost on this rank.
struct RingStats {
  double seconds = 0.0;          // wall time of the ring pass
  double wait_seconds = 0.0;     // blocked waiting for data: the exposed communication
  double compute_seconds = 0.0;  // in the kernels
  uint64_t bytes_sent = 0;       // K/V payload sent by this rank
  uint64_t bytes_needed = 0;     // K/V bytes this rank's queries need from others (any schedule's floor)
  uint64_t a2a_bytes_sent = 0;   // sent to the other members of its group by the all-to-alls (ulysses > 1)
  int cudnn_steps = 0;           // ring steps cuDNN's fused attention ran on this rank
  int own_steps = 0;             // and those our kernels ran
};

struct ContextOptions {
  std::string backend = "cpu";  // "cpu" or "cuda" (builds with CUDA)
  std::string comm = "mpi";     // "mpi", or "nccl" with the CUDA backend
  int threads = 0;              // CPU threads per rank; 0: the node's cores shared among its ranks
  double timeout_s = 300.0;     // every wait on a peer is bounded by this
  int device = -1;              // CUDA device; -1: this rank's index on its node, modulo the GPUs
  // Emulated link (benchmarks: how overlap behaves on a slower network); 0: not emulated.
  double emulate_bandwidth_gbps = 0.0, emulate_latency_us = 0.0;
  // The same for the links inside AttentionSpec::ulysses groups (the first pair is then the link
  // between groups).
  double emulate_intra_bandwidth_gbps = 0.0, emulate_intra_latency_us = 0.0;
};

class Context {
 public:
  // Collective over `comm` (it is duplicated: the caller's tags never meet ours).
  explicit Context(MPI_Comm comm = MPI_COMM_WORLD, const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const;
  int size() const;
  // How many nodes the ranks span, as MPI's shared-memory split finds them.
  int nodes() const;
  const ContextOptions& options() const;

  // The layout the spec resolves to, and this rank's share of a sequence of seq_len positions
  // (with spec.ulysses > 1, of the hybrid's layout, which depends on the ranks' nodes).
  SequenceLayout layout(const AttentionSpec& spec) const;
  int64_t rows(int64_t seq_len, const AttentionSpec& spec, int rank = -1) const;
  // Global positions of a rank's rows (default: this rank), ascending: for RoPE and labels.
  std::vector<int64_t> positions(int64_t seq_len, const AttentionSpec& spec, int rank = -1) const;

  // Checks the arguments on every rank and that the ranks agree; throws ArgumentError on every
  // rank when any rank's check failed. `local_error` is a failure this rank found itself (e.g. a
  // binding's type check): it fails the call on every rank. forward() and backward() call it
  // first; call it alone only to report local_error, or to build the call's plan ahead of time.
  void check(const Shard& shard, const AttentionSpec& spec, const std::optional<ArgumentError>& local_error = {});

  // o and lse of this rank's queries against every visible key on every rank. `saved` (optional)
  // receives a handle to what this pass kept for its backward.
  RingStats forward(const Shard& shard, const AttentionSpec& spec, const void* q, const void* k, const void* v,
                    float* o, float* lse, ForwardHandle* saved = nullptr);
  // Given o and lse from forward and dout (the shard's element type): dq, dk, dv of this shard.
  // dk and dv include the contributions of every rank's queries. With `saved` from the forward
  // of these same q, k, v, o and lse, the backward reuses what that forward kept (with ulysses > 1
  // the head-sharded inputs, so their all-to-alls are not repeated) when no other forward of the
  // same shape has run since; without it, or when it is stale, everything is exchanged again.
  RingStats backward(const Shard& shard, const AttentionSpec& spec, const void* q, const void* k, const void* v,
                     const float* o, const float* lse, const void* dout, float* dq, float* dk, float* dv,
                     const ForwardHandle* saved = nullptr);

  // The caller's CUDA stream (a cudaStream_t, e.g. PyTorch's current stream; CUDA backend): each
  // later forward() and backward(), and each prefill() and decode() of a KVCache on this context,
  // starts, on the device, after the work queued on it before the call (the kernels that wrote q,
  // k, v, dout), and work queued on it after the call starts after the call's results are written;
  // no device-wide synchronisation. nullptr is CUDA's legacy default stream. Until this is called,
  // calls order with no stream of the caller's (inputs must be complete, e.g. after
  // cudaStreamSynchronize). A no-op with the CPU backend.
  void set_cuda_stream(void* stream);
  // Called after each step of a pass with (steps done, steps in all) (progress lines, tests).
  void set_step_callback(std::function<void(int, int)> on_step);
  // Plans (layout, ring plan, buffers) cached so far: one per (shape, mask, layout, schedule).
  size_t cached_plans() const;
  // Sends `bytes` from every rank; recv gets them in rank order (host memory; for unsharding).
  void allgather_bytes(const void* send, size_t bytes, void* recv, const std::vector<size_t>& bytes_per_rank);

 private:
  friend class KVCache;
  Session& session();
  // The stream set_cuda_stream gave, for KVCache's calls; nullopt until it is called.
  std::optional<void*> cuda_stream() const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Inference: one layer's KV cache sharded across the ranks (docs/reference.md "Inference") ----
//
//   ringattn::KVCache cache(ctx, {.batch = 1, .kv_heads = 8, .head_dim = 128, .capacity = L / P + 1024});
//   cache.prefill(heads, spec, q, k, v, o, lse);     // this rank's rows of the prompt (prefill_rows)
//   cache.decode(heads, 1, spec, q, k, v, o, lse);   // one new token per sequence, the same on every rank
//
// Each rank holds its share of each sequence's K/V rows with their global positions: a prefill's
// rows stay where the ring computed them, decode's new tokens go round-robin in units of
// `interleave` tokens to the rank holding the fewest, so shares differ by at most one unit.
// Attention is causal (with an optional left window); every call is collective, and a bad argument
// on any rank (a cache past its capacity, a sequence out of range, a position that is not the
// sequence's next, shapes that differ between ranks, decode on a cache never filled) throws
// ArgumentError on every rank with the cache unchanged. The cache lives in the context's backend
// memory, and the calls' pointers are there too (host memory for the CPU backend, device memory
// for CUDA: inputs complete before the call, or queued on the stream given to the context's
// set_cuda_stream; results complete on return, and ordered before that stream's later work).
struct CacheOptions {
  int64_t batch = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 64;
  int64_t capacity = 0;    // rows per sequence on each rank
  int64_t interleave = 1;  // decode's placement unit, in tokens
  ElementType dtype = ElementType::float32;
};

// How a prefill computes (docs/reference.md --prefill-method): automatic = Meta's rule (pass-KV when
// T / (T + P) >= 2 Hkv / H, T new and P cached tokens, or when T is large enough to hide the ring's
// transfers; pass-Q otherwise).
enum class PrefillMethod { automatic, pass_kv, pass_q };

struct InferenceSpec {
  int64_t window_left = -1;    // keys i - window_left .. i (-1: unbounded)
  double softmax_scale = 0.0;  // 0: 1/sqrt(head_dim)
  PrefillMethod method = PrefillMethod::automatic;  // prefill
  // The sequences of the cache the tensors' batch holds, in order (empty: all of them).
  std::vector<int64_t> sequences;
  // Decode: the position of each one's first new token (empty: the next one; checked when given).
  std::vector<int64_t> positions;
};

struct InferenceStats {
  double seconds = 0.0;
  PrefillMethod method = PrefillMethod::automatic;  // the prefill method that ran
  uint64_t bytes_sent = 0;                          // by this rank
};

class KVCache {
 public:
  KVCache(Context& ctx, const CacheOptions& options);  // collective; the options must agree
  ~KVCache();
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  const CacheOptions& options() const;
  // Tokens cached per sequence (the whole sequence's, the same on every rank).
  std::vector<int64_t> lengths() const;
  // Rows of a sequence a rank holds (default: this rank).
  int64_t rows(int64_t sequence, int rank = -1) const;
  // The rows of a chunk of `tokens` new tokens this rank passes to prefill and gets back, and their
  // positions within the chunk: its rows of the causal layout (shard(..., causal=True)) for
  // pass-KV and automatic, the whole chunk for pass-Q.
  std::vector<int64_t> prefill_positions(int64_t tokens, const InferenceSpec& spec) const;

  // The new tokens' attention (causal) against the cache and themselves, their K/V stored:
  // q (n, rows, H, D), k, v (n, rows, Hkv, D) in the cache's element type, rows as
  // prefill_positions gives them (the chunk's length is the ranks' rows summed, or rows for
  // pass-Q); writes this rank's o (n, rows, H, D) and lse (n, H, rows), float32.
  // `local_error` (as Context::check's): a problem this rank found itself fails the call on every rank.
  InferenceStats prefill(int64_t heads, const InferenceSpec& spec, int64_t rows, const void* q, const void* k,
                         const void* v, float* o, float* lse, const std::optional<ArgumentError>& local_error = {});
  // `tokens` new tokens per sequence (usually 1; a few for speculative decoding): q (n, tokens, H,
  // D), k, v (n, tokens, Hkv, D), the same on every rank; appends k, v and writes o (n, tokens, H,
  // D) and lse (n, H, tokens) on every rank.
  InferenceStats decode(int64_t heads, int64_t tokens, const InferenceSpec& spec, const void* q, const void* k,
                        const void* v, float* o, float* lse, const std::optional<ArgumentError>& local_error = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The BigBird block mask (blocks x blocks, row-major, nonzero = visible) that MaskSpec's bigbird_*
// fields generate: the same on every rank for the same seed.
std::vector<uint8_t> bigbird_block_mask(int64_t blocks, int64_t global, int64_t window, int64_t random,
                                        uint64_t seed);

// The library version, "0.1.0".
const char* version();

}  // namespace ringattn
