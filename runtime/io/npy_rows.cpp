// Reading a rank's rows of a .npy file and writing them into an output shared by all ranks.
// A rank touches only its own rows: consecutive positions become one pread/pwrite each, and
// outputs are written under a temporary name that is renamed into place once complete.
#include "runtime/io/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "runtime/errors.hpp"
#include "runtime/io/npy_file.hpp"

namespace ringattn {

using namespace npy_internal;

namespace {

constexpr int64_t kBounceBytes = 1 << 20;  // conversion buffer for float64/float16 files

// --- selections ---------------------------------------------------------------------------


// --- conversions ------------------------------------------------------------------------------

}  // namespace

namespace {

// Converts n elements of a float64 or float16 file; counts finite values that overflowed to inf.
void convert_to_float(std::string_view descr, const char* src, int64_t n, float* dst, int64_t* overflowed) {
  if (descr == "<f8") {
    for (int64_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, src + 8 * i, 8);
      dst[i] = static_cast<float>(d);
      *overflowed += std::isinf(dst[i]) && std::isfinite(d);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = fp16_to_float(h);
    }
  }
}

void require_kind(const NpyInfo& info, std::initializer_list<std::string_view> accepted, const char* expected) {
  for (std::string_view d : accepted)
    if (info.descr == d) return;
  throw usage_error(where_of(info.label, info.path) + "dtype " + std::string(dtype_name(info.descr)) + " ('" +
                   info.descr + "') where " + expected + " is expected");
}

}  // namespace

RowSelection rows_along(const std::vector<int64_t>& shape, int seq_axis, std::span<const int64_t> positions) {
  if (seq_axis < 0 || seq_axis >= static_cast<int>(shape.size()))
    throw std::invalid_argument("rows_along: axis " + std::to_string(seq_axis) + " outside shape " + format_shape(shape));
  RowSelection rows;
  rows.seq = shape[static_cast<size_t>(seq_axis)];
  for (int a = 0; a < seq_axis; ++a) rows.outer *= shape[static_cast<size_t>(a)];
  for (size_t a = static_cast<size_t>(seq_axis) + 1; a < shape.size(); ++a) rows.inner *= shape[a];
  rows.positions = positions;
  return rows;
}

void read_npy_rows(const NpyInfo& info, const RowSelection& rows, float* out, std::string* note) {
  require_kind(info, {"<f4", "<f8", "<f2"}, "float32 ('<f4', or '<f8'/'<f2' to convert)");
  const std::string where = where_of(info.label, info.path);
  int64_t size = 0;
  FileHandle file(open_input(info.path, &size, where));
  if (size < info.data_offset + info.bytes())
    throw Fault(where + "the file shrank to " + std::to_string(size) + " bytes since it was inspected");
  const bool convert = info.descr != "<f4";
  std::vector<char> bounce;
  int64_t overflowed = 0;
  for_each_run(rows, info.elements(), where, [&](int64_t file_element, int64_t buffer_element, int64_t n) {
    const int64_t offset = info.data_offset + file_element * info.word_size;
    if (!convert) return pread_all(file.fd, out + buffer_element, n * 4, offset, where);
    const int64_t step = kBounceBytes / info.word_size;
    bounce.resize(static_cast<size_t>(std::min(n, step) * info.word_size));
    for (int64_t done = 0; done < n; done += step) {
      const int64_t m = std::min(step, n - done);
      pread_all(file.fd, bounce.data(), m * info.word_size, offset + done * info.word_size, where);
      convert_to_float(info.descr, bounce.data(), m, out + buffer_element + done, &overflowed);
    }
  });
  if (convert && note) {
    *note = where + "converted " + std::string(dtype_name(info.descr)) + " to float32";
    if (overflowed)
      *note += " (" + std::to_string(overflowed) + (overflowed == 1 ? " value" : " values") +
               " beyond the float32 range became inf)";
  }
}

std::vector<float> read_npy_float(const std::string& path, const std::string& label, std::vector<int64_t>* shape,
                                  std::string* note) {
  const NpyInfo info = inspect_npy(path, label);
  std::vector<float> data(static_cast<size_t>(info.elements()));
  const int64_t all = 0;
  RowSelection rows{1, 1, info.elements(), std::span<const int64_t>(&all, 1)};
  read_npy_rows(info, rows, data.data(), note);  // also when empty: the note still applies
  if (shape) *shape = info.shape;
  return data;
}

namespace {
// The whole data of a small file, as stored.
std::vector<char> read_all_bytes(const NpyInfo& info) {
  const std::string where = where_of(info.label, info.path);
  int64_t size = 0;
  FileHandle file(open_input(info.path, &size, where));
  std::vector<char> bytes(static_cast<size_t>(info.bytes()));
  pread_all(file.fd, bytes.data(), info.bytes(), info.data_offset, where);
  return bytes;
}
}  // namespace

