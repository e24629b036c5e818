// The decode job's tokens and its streaming check against fp64.
#include "launch/decode/decode_inputs.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/mask/mask.hpp"
#include "kernels/reference.hpp"
#include "launch/attention/attention_options.hpp"
#include "runtime/errors.hpp"
#include "util/format.hpp"

namespace ringattn {

namespace {

uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Keys per block of the check's stream.
constexpr int64_t kCheckKeyBlock = 8192;

}  // namespace

PromptFiles open_prompt_files(const std::string& q, const std::string& k, const std::string& v) {
  PromptFiles f{inspect_npy(q, "--q"), inspect_npy(k, "--k"), inspect_npy(v, "--v")};
  const std::vector<int64_t> qs = as_bshd(f.q), ks = as_bshd(f.k);
  if (f.k.shape != f.v.shape)
    throw usage_error("--k " + k + " has shape " + format_shape(f.k.shape) + " but --v " + v + " has " +
                      format_shape(f.v.shape));
  if (ks[0] != qs[0] || ks[1] != qs[1] || ks[3] != qs[3])
    throw usage_error("--q " + q + " has shape " + format_shape(f.q.shape) + " but --k " + k + " has " +
                      format_shape(f.k.shape) + ": batch, length and head dim must agree");
  if (qs[1] < 1) throw usage_error("--q " + q + " has shape " + format_shape(f.q.shape) + ": the prompt is empty");
  f.batch = qs[0], f.length = qs[1], f.heads = qs[2], f.kv_heads = ks[2], f.head_dim = qs[3];
  return f;
}

void TokenSource::rows(TokenTensor t, int64_t seq, const int64_t* pos, int64_t count, float* out) const {
  // The prompt's rows (positions below its length, ascending) from the files, the others made.
  const int64_t in_file = files_ ? std::lower_bound(pos, pos + count, files_->length) - pos : 0;
  if (in_file > 0) {
    const NpyInfo& info = t == TokenTensor::q ? files_->q : t == TokenTensor::k ? files_->k : files_->v;
    // The file as (1, B L, heads D): sequence seq's rows are B L positions seq L + p.
    std::vector<int64_t> at(static_cast<size_t>(in_file));
    for (int64_t r = 0; r < in_file; ++r) at[size_t(r)] = seq * files_->length + pos[r];
    const RowSelection rows{1, files_->batch * files_->length, row_elements(t), at};
    read_npy_rows(info, rows, out);
    if (dtype_ == DType::bf16)  // what the kernels see: the cache holds bf16
      for (int64_t i = 0; i < in_file * row_elements(t); ++i) out[i] = bf16_to_float(float_to_bf16(out[i]));
  }
  random_rows(t, seq, pos + in_file, count - in_file, out + in_file * row_elements(t));
}

void TokenSource::random_rows(TokenTensor t, int64_t seq, const int64_t* pos, int64_t count, float* out) const {
  const int64_t n = row_elements(t);
  const uint64_t stream = mix(seed_ ^ (uint64_t(t) << 56));
  const bool bf16 = dtype_ == DType::bf16;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < count; ++r) {
    const uint64_t base = uint64_t((seq * max_len_ + pos[r]) * n);
    float* row = out + r * n;
    for (int64_t e = 0; e < n; ++e) {
      // uniform in [-sqrt(3), sqrt(3)): unit variance
      const float u = float(mix(stream ^ (base + uint64_t(e))) >> 40) * (1.0f / 16777216.0f);
      const float x = (2.0f * u - 1.0f) * 1.7320508f;
      row[e] = bf16 ? bf16_to_float(float_to_bf16(x)) : x;
    }
  }
}

