// The .npy format (NumPy NEP 1, format versions 1.0 to 3.0):
//   "\x93NUMPY", major, minor, header length (uint16 for 1.0, uint32 for 2.0 and 3.0, little-endian),
//   then a Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with
//   spaces and '\n' so that the data starts at a multiple of 64, then the raw C-order data.
// Every header is checked against the size of the file before anything it claims is allocated.
#include "runtime/io/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "runtime/errors.hpp"
#include "runtime/io/npy_file.hpp"

namespace ringattn {

static_assert(std::endian::native == std::endian::little, "the .npy readers assume a little-endian host");

namespace npy_internal {
namespace {

constexpr DTypeInfo kDTypes[] = {
    {"<f4", "float32", 4}, {"<f8", "float64", 8}, {"<f2", "float16", 2}, {"<i8", "int64", 8},
    {"<i4", "int32", 4},   {"|u1", "uint8", 1},   {"|b1", "bool", 1},
};

}  // namespace

std::string where_of(const std::string& label, const std::string& path) {
  return (label.empty() ? path : label + " " + path) + ": ";
}

int64_t byte_count(const std::vector<int64_t>& shape, int64_t word_size) {
  int64_t bytes = word_size;
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0 || (d && __builtin_mul_overflow(bytes, d, &bytes))) return -1;
    empty |= d == 0;
  }
  return empty ? 0 : bytes;
}

bool is_usage_errno(int e) {
  return e == ENOENT || e == ENOTDIR || e == EACCES || e == EPERM || e == EROFS || e == ENAMETOOLONG ||
         e == ELOOP || e == EISDIR;
}

const DTypeInfo* find_dtype(std::string_view descr) {
  for (const DTypeInfo& t : kDTypes)
    if (t.descr == descr) return &t;
  return nullptr;
}

std::string_view dtype_name(std::string_view descr) {
  const DTypeInfo* t = find_dtype(descr);
  return t ? t->name : descr;
}

FileHandle::~FileHandle() {
  if (fd >= 0) ::close(fd);
}

int open_input(const std::string& path, int64_t* size, const std::string& where) {
  // O_NONBLOCK so that naming a FIFO fails below instead of hanging here.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    const std::string msg = where + "cannot open: " + std::strerror(e);
    if (is_usage_errno(e)) throw usage_error(msg);
    throw Fault(msg);
  }
  FileHandle guard(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Fault(where + "cannot stat: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw usage_error(where + "is a directory, not a .npy file");
  if (!S_ISREG(st.st_mode)) throw usage_error(where + "is not a regular file");
  *size = st.st_size;
  guard.fd = -1;
  return fd;
}

void pread_all(int fd, void* buffer, int64_t bytes, int64_t offset, const std::string& where) {
  char* p = static_cast<char*>(buffer);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)), offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw Fault(where + "read of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                         " failed: " + std::strerror(errno));
    if (got == 0)
      throw Fault(where + "the file ends at byte " + std::to_string(offset) +
                         ", before the data its header claims (was it truncated while the job ran?)");
    p += got, offset += got, bytes -= got;
  }
}

void pwrite_all(int fd, const void* buffer, int64_t bytes, int64_t offset, const std::string& where) {
  const char* p = static_cast<const char*>(buffer);
  while (bytes > 0) {
    const ssize_t put = ::pwrite(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)), offset);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0)
      throw Fault(where + "write of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                         " failed: " + (put < 0 ? std::strerror(errno) : "nothing written (disk full?)"));
    p += put, offset += put, bytes -= put;
  }
}

}  // namespace npy_internal

using namespace npy_internal;

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr int64_t kMaxHeaderBytes = 1 << 20;  // NumPy itself refuses more than 10 kB by default
constexpr size_t kMaxDims = 64;               // NumPy's own limit (NPY_MAXDIMS)

// Printable excerpt of raw bytes for messages: non-printable bytes as \xNN.
std::string excerpt(std::string_view s, size_t limit = 80) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return "\"" + out + (s.size() > limit ? "...\"" : "\"");
}

