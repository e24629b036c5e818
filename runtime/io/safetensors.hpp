// safetensors files (the Hugging Face checkpoint format): 8 bytes, the little-endian length N of a
// JSON header, the header, then raw little-endian data. The header is an object mapping each
// tensor's name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} (offsets from the
// first byte after the header), plus an optional "__metadata__" object of strings.
//
// The reader trusts nothing: the length must fit the file, the header must be valid JSON of that
// form, every tensor's byte count must equal its shape times its dtype's size, and the data
// ranges must lie inside the file without overlapping. Tensors are then read by offset, a rank
// reading only the rows it owns; F32, F16 and BF16 are converted to float.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/io/npy.hpp"

namespace ringattn {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // "F32", "F16", "BF16", "I64", ... as in the header
  std::vector<int64_t> shape;
  int64_t offset = 0;          // of its first byte, from the start of the file
  int64_t bytes = 0;
  int64_t elements() const;
};

struct SafetensorsInfo {
  std::string path, label;  // label: the option that named the file, for messages
  std::vector<SafetensorsTensor> tensors;  // in the order of their data
  std::vector<std::pair<std::string, std::string>> metadata;
  // nullptr when absent.
  const SafetensorsTensor* find(const std::string& name) const;
};

// Validates the header text of a file of `file_size` bytes (header_size = the 8-byte length);
// throws ArgumentError "<label> <path>: ..." naming the tensor at fault.
SafetensorsInfo parse_safetensors_header(std::string_view header, int64_t file_size, const std::string& path,
                                         const std::string& label);
// Opens and validates a file (reads only its header).
SafetensorsInfo inspect_safetensors(const std::string& path, const std::string& label);

// The tensor `name` of `file` with this shape and a float dtype; ArgumentError naming the file and
// the tensor when it is missing, has another shape or a dtype we do not convert.
const SafetensorsTensor& require_float_tensor(const SafetensorsInfo& file, const std::string& name,
                                              const std::vector<int64_t>& shape, const std::string& why = "");

// Reads the selected rows of a float tensor into `out` (rows.elements() floats), converting F16
// and BF16; one pread per run of consecutive positions.
void read_safetensors_rows(const SafetensorsInfo& file, const SafetensorsTensor& tensor, const RowSelection& rows,
                           float* out);

// Writing float32 tensors: the header (with its 8-byte length, padded with spaces to a multiple
// of 8 so that the data is aligned) for tensors stored one after the other in this order, and
// the file offset of each tensor's data.
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
};
std::string safetensors_header_bytes(const std::vector<SafetensorsEntry>& tensors,
                                     const std::vector<std::pair<std::string, std::string>>& metadata,
                                     std::vector<int64_t>* offsets);

}  // namespace ringattn