void TokenSource::rows_as_dtype(TokenTensor t, int64_t seq, const int64_t* pos, int64_t count, void* out) const {
  if (dtype_ == DType::f32) return rows(t, seq, pos, count, static_cast<float*>(out));
  std::vector<float> f(size_t(count * row_elements(t)));
  rows(t, seq, pos, count, f.data());
  auto* b = static_cast<bf16_bits*>(out);
  for (size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
}

void check_rows(const TokenSource& source, int64_t seq, const std::vector<int64_t>& q_pos, const float* o,
                const float* lse, int64_t window_left, float scale, DecodeCheck& into,
                kernels::SamePrecision precision) {
  const int64_t n = int64_t(q_pos.size());
  if (n == 0) return;
  const int64_t H = source.heads(), D = source.head_dim(), KE = source.row_elements(TokenTensor::k);
  const kernels::AttentionDims dims{1, H, source.kv_heads(), D, scale};
  Mask mask;
  mask.causal = true;
  mask.window_left = window_left;
  const MaskView view = mask.view();
  std::vector<float> q(size_t(n * H * D));
  source.rows(TokenTensor::q, seq, q_pos.data(), n, q.data());
  // fp64 and plain fp32 states over all keys, merged block by block.
  std::vector<double> ro(q.size(), 0.0), rl(size_t(H * n), -std::numeric_limits<double>::infinity());
  std::vector<float> so(q.size(), 0.0f), sl(size_t(H * n), -std::numeric_limits<float>::infinity());
  std::vector<double> bo(q.size()), bl(rl.size());
  std::vector<float> fo(q.size()), fl(sl.size()), k, v;
  const int64_t keys = q_pos.back() + 1;
  const int64_t first_key = window_left < 0 ? 0 : std::max<int64_t>(0, q_pos.front() - window_left);
  for (int64_t j0 = first_key; j0 < keys; j0 += kCheckKeyBlock) {
    const int64_t m = std::min(kCheckKeyBlock, keys - j0);
    std::vector<int64_t> k_pos(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) k_pos[size_t(j)] = j0 + j;
    k.resize(size_t(m * KE)), v.resize(size_t(m * KE));
    source.rows(TokenTensor::k, seq, k_pos.data(), m, k.data());
    source.rows(TokenTensor::v, seq, k_pos.data(), m, v.data());
    kernels::reference_forward(dims, q.data(), q_pos.data(), n, k.data(), v.data(), k_pos.data(), m, view, bo.data(),
                               bl.data());
    kernels::naive_forward_fp32(dims, q.data(), q_pos.data(), n, k.data(), v.data(), k_pos.data(), m, view, fo.data(),
                                fl.data(), precision);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const size_t s = size_t(h * n + i), row = size_t((i * H + h) * D);
        const double m64 = std::max(rl[s], bl[s]);
        if (m64 != -std::numeric_limits<double>::infinity()) {
          const double w1 = std::exp(rl[s] - m64), w2 = std::exp(bl[s] - m64);
          for (int64_t d = 0; d < D; ++d) ro[row + size_t(d)] = (ro[row + size_t(d)] * w1 + bo[row + size_t(d)] * w2) / (w1 + w2);
          rl[s] = m64 + std::log(w1 + w2);
        }
        const float m32 = std::max(sl[s], fl[s]);
        if (m32 != -std::numeric_limits<float>::infinity()) {
          const float w1 = std::exp(sl[s] - m32), w2 = std::exp(fl[s] - m32);
          for (int64_t d = 0; d < D; ++d) so[row + size_t(d)] = (so[row + size_t(d)] * w1 + fo[row + size_t(d)] * w2) / (w1 + w2);
          sl[s] = m32 + std::log(w1 + w2);
        }
      }
  }
  for (size_t i = 0; i < ro.size(); ++i) into.o.add(o[i], so[i], ro[i]);
  for (size_t i = 0; i < rl.size(); ++i) into.lse.add(lse[i], sl[i], rl[i]);
  into.rows += int(n);
}

void reduce_check(comm::Communicator& world, DecodeCheck& check) {
  double v[8] = {check.o.error, check.o.baseline, check.o.scale, check.o.rounding,
                 check.lse.error, check.lse.baseline, check.lse.scale, check.lse.rounding};
  world.allreduce(v, 8, DType::f64, comm::ReduceOp::max);
  check.o = {v[0], v[1], v[2], v[3]};
  check.lse = {v[4], v[5], v[6], v[7]};
  int64_t rows = check.rows;
  world.allreduce(&rows, 1, DType::i64, comm::ReduceOp::sum);
  check.rows = int(rows);
}

}  // namespace ringattn
