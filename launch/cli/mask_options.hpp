// The mask options shared by `ringattn attention` and `ringattn layer` (docs/reference.md "Masks").
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mask/mask.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn {

struct MaskOptions {
  bool causal = false;
  std::string window;           // "LEFT,RIGHT"
  std::string doc_lens;         // "N1,N2,..." or FILE.npy (int64)
  std::string block_mask;       // FILE.npy, (ceil(L/N), ceil(L/N)) uint8/bool
  int64_t mask_block = 128;
  std::string bigbird;          // "GLOBAL,WINDOW,RANDOM"
  std::string dump_block_mask;  // FILE.npy
};

void add_mask_options(boost::program_options::options_description& desc, MaskOptions& m);

// The mask the options give, as the library's MaskSpec (reading any files; `seed` seeds BigBird).
// Throws ArgumentError naming the option or file for what only the command line can judge (the
// syntax of a list, a file's shape); the library judges the values (api::check_spec, check_call),
// and builds the Mask from the spec (api::build_mask).
MaskSpec mask_spec(const MaskOptions& m, int64_t seq_len, uint64_t seed);
// The Mask of the options for a job that has no session (`ringattn plan`): mask_spec, judged and
// built by the library.
Mask mask_from_options(const MaskOptions& m, int64_t seq_len, uint64_t seed);

// Writes the block mask actually used to --dump-block-mask (call on one rank).
void dump_block_mask(const MaskOptions& m, const Mask& mask);

// "a,b,c" -> integers; throws ArgumentError naming `option`.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option, size_t expected = 0);

}  // namespace ringattn