// Maps a descr string to one of kDTypes; the byte order of a one-byte type does not matter.
const DTypeInfo& parse_descr(const std::string& descr, const std::string& where) {
  const bool has_order = !descr.empty() && std::string_view("<>|=").find(descr[0]) != std::string_view::npos;
  const char order = has_order ? descr[0] : '=';
  const std::string code = has_order ? descr.substr(1) : descr;
  const DTypeInfo* t = nullptr;
  for (const DTypeInfo& d : kDTypes)
    if (d.descr.substr(1) == code) t = &d;
  if (!t)
    throw usage_error(where + "unsupported dtype '" + descr +
                     "' (float32 '<f4' is expected for tensors, '<f8' and '<f2' are converted; "
                     "int64 '<i8' or int32 '<i4' for lengths; uint8 '|u1' or bool '|b1' for masks)");
  if (t->word_size == 1 || order == '<') return *t;
  if (order == '>')
    throw usage_error(where + "big-endian data ('" + descr + "') is not supported: save it little-endian, e.g. " +
                     "np.save(path, a.astype('<" + code + "'))");
  throw usage_error(where + "dtype '" + descr + "' does not say little-endian ('<" + code + "')");
}

// --- the header dict ------------------------------------------------------------------------

// A parser for the one Python literal NumPy writes: a dict of 'descr' (str), 'fortran_order'
// (True/False) and 'shape' (tuple of ints), in any order, with any spacing and trailing commas.
class HeaderDict {
 public:
  HeaderDict(std::string_view text, const std::string& where) : s_(text), where_(where) {}

  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;

  void parse() {
    bool seen_descr = false, seen_order = false, seen_shape = false;
    expect('{', "the header does not start with '{'");
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string_literal("a quoted key");
      skip_space();
      expect(':', "expected ':' after key '" + key + "'");
      skip_space();
      if (key == "descr") {
        once(seen_descr, key);
        if (peek() == '[') throw usage_error(where_ + "structured dtypes (a list as 'descr') are not supported");
        descr = string_literal("a quoted dtype");
      } else if (key == "fortran_order") {
        once(seen_order, key);
        fortran_order = boolean();
      } else if (key == "shape") {
        once(seen_shape, key);
        shape = tuple();
      } else {
        fail("unknown key '" + key + "' (expected 'descr', 'fortran_order' and 'shape')");
      }
      skip_space();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}' after the value of '" + key + "'");
    }
    ++i_;
    skip_space();
    if (i_ != s_.size()) fail("unexpected text after the closing '}'");
    if (!seen_descr) fail_plain("the header has no 'descr' key");
    if (!seen_order) fail_plain("the header has no 'fortran_order' key");
    if (!seen_shape) fail_plain("the header has no 'shape' key");
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool at_end() const { return i_ >= s_.size(); }
  void skip_space() {
    while (peek() == ' ' || peek() == '\t' || peek() == '\r' || peek() == '\n') ++i_;
  }
  void expect(char c, const std::string& what) {
    if (peek() != c) fail(what);
    ++i_;
  }
  void once(bool& seen, const std::string& key) {
    if (seen) fail("key '" + key + "' appears twice");
    seen = true;
  }
  [[noreturn]] void fail_plain(const std::string& what) const {
    throw usage_error(where_ + "corrupt .npy header: " + what + " (header " + excerpt(s_) + ")");
  }
  [[noreturn]] void fail(const std::string& what) const {
    fail_plain(what + " at byte " + std::to_string(i_) + " of the dict");
  }

  std::string string_literal(const char* what) {
    const char quote = peek();
    if (at_end() || (quote != '\'' && quote != '"')) fail(std::string("expected ") + what);
    const size_t start = ++i_;
    while (!at_end() && s_[i_] != quote) {
      if (s_[i_] == '\\' || s_[i_] == '\n') fail("escape sequences and line breaks in strings are not supported");
      ++i_;
    }
    if (at_end()) fail("unterminated string");
    return std::string(s_.substr(start, i_++ - start));
  }

  bool boolean() {
    if (s_.substr(i_, 4) == "True") return i_ += 4, true;
    if (s_.substr(i_, 5) == "False") return i_ += 5, false;
    fail("expected True or False as 'fortran_order'");
  }

  int64_t dimension() {
    const size_t start = i_;
    const bool negative = peek() == '-';
    if (negative) ++i_;
    if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected an integer in 'shape'");
    int64_t value = 0;
    bool overflow = false;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      overflow |= __builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, s_[i_] - '0', &value);
      ++i_;
    }
    const std::string text(s_.substr(start, i_ - start));
    if (peek() == 'L' || peek() == 'l') ++i_;  // Python 2 long literals, as old writers left them
    if (negative) fail_plain("negative dimension " + text + " in 'shape'");
    if (overflow) fail_plain("dimension " + text + " in 'shape' is too large");
    return value;
  }

  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(', "expected a tuple '(...)' as 'shape'");
    skip_space();
    bool comma = false;
    while (peek() != ')') {
      if (dims.size() == kMaxDims) fail_plain("'shape' has more than " + std::to_string(kMaxDims) + " dimensions");
      dims.push_back(dimension());
      skip_space();
      comma = peek() == ',';
      if (comma) {
        ++i_;
        skip_space();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in 'shape'");
      }
    }
    ++i_;
    if (dims.size() == 1 && !comma)
      fail_plain("'shape' (" + std::to_string(dims[0]) + ") is not a tuple (a 1-D shape is written (" +
                 std::to_string(dims[0]) + ",))");
    return dims;
  }

  std::string_view s_;
  size_t i_ = 0;
  const std::string& where_;
};


