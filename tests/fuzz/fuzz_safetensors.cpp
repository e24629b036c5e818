// libFuzzer target for the safetensors header parser and reader. For any bytes:
//   - inspecting them as a file either accepts them or refuses them with a ArgumentError, and a header
//     accepted from a file is accepted from memory too (same tensors);
//   - every accepted tensor lies inside the file, no two overlap, and the bytes match shape x dtype;
//   - each float tensor's every other row (a striped shard) and its whole data can be read;
//   - the header we would write for the accepted float tensors parses back to the same shapes.
// Anything else (another exception, a crash, a sanitizer report) is a finding.
//
//   cmake -S . -B build-fuzz -DRINGATTN_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
//   cmake --build build-fuzz --target fuzz_safetensors
//   build-fuzz/fuzz_safetensors -max_total_time=30 tests/fuzz/corpus/safetensors
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/errors.hpp"
#include "runtime/io/safetensors.hpp"

using namespace ringattn;

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

// The input as a file, without touching the disk: a memfd, opened again through /proc.
const std::string& as_file(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  check(fd >= 0 && ftruncate(fd, 0) == 0);
  check(size == 0 || pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  return path;
}

bool is_float(const std::string& dtype) { return dtype == "F32" || dtype == "F16" || dtype == "BF16"; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = as_file(data, size);
  const int64_t file_size = static_cast<int64_t>(size);
  std::optional<SafetensorsInfo> info;
  try {
    info = inspect_safetensors(path, "--fuzz");
  } catch (const ArgumentError&) {
    return 0;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  const std::string_view header(reinterpret_cast<const char*>(data) + 8, static_cast<size_t>(n));
  const SafetensorsInfo again = parse_safetensors_header(header, file_size, path, "--fuzz");
  check(again.tensors.size() == info->tensors.size());

  std::vector<SafetensorsEntry> entries;
  int64_t previous_end = 0;
  for (const SafetensorsTensor& t : info->tensors) {
    check(t.offset >= 8 + int64_t(n) && t.bytes >= 0 && t.offset + t.bytes <= file_size);
    check(t.offset >= previous_end);
    previous_end = t.offset + t.bytes;
    check(info->find(t.name) != nullptr);
    if (!is_float(t.dtype)) continue;
    const SafetensorsTensor& same = require_float_tensor(*info, t.name, t.shape);
    check(same.offset == t.offset);
    std::vector<float> whole(static_cast<size_t>(t.elements()));
    const std::vector<int64_t> first{0};
    read_safetensors_rows(*info, t, RowSelection{1, 1, t.elements(), first}, whole.data());
    if (t.elements() > 0 && !t.shape.empty()) {  // every other row along the first axis
      std::vector<int64_t> positions;
      for (int64_t p = 0; p < t.shape[0]; p += 2) positions.push_back(p);
      const RowSelection rows = rows_along(t.shape, 0, positions);
      std::vector<float> out(static_cast<size_t>(rows.elements()));
      read_safetensors_rows(*info, t, rows, out.data());
    }
    entries.push_back({t.name, t.shape});
  }
  std::vector<int64_t> offsets;
  const std::string written = safetensors_header_bytes(entries, info->metadata, &offsets);
  int64_t data_bytes = 0;
  for (const SafetensorsEntry& e : entries) {
    int64_t k = 4;
    for (int64_t d : e.shape) k *= d;
    data_bytes += k;
  }
  const SafetensorsInfo back = parse_safetensors_header(std::string_view(written).substr(8),
                                                        int64_t(written.size()) + data_bytes, path, "--fuzz");
  check(back.tensors.size() == entries.size() && back.metadata == info->metadata);
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsTensor* t = back.find(entries[i].name);
    check(t && t->shape == entries[i].shape && t->dtype == "F32");
  }
  return 0;
}
