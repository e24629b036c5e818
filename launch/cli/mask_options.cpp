#include "launch/cli/mask_options.hpp"

#include <algorithm>
#include <charconv>

#include "runtime/api/arguments.hpp"
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
      throw usage_error(option + " " + text + ": '" + item + "' is not an integer");
    out.push_back(value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (expected && out.size() != expected)
    throw usage_error(option + " " + text + ": expected " + std::to_string(expected) + " comma-separated integers");
  return out;
}

MaskSpec mask_spec(const MaskOptions& m, int64_t L, uint64_t seed) {
  MaskSpec mask;
  mask.causal = m.causal;
  if (!m.window.empty()) {
    const auto w = parse_int_list(m.window, "--window", 2);
    mask.window_left = w[0], mask.window_right = w[1];
  }
  if (!m.doc_lens.empty()) {
    if (m.doc_lens.size() > 4 && m.doc_lens.substr(m.doc_lens.size() - 4) == ".npy") {
      std::vector<int64_t> shape;
      mask.doc_lens = read_npy_int64(m.doc_lens, "--doc-lens", &shape);
      if (shape.size() != 1) throw usage_error("--doc-lens " + m.doc_lens + ": expected a 1-D array of lengths");
    } else {
      mask.doc_lens = parse_int_list(m.doc_lens, "--doc-lens");
    }
  }
  mask.mask_block = m.mask_block;
  if (!m.block_mask.empty()) {
    // The file's own shape is the command line's to check; the library judges the entries'
    // count against the sequence (api::check_call).
    if (m.mask_block < 1) throw usage_error("--mask-block " + std::to_string(m.mask_block) + ": must be positive");
    const int64_t n = L / m.mask_block + (L % m.mask_block != 0);
    std::vector<int64_t> shape;
    mask.block_mask = read_npy_u8(m.block_mask, "--block-mask", &shape);
    if (shape.size() != 2 || shape[0] != n || shape[1] != n)
      throw usage_error("--block-mask " + m.block_mask + ": expected shape (" + std::to_string(n) + ", " +
                        std::to_string(n) + ") for sequence length " + std::to_string(L) + " and --mask-block " +
                        std::to_string(m.mask_block));
  }
  if (!m.bigbird.empty()) {
    const auto g = parse_int_list(m.bigbird, "--bigbird", 3);
    mask.bigbird_global = g[0], mask.bigbird_window = g[1], mask.bigbird_random = g[2];
    mask.bigbird_seed = seed;
  }
  if (!m.dump_block_mask.empty() && m.block_mask.empty() && m.bigbird.empty())
    throw usage_error("--dump-block-mask needs a block mask (--block-mask or --bigbird)");
  return mask;
}

Mask mask_from_options(const MaskOptions& m, int64_t L, uint64_t seed) {
  AttentionSpec spec;
  spec.mask = mask_spec(m, L, seed);
  for (auto bad : {api::check_spec(spec), api::check_mask_length(spec.mask, L)})
    if (bad) throw *bad;
  return api::build_mask(spec, L);
}

void dump_block_mask(const MaskOptions& m, const Mask& mask) {
  if (m.dump_block_mask.empty()) return;
  write_npy_u8(m.dump_block_mask, "--dump-block-mask", {mask.block_count(), mask.block_count()},
               mask.block_mask().data());
}

}  // namespace ringattn