std::vector<int64_t> read_npy_int64(const std::string& path, const std::string& label, std::vector<int64_t>* shape) {
  const NpyInfo info = inspect_npy(path, label);
  require_kind(info, {"<i8", "<i4"}, "int64 ('<i8', or '<i4')");
  const std::vector<char> bytes = read_all_bytes(info);
  std::vector<int64_t> values(static_cast<size_t>(info.elements()));
  for (size_t i = 0; i < values.size(); ++i) {
    if (info.word_size == 8) {
      std::memcpy(&values[i], bytes.data() + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      values[i] = v;
    }
  }
  if (shape) *shape = info.shape;
  return values;
}

std::vector<uint8_t> read_npy_u8(const std::string& path, const std::string& label, std::vector<int64_t>* shape) {
  const NpyInfo info = inspect_npy(path, label);
  require_kind(info, {"|u1", "|b1"}, "uint8 ('|u1') or bool ('|b1')");
  const std::vector<char> bytes = read_all_bytes(info);
  if (shape) *shape = info.shape;
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

namespace {
// Makes a rename durable. Best effort: the data was flushed before, so the file is complete
// either way, and some file systems refuse fsync on directories.
void sync_directory_of(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

NpyOutput NpyOutput::create(const std::string& path, const std::string& label, const std::vector<int64_t>& shape) {
  return create_as("<f4", path, label, shape);
}

NpyOutput NpyOutput::create_as(const std::string& descr, const std::string& path, const std::string& label,
                               const std::vector<int64_t>& shape) {
  const std::string where = where_of(label, path);
  NpyOutput out;
  out.shape_ = shape;
  out.data_bytes_ = byte_count(shape, find_dtype(descr)->word_size);
  if (out.data_bytes_ < 0) throw std::invalid_argument(where + "cannot write shape " + format_shape(shape));
  out.file_ = TempOutputFile::create(path, label);

  const std::string header = npy_header_bytes(descr, shape);
  out.data_offset_ = static_cast<int64_t>(header.size());
  const int64_t total = out.data_offset_ + out.data_bytes_;
  if (const int rc = out.file_.write_header_and_reserve(header, total))
    throw Fault(out.where() + "cannot reserve " + human_bytes(static_cast<double>(total)) + " (" +
                       std::to_string(total) + " bytes): " + std::strerror(rc));
  return out;
}

NpyOutput NpyOutput::open(const std::string& path, const std::string& temp_path, const std::string& label,
                          const std::vector<int64_t>& shape) {
  NpyOutput out;
  out.shape_ = shape;
  out.data_bytes_ = byte_count(shape, 4);
  out.file_ = TempOutputFile::open(path, temp_path, label);
  // The ranks must agree on what they write; a header that differs is a fault between them.
  struct stat st {};
  if (::fstat(out.file_.fd(), &st) != 0) throw Fault(out.where() + "cannot stat: " + std::strerror(errno));
  NpyInfo info;
  try {
    info = inspect_open(out.file_.fd(), st.st_size, temp_path, label);
  } catch (const ArgumentError& e) {
    throw Fault(e.what());
  }
  if (info.descr != "<f4" || info.shape != shape || st.st_size != info.data_offset + out.data_bytes_)
    throw Fault(out.where() + "the temporary file holds " + info.descr + " " + format_shape(info.shape) + " in " +
                       std::to_string(st.st_size) + " bytes, not <f4 " + format_shape(shape));
  out.data_offset_ = info.data_offset;
  return out;
}

std::string NpyOutput::where() const { return file_.where(); }

void NpyOutput::write_rows(const RowSelection& rows, const float* data) {
  file_.write_rows(data_offset_, data_bytes_ / 4, rows, data, where());
}

void NpyOutput::finish() { file_.finish(); }

void NpyOutput::commit() {
  if (file_.committed()) return;
  file_.commit();
  sync_directory_of(path());
}

void NpyOutput::discard() { file_.discard(); }

void write_npy_whole(const std::string& path, const std::string& label, const std::string& descr,
                     const std::vector<int64_t>& shape, const void* data) {
  NpyOutput out = NpyOutput::create_as(descr, path, label, shape);
  pwrite_all(out.file_.fd(), data, out.data_bytes_, out.data_offset_, out.where());
  out.commit();
}

void write_npy(const std::string& path, const std::string& label, const std::vector<int64_t>& shape,
               const float* data) {
  write_npy_whole(path, label, "<f4", shape, data);
}

void write_npy_u8(const std::string& path, const std::string& label, const std::vector<int64_t>& shape,
                  const uint8_t* data) {
  write_npy_whole(path, label, "|u1", shape, data);
}

}  // namespace ringattn