// Validates the fixed part of the file and returns where the header dict ends (= data offset).
// `head` holds at least the first min(file_size, 12) bytes.
int64_t header_end(std::string_view head, int64_t file_size, int64_t* preamble, const std::string& where) {
  if (file_size == 0) throw usage_error(where + "not a .npy file (the file is empty)");
  const int64_t fixed = std::min<int64_t>(file_size, 12);
  if (static_cast<int64_t>(head.size()) < fixed)
    throw usage_error(where + "truncated header: " + std::to_string(head.size()) + " of " + std::to_string(fixed) +
                     " header bytes given");
  const size_t compared = std::min(kMagic.size(), head.size());
  if (head.substr(0, compared) != kMagic.substr(0, compared)) {
    const std::string hint = head.substr(0, 4) == "PK\x03\x04" ? ": a zip archive, perhaps a .npz" : "";
    throw usage_error(where + "not a .npy file (bad magic: it starts with " + excerpt(head.substr(0, 8)) + hint + ")");
  }
  if (file_size < 8)
    throw usage_error(where + "truncated header: the file has only " + std::to_string(file_size) + " bytes");
  const int major = static_cast<unsigned char>(head[6]), minor = static_cast<unsigned char>(head[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw usage_error(where + "unsupported .npy format version " + std::to_string(major) + "." +
                     std::to_string(minor) + " (1.0, 2.0 and 3.0 are read)");
  *preamble = major == 1 ? 10 : 12;
  if (file_size < *preamble)
    throw usage_error(where + "truncated header: the file has only " + std::to_string(file_size) + " bytes");
  int64_t length = 0;
  for (int64_t b = *preamble - 1; b >= 8; --b) length = (length << 8) | static_cast<unsigned char>(head[b]);
  if (length > kMaxHeaderBytes)
    throw usage_error(where + "corrupt .npy header: header length " + std::to_string(length) +
                     " is implausibly large (more than 1 MiB)");
  if (*preamble + length > file_size)
    throw usage_error(where + "truncated header: header length " + std::to_string(length) +
                     " goes beyond the end of the file (" + std::to_string(file_size) + " bytes)");
  return *preamble + length;
}
}  // namespace

int64_t NpyInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked against overflow when the header was parsed
  return n;
}

