// libFuzzer target for the .npy header parser and readers. For any bytes:
//   - parsing from memory and inspecting the same bytes as a file agree, on the header or on the
//     exact message that refuses it, and a refusal is always a ArgumentError; so does parsing from
//     fewer bytes than the header;
//   - an accepted header fits in the bytes given, and the readers of its dtype read it whole;
//   - the header we would write for it parses back to the same dtype and shape.
// Anything else (another exception, a crash, a sanitizer report) is a finding.
//
//   cmake -S . -B build-fuzz -DRINGATTN_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
//   cmake --build build-fuzz --target fuzz_npy
//   build-fuzz/fuzz_npy -max_total_time=60 tests/fuzz/corpus/npy
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/errors.hpp"
#include "runtime/io/npy.hpp"

using namespace ringattn;

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

// The input as a file, without touching the disk: a memfd, opened again through /proc.
const std::string& as_file(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz.npy", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  check(fd >= 0 && ftruncate(fd, 0) == 0);
  check(size == 0 || pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  return path;
}

void read_whole(const NpyInfo& info) {
  std::vector<int64_t> shape;
  if (info.descr[1] == 'f') {
    std::string note;
    check(static_cast<int64_t>(read_npy_float(info.path, info.label, &shape, &note).size()) == info.elements());
    check(note.empty() == (info.descr == "<f4"));
    // Every other row along the first axis, as a striped shard would read them.
    if (info.elements() > 0 && !info.shape.empty()) {  // else shape[0] is not bounded by the input
      std::vector<int64_t> positions;
      for (int64_t p = 0; p < info.shape[0]; p += 2) positions.push_back(p);
      const RowSelection rows = rows_along(info.shape, 0, positions);
      std::vector<float> out(static_cast<size_t>(rows.elements()));
      read_npy_rows(info, rows, out.data());
    }
  } else if (info.descr[1] == 'i') {
    check(static_cast<int64_t>(read_npy_int64(info.path, info.label, &shape).size()) == info.elements());
  } else {
    check(static_cast<int64_t>(read_npy_u8(info.path, info.label, &shape).size()) == info.elements());
  }
  check(shape == info.shape);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = as_file(data, size);
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const int64_t file_size = static_cast<int64_t>(size);

  std::optional<NpyInfo> parsed;
  std::string refused;
  try {
    parsed = parse_npy_header(bytes, file_size, path, "--fuzz");
  } catch (const ArgumentError& e) {
    refused = e.what();
  }
  // A caller may hand over fewer bytes than the header: refused, or read the same.
  const size_t cut = size ? data[size - 1] % (size + 1) : 0;
  try {
    const NpyInfo part = parse_npy_header(bytes.substr(0, cut), file_size, path, "--fuzz");
    check(parsed && part.shape == parsed->shape && part.data_offset == parsed->data_offset);
  } catch (const ArgumentError&) {
  }
  std::optional<NpyInfo> inspected;
  try {
    inspected = inspect_npy(path, "--fuzz");
  } catch (const ArgumentError& e) {
    check(!parsed && refused == e.what());
  }
  if (!parsed) return 0;

  check(refused.empty() && inspected.has_value());
  const NpyInfo& info = *parsed;
  check(inspected->descr == info.descr && inspected->shape == info.shape &&
        inspected->data_offset == info.data_offset);
  check(info.data_offset >= 10 && info.bytes() >= 0 && info.data_offset + info.bytes() <= file_size);
  read_whole(info);

  const std::string header = npy_header_bytes(info.descr, info.shape);
  const NpyInfo again = parse_npy_header(header, static_cast<int64_t>(header.size()) + info.bytes(), path, "");
  check(again.descr == info.descr && again.shape == info.shape);
  return 0;
}
