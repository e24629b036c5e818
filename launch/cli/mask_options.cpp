#include "launch/cli/mask_options.hpp"

#include <algorithm>
#include <charconv>

#include "runtime/errors.hpp"
#include "runtime/io/npy.hpp"

namespace po = boost::program_options;

namespace ringattn {

void add_mask_options(po::options_description& desc, MaskOptions& m) {
  desc.add_options()
      ("causal", po::bool_switch(&m.causal), "causal mask: key j visible to query i when j <= i")
      ("window", po::value(&m.window)->value_name("LEFT,RIGHT"),
       "sliding window i-LEFT <= j <= i+RIGHT, -1 = unbounded (FlashAttention window_size)")
      ("doc-lens", po::value(&m.doc_lens)->value_name("N1,N2,...|FILE.npy"),
       "packed documents of these lengths (summing to the sequence length)")
      ("block-mask", po::value(&m.block_mask)->value_name("FILE.npy"),
       "(ceil(L/N), ceil(L/N)) uint8/bool block mask, N = --mask-block")
      ("mask-block", po::value(&m.mask_block)->default_value(128)->value_name("N"), "block size of block masks")
      ("bigbird", po::value(&m.bigbird)->value_name("GLOBAL,WINDOW,RANDOM"),
       "generated BigBird block mask (blocks of --mask-block, random blocks from --seed)")
      ("dump-block-mask", po::value(&m.dump_block_mask)->value_name("FILE.npy"),
       "write the block mask used (bench --mode weak: the largest point's)");
}

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option, size_t expected) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      throw UsageError(option + " " + text + ": '" + item + "' is not an integer");
    out.push_back(value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (expected && out.size() != expected)
    throw UsageError(option + " " + text + ": expected " + std::to_string(expected) + " comma-separated integers");
  return out;
}

Mask build_mask(const MaskOptions& m, int64_t L, uint64_t seed) {
  Mask mask;
  mask.causal = m.causal;
  if (!m.window.empty()) {
    const auto w = parse_int_list(m.window, "--window", 2);
    for (int64_t x : w)
      if (x < -1) throw UsageError("--window " + m.window + ": sides must be >= 0, or -1 for unbounded");
    // A side longer than the sequence reaches every key, as L does; the kernels' i + RIGHT must not overflow.
    mask.window_left = std::min(w[0], L);
    mask.window_right = std::min(w[1], L);
    mask.window_origin = std::to_string(w[0]) + "," + std::to_string(w[1]);  // the JSON's mask, as given
  }
  if (!m.doc_lens.empty()) {
    std::vector<int64_t> lens;
    if (m.doc_lens.size() > 4 && m.doc_lens.substr(m.doc_lens.size() - 4) == ".npy") {
      std::vector<int64_t> shape;
      lens = read_npy_int64(m.doc_lens, "--doc-lens", &shape);
      if (shape.size() != 1) throw UsageError("--doc-lens " + m.doc_lens + ": expected a 1-D array of lengths");
    } else {
      lens = parse_int_list(m.doc_lens, "--doc-lens");
    }
    int64_t sum = 0;
    for (int64_t n : lens) {
      if (n < 0) throw UsageError("--doc-lens " + m.doc_lens + ": document lengths must not be negative");
      if (__builtin_add_overflow(sum, n, &sum))
        throw UsageError("--doc-lens " + m.doc_lens + ": the document lengths overflow 64 bits");
    }
    if (sum != L)
      throw UsageError("--doc-lens " + m.doc_lens + ": document lengths sum to " + std::to_string(sum) +
                       " but the sequence length is " + std::to_string(L));
    mask.set_documents(lens);
  }
  if (!m.block_mask.empty() && !m.bigbird.empty())
    throw UsageError("--block-mask and --bigbird both give a block mask: use one");
  if (m.mask_block < 1) throw UsageError("--mask-block " + std::to_string(m.mask_block) + ": must be positive");
  const int64_t n = L / m.mask_block + (L % m.mask_block != 0);
  if (!m.block_mask.empty()) {
    std::vector<int64_t> shape;
    std::vector<uint8_t> bm = read_npy_u8(m.block_mask, "--block-mask", &shape);
    if (shape.size() != 2 || shape[0] != n || shape[1] != n)
      throw UsageError("--block-mask " + m.block_mask + ": expected shape (" + std::to_string(n) + ", " +
                       std::to_string(n) + ") for sequence length " + std::to_string(L) + " and --mask-block " +
                       std::to_string(m.mask_block));
    mask.set_block_mask(std::move(bm), n, m.mask_block);
    mask.block_mask_origin = "block";
  }
  if (!m.bigbird.empty()) {
    const auto g = parse_int_list(m.bigbird, "--bigbird", 3);
    for (int64_t x : g)
      if (x < 0) throw UsageError("--bigbird " + m.bigbird + ": GLOBAL, WINDOW and RANDOM must be >= 0");
    // Counts beyond the number of blocks mean "all of them" (and keep r + WINDOW from overflowing).
    mask.set_block_mask(bigbird_block_mask(n, std::min(g[0], n), std::min(g[1], n), std::min(g[2], n), seed), n,
                        m.mask_block);
    mask.block_mask_origin = "bigbird(" + m.bigbird + ")";
  }
  if (!m.dump_block_mask.empty() && !mask.has_block_mask())
    throw UsageError("--dump-block-mask needs a block mask (--block-mask or --bigbird)");
  return mask;
}

void dump_block_mask(const MaskOptions& m, const Mask& mask) {
  if (m.dump_block_mask.empty()) return;
  write_npy_u8(m.dump_block_mask, "--dump-block-mask", {mask.block_count(), mask.block_count()},
               mask.block_mask().data());
}

}  // namespace ringattn
