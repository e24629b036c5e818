// The tokens of a `ringattn decode` job and the check of its outputs.
//
// Every token's q, k and v is a function of (seed, sequence, position): each rank makes exactly
// the rows it holds or passes (its share of the prompt, the whole chunk for pass-Q, each decode
// step's new tokens), and the check makes the keys again block by block, so that no rank ever
// holds a whole sequence. Values are uniform with unit variance from a 64-bit hash (cheap enough
// to fill a cache of a million tokens in seconds), rounded to bf16 with --dtype bf16. With
// --q --k --v files the prompt's rows are read from them instead, the same way: each rank reads
// the rows it needs when it needs them (decode's new tokens stay random).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/attention.hpp"
#include "kernels/error_rule.hpp"
#include "runtime/io/npy.hpp"
#include "util/dtype.hpp"

namespace ringattn {

enum class TokenTensor : uint64_t { q = 1, k = 2, v = 3 };

// The prompt as .npy files in the attention job's layout: q (B, L, H, D), k and v (B, L, Hkv, D),
// or the same without B; any float type NumPy writes (converted to float32).
struct PromptFiles {
  NpyInfo q, k, v;
  int64_t batch = 1, length = 0, heads = 0, kv_heads = 0, head_dim = 0;
};
// Opens and checks the three headers (every rank: a bad file is an ArgumentError naming its
// option and path on each of them).
PromptFiles open_prompt_files(const std::string& q, const std::string& k, const std::string& v);

class TokenSource {
 public:
  TokenSource(uint64_t seed, int64_t max_len, int64_t heads, int64_t kv_heads, int64_t head_dim, DType dtype,
              std::optional<PromptFiles> files = std::nullopt)
      : seed_(seed), max_len_(max_len), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), dtype_(dtype),
        files_(std::move(files)) {}
  int64_t heads() const { return heads_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t row_elements(TokenTensor t) const { return (t == TokenTensor::q ? heads_ : kv_heads_) * head_dim_; }
  // Rows (count, heads of t, D) of sequence `seq` at `pos`, as fp32 (bf16-representable for bf16).
  void rows(TokenTensor t, int64_t seq, const int64_t* pos, int64_t count, float* out) const;
  // The same in the job's element type (bytes of count * row_elements * dtype size).
  void rows_as_dtype(TokenTensor t, int64_t seq, const int64_t* pos, int64_t count, void* out) const;

 private:
  void random_rows(TokenTensor t, int64_t seq, const int64_t* pos, int64_t count, float* out) const;
  uint64_t seed_;
  int64_t max_len_, heads_, kv_heads_, head_dim_;
  DType dtype_;
  std::optional<PromptFiles> files_;
};

// The errors of sampled outputs against fp64 attention over the whole sequence (every key from
// position 0, made again by the source in blocks), with the same-precision baseline of the rule.
struct DecodeCheck {
  kernels::TensorError o, lse;
  int rows = 0;  // query rows checked, summed over ranks
  bool passed() const { return o.passed() && lse.passed(); }
};

// One sequence's query rows at q_pos (ascending) with their o (n, H, D) and lse (H, n), judged
// against the plain computation in `precision` (the kernels' rounding: P in bf16 on the CUDA
// tensor cores).
void check_rows(const TokenSource& source, int64_t seq, const std::vector<int64_t>& q_pos, const float* o,
                const float* lse, int64_t window_left, float scale, DecodeCheck& into,
                kernels::SamePrecision precision = kernels::SamePrecision::fp32());
// Combines every rank's check (collective).
void reduce_check(comm::Communicator& world, DecodeCheck& check);

}  // namespace ringattn