NpyInfo parse_npy_header(std::string_view head, int64_t file_size, const std::string& path, const std::string& label) {
  const std::string where = where_of(label, path);
  int64_t preamble = 0;
  const int64_t end = header_end(head, file_size, &preamble, where);
  if (static_cast<int64_t>(head.size()) < end)
    throw usage_error(where + "truncated header: " + std::to_string(head.size()) + " of " + std::to_string(end) +
                     " header bytes given");
  HeaderDict dict(head.substr(static_cast<size_t>(preamble), static_cast<size_t>(end - preamble)), where);
  dict.parse();
  const DTypeInfo& type = parse_descr(dict.descr, where);
  if (dict.fortran_order)
    throw usage_error(where + "Fortran order is not supported: save a C-ordered array (np.ascontiguousarray)");

  NpyInfo info;
  info.path = path;
  info.label = label;
  info.descr = std::string(type.descr);
  info.shape = dict.shape;
  info.data_offset = end;
  info.word_size = type.word_size;
  // The byte count of the nonzero dimensions must fit even when a zero makes the array empty,
  // so that no caller multiplying dimensions can overflow.
  const int64_t bytes = byte_count(info.shape, type.word_size);
  if (bytes < 0)
    throw usage_error(where + "header claims shape " + format_shape(info.shape) + ", whose size overflows 64 bits");
  if (bytes > file_size - end)
    throw usage_error(where + "header claims shape " + format_shape(info.shape) + " " + std::string(type.name) +
                     " = " + human_bytes(static_cast<double>(bytes)) + " of data but the file holds " +
                     std::to_string(file_size - end) + " bytes after its " + std::to_string(end) +
                     "-byte header (truncated data)");
  return info;
}

NpyInfo inspect_npy(const std::string& path, const std::string& label) {
  int64_t size = 0;
  FileHandle file(open_input(path, &size, where_of(label, path)));
  return inspect_open(file.fd, size, path, label);
}

std::string npy_header_bytes(const std::string& descr, const std::vector<int64_t>& shape) {
  // NumPy sorts the keys and leaves room for axis 0 to grow to 21 digits in place.
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + format_shape(shape) + ", }";
  if (!shape.empty()) {
    const int64_t spare = 21 - static_cast<int64_t>(std::to_string(shape[0]).size());
    dict.append(static_cast<size_t>(std::max<int64_t>(0, spare)), ' ');
  }
  for (const int major : {1, 2}) {
    const int64_t preamble = major == 1 ? 10 : 12;
    const int64_t text = static_cast<int64_t>(dict.size()) + 1;  // + '\n'
    const int64_t length = text + 64 - (preamble + text) % 64;
    if (major == 1 && length > 0xffff) continue;
    std::string out(kMagic);
    out += static_cast<char>(major);
    out += '\0';
    for (int64_t b = 0; b < preamble - 8; ++b) out += static_cast<char>((length >> (8 * b)) & 0xff);
    out += dict;
    out.append(static_cast<size_t>(length - text), ' ');
    return out + '\n';
  }
  throw std::logic_error("unreachable");
}

namespace npy_internal {

NpyInfo inspect_open(int fd, int64_t file_size, const std::string& path, const std::string& label) {
  const std::string where = where_of(label, path);
  // The fixed part first, so that no claimed header length is allocated before it is checked.
  const int64_t fixed = std::min<int64_t>(file_size, 12);
  std::string head(static_cast<size_t>(fixed), '\0');
  pread_all(fd, head.data(), fixed, 0, where);
  int64_t preamble = 0;
  const int64_t end = header_end(head, file_size, &preamble, where);
  if (end > fixed) {
    head.resize(static_cast<size_t>(end));
    pread_all(fd, head.data() + fixed, end - fixed, fixed, where);
  }
  return parse_npy_header(head, file_size, path, label);
}

}  // namespace npy_internal
}  // namespace ringattn
