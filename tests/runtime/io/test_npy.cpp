// The .npy reader and writer: round trips, shard selections, dtype conversions, the exact bytes
// NumPy writes, every kind of malformed file refused with a message naming it, and outputs that
// never appear at their final path unless complete.
#include "runtime/io/npy.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>
#include <iterator>

#include "runtime/errors.hpp"
#include "tests/support/temp_dir_test.hpp"
#include "tests/support/test_util.hpp"

namespace ringattn {
namespace {

namespace fs = std::filesystem;

using NpyTest = testing::TempDirTest;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A .npy file from its parts, so that malformed files can be written byte by byte.
std::string npy_file(std::string_view dict, std::string_view data = "", int major = 1) {
  std::string s = "\x93NUMPY";
  s += static_cast<char>(major);
  s += '\0';
  const uint32_t length = static_cast<uint32_t>(dict.size());
  for (int b = 0; b < (major == 1 ? 2 : 4); ++b) s += static_cast<char>((length >> (8 * b)) & 0xff);
  return s + std::string(dict) + std::string(data);
}

template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Runs fn and checks that it throws Error (and nothing else) naming `who` and containing `reason`.
template <class Error>
void expect_error(const std::function<void()>& fn, const std::string& who, const std::string& reason) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected: " << reason;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(who), std::string::npos) << message;
    EXPECT_NE(message.find(reason), std::string::npos) << message;
  }
}
const auto expect_usage_error = expect_error<ArgumentError>;

// --- the bytes NumPy writes -------------------------------------------------------------------

// np.save(f, np.zeros((2, 3), np.float32)) begins with these 128 bytes: the 10-byte preamble
// (magic, version 1.0, header length 118 = 0x76), the dict, NumPy's 20 spare spaces for axis 0
// to grow, padding spaces, '\n'.
TEST(NpyHeader, MatchesNumpyBytes) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string expected =
      std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict + std::string(128 - 10 - dict.size() - 1, ' ') + "\n";
  EXPECT_EQ(npy_header_bytes("<f4", {2, 3}), expected);

  // The same layout for a scalar and a 1-D mask (header length 118 again: 128 bytes in all).
  for (const auto& [descr, shape, text] :
       {std::tuple{"<f4", std::vector<int64_t>{}, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }"},
        std::tuple{"|u1", std::vector<int64_t>{5}, "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }"}}) {
    const std::string padded = std::string(text) + std::string(117 - std::strlen(text), ' ') + "\n";
    EXPECT_EQ(npy_header_bytes(descr, shape), std::string("\x93NUMPY\x01\x00\x76\x00", 10) + padded);
  }
  // A 19-digit first axis leaves 2 of the 21 spare spaces; with 14 more axes the dict is 116
  // bytes, and 10 + 116 + 2 + '\n' = 129 pads to 192.
  std::vector<int64_t> long_shape(15, 1);
  long_shape[0] = int64_t(1) << 62;
  const std::string long_header = npy_header_bytes("<f4", long_shape);
  EXPECT_EQ(long_header.size(), 192u);
  EXPECT_EQ(long_header.substr(10 + 116 - 1, 3), "}  ") << "the dict ends at byte 125";
}

TEST(NpyHeader, PaddingIsAlwaysToSixtyFour) {
  for (int ndim = 0; ndim <= 64; ++ndim) {
    // Header lengths of every remainder modulo 64: the first axis grows by a digit each time.
    std::vector<int64_t> shape(static_cast<size_t>(ndim), 1);
    int64_t first = 1;
    for (int k = 0; k < ndim % 19; ++k) first *= 10;
    if (ndim) shape[0] = first;
    const std::string h = npy_header_bytes("<f4", shape);
    EXPECT_EQ(h.size() % 64, 0u) << ndim;
    EXPECT_EQ(h.back(), '\n');
    EXPECT_EQ(h[6], 1) << "version 1.0 while the header fits";
    const NpyInfo info = parse_npy_header(h, static_cast<int64_t>(h.size()) + 4 * first, "x", "");
    EXPECT_EQ(info.shape, shape);
    EXPECT_EQ(info.data_offset, static_cast<int64_t>(h.size()));
  }
  // A header too long for the 16-bit length of version 1.0 is written as 2.0.
  const std::string big = npy_header_bytes("<f4", std::vector<int64_t>(30000, 1));
  EXPECT_EQ(big.substr(0, 8), std::string("\x93NUMPY\x02\x00", 8));
  EXPECT_EQ(big.size() % 64, 0u);
  uint32_t length;
  std::memcpy(&length, big.data() + 8, 4);
  EXPECT_EQ(length + 12, big.size());
}

// --- round trips and selections -----------------------------------------------------------------

TEST_F(NpyTest, RoundTripTwoThreeFourDimensions) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{7, 5}, {6, 2, 3}, {2, 9, 3, 4}, {3, 0, 2}}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const std::vector<float> data = testing::random_vector(static_cast<size_t>(n), 10 + shape.size());
    const std::string path = file("x.npy");
    write_npy(path, "--out", shape, data.data());
    EXPECT_EQ(read_file(path).substr(0, 128), npy_header_bytes("<f4", shape));
    std::vector<int64_t> read_shape;
    std::string note = "untouched";
    EXPECT_EQ(read_npy_float(path, "--q", &read_shape, &note), data);
    EXPECT_EQ(read_shape, shape);
    EXPECT_EQ(note, "untouched") << "float32 needs no conversion note";
    const NpyInfo info = inspect_npy(path, "--q");
    EXPECT_EQ(info.descr, "<f4");
    EXPECT_EQ(info.data_offset, 128);
    EXPECT_EQ(info.elements(), n);
  }
  EXPECT_EQ(entries(), std::vector<std::string>{"x.npy"}) << "no temporary file is left";
}

// The rows at `positions` of a (outer, seq, inner) array, as the reader lays them out.
std::vector<float> slice_rows(const std::vector<float>& all, int64_t outer, int64_t seq, int64_t inner,
                              const std::vector<int64_t>& positions) {
  std::vector<float> out;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t p : positions)
      for (int64_t i = 0; i < inner; ++i) out.push_back(all[static_cast<size_t>((o * seq + p) * inner + i)]);
  return out;
}

TEST_F(NpyTest, ReadsSelectedRows) {
  const int64_t B = 2, L = 12, H = 3, D = 4;
  const std::vector<float> q = testing::random_vector(static_cast<size_t>(B * L * H * D), 3);
  const std::string path = file("q.npy");
  write_npy(path, "--q", {B, L, H, D}, q.data());
  const NpyInfo info = inspect_npy(path, "--q");
  const std::vector<std::vector<int64_t>> selections = {
      testing::iota_positions(5, 3),        // contiguous
      {0, 1, 2, 9, 10, 11},                 // zigzag: two runs
      testing::iota_positions(4, 1, 3),     // striped: every third row
      testing::iota_positions(L),           // everything, one read
      {}};
  for (const auto& positions : selections) {
    const RowSelection rows = rows_along(info.shape, 1, positions);
    EXPECT_EQ(rows.outer, B);
    EXPECT_EQ(rows.seq, L);
    EXPECT_EQ(rows.inner, H * D);
    std::vector<float> got(static_cast<size_t>(rows.elements()), NAN);
    read_npy_rows(info, rows, got.data());
    EXPECT_EQ(got, slice_rows(q, B, L, H * D, positions));
  }
}

TEST_F(NpyTest, ReadsRowsOfThreeDimensionalAndSequenceLastFiles) {
  // Q as (L, H, D): outer = 1.
  const std::vector<float> q = testing::random_vector(10 * 2 * 3, 4);
  write_npy(file("q3.npy"), "--q", {10, 2, 3}, q.data());
  const NpyInfo q_info = inspect_npy(file("q3.npy"), "--q");
  const std::vector<int64_t> positions = {2, 3, 8};
  const RowSelection q_rows = rows_along(q_info.shape, 0, positions);
  EXPECT_EQ(q_rows.outer, 1);
  std::vector<float> got(static_cast<size_t>(q_rows.elements()));
  read_npy_rows(q_info, q_rows, got.data());
  EXPECT_EQ(got, slice_rows(q, 1, 10, 6, positions));

  // LSE as (B, H, L): the sequence is the last axis, rows of one element.
  const std::vector<float> lse = testing::random_vector(2 * 3 * 10, 5);
  write_npy(file("lse.npy"), "--lse", {2, 3, 10}, lse.data());
  const RowSelection lse_rows = rows_along({2, 3, 10}, 2, positions);
  EXPECT_EQ(lse_rows.outer, 6);
  EXPECT_EQ(lse_rows.inner, 1);
  got.assign(static_cast<size_t>(lse_rows.elements()), 0.0f);
  read_npy_rows(inspect_npy(file("lse.npy"), "--lse"), lse_rows, got.data());
  EXPECT_EQ(got, slice_rows(lse, 6, 10, 1, positions));
}

TEST_F(NpyTest, RejectsSelectionsThatDoNotFit) {
  const std::vector<float> x(12, 1.0f);
  write_npy(file("x.npy"), "--q", {3, 4}, x.data());
  const NpyInfo info = inspect_npy(file("x.npy"), "--q");
  std::vector<float> out(12);
  const std::vector<int64_t> descending = {2, 1}, outside = {3};
  EXPECT_THROW(read_npy_rows(info, rows_along(info.shape, 0, descending), out.data()), std::invalid_argument);
  EXPECT_THROW(read_npy_rows(info, rows_along(info.shape, 0, outside), out.data()), std::invalid_argument);
  EXPECT_THROW(read_npy_rows(info, RowSelection{1, 5, 2, descending}, out.data()), std::invalid_argument);
}

// --- dtypes -------------------------------------------------------------------------------------

TEST_F(NpyTest, ConvertsFloat64) {
  const std::vector<double> values = {1.5, -3.25, 1e300, 0.1, -INFINITY, 7};
  const std::string path =
      write_file("d.npy", npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), }", raw_bytes(values)));
  std::string note;
  std::vector<int64_t> shape;
  const std::vector<float> got = read_npy_float(path, "--k", &shape, &note);
  EXPECT_EQ(shape, (std::vector<int64_t>{3, 2}));
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(got[i], static_cast<float>(values[i])) << i;
  EXPECT_NE(note.find("--k " + path), std::string::npos) << note;
  EXPECT_NE(note.find("converted float64 to float32"), std::string::npos) << note;
  EXPECT_NE(note.find("(1 value beyond the float32 range became inf)"), std::string::npos) << note;

  // A selection of rows goes through the same conversion.
  const std::vector<int64_t> positions = {0, 2};
  std::vector<float> rows(4);
  read_npy_rows(inspect_npy(path, "--k"), rows_along(shape, 0, positions), rows.data());
  EXPECT_EQ(rows, (std::vector<float>{1.5f, -3.25f, -INFINITY, 7.0f}));
}

TEST_F(NpyTest, ConvertsFloat16) {
  // 1, -2, 65504 (largest), 2^-24 (smallest subnormal), 6.1035e-5 (smallest normal), inf, NaN, -0.
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x0400, 0x7c00, 0x7e00, 0x8000};
  const std::string path =
      write_file("h.npy", npy_file("{'descr': '<f2', 'fortran_order': False, 'shape': (8,), }", raw_bytes(halves)));
  std::string note;
  const std::vector<float> got = read_npy_float(path, "--v", nullptr, &note);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -2.0f);
  EXPECT_EQ(got[2], 65504.0f);
  EXPECT_EQ(got[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(got[4], std::ldexp(1.0f, -14));
  EXPECT_EQ(got[5], INFINITY);
  EXPECT_TRUE(std::isnan(got[6]));
  EXPECT_EQ(got[7], 0.0f);
  EXPECT_TRUE(std::signbit(got[7]));
  EXPECT_NE(note.find("converted float16 to float32"), std::string::npos) << note;

  // An empty array is converted too (found by the fuzzer: the note went missing).
  const std::string empty =
      write_file("e.npy", npy_file("{'descr': '<f2', 'fortran_order': False, 'shape': (0,), }"));
  note.clear();
  EXPECT_TRUE(read_npy_float(empty, "--v", nullptr, &note).empty());
  EXPECT_NE(note.find("converted float16 to float32"), std::string::npos) << note;
}

TEST_F(NpyTest, ReadsInt64AndInt32) {
  const std::vector<int64_t> lengths = {5, 0, 1LL << 40, -7};
  const std::string p64 =
      write_file("l.npy", npy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", raw_bytes(lengths)));
  std::vector<int64_t> shape;
  EXPECT_EQ(read_npy_int64(p64, "--doc-lens", &shape), lengths);
  EXPECT_EQ(shape, std::vector<int64_t>{4});
  const std::vector<int32_t> narrow = {3, -1, 2147483647};
  const std::string p32 =
      write_file("n.npy", npy_file("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", raw_bytes(narrow)));
  EXPECT_EQ(read_npy_int64(p32, "--doc-lens", nullptr), (std::vector<int64_t>{3, -1, 2147483647}));
  expect_usage_error([&] { read_npy_float(p64, "--q", nullptr); }, "--q " + p64,
                     "dtype int64 ('<i8') where float32");
  const std::vector<float> f = {1.0f};
  write_npy(file("f.npy"), "", {1}, f.data());
  expect_usage_error([&] { read_npy_int64(file("f.npy"), "--doc-lens", nullptr); }, "--doc-lens " + file("f.npy"),
                     "dtype float32 ('<f4') where int64");
}

TEST_F(NpyTest, ReadsUint8AndBool) {
  const std::string mask = std::string("\x01\x00\x00\x01\x01\x01", 6);
  for (const char* descr : {"|u1", "|b1", "<u1"}) {
    const std::string path = write_file(
        "m.npy", npy_file(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2, 3), }", mask));
    std::vector<int64_t> shape;
    EXPECT_EQ(read_npy_u8(path, "--block-mask", &shape), (std::vector<uint8_t>{1, 0, 0, 1, 1, 1})) << descr;
    EXPECT_EQ(shape, (std::vector<int64_t>{2, 3}));
  }
  const std::vector<uint8_t> values = {0, 1, 255};
  write_npy_u8(file("u.npy"), "--dump-block-mask", {3}, values.data());
  EXPECT_EQ(read_npy_u8(file("u.npy"), "--block-mask", nullptr), values);
  EXPECT_EQ(read_file(file("u.npy")).substr(0, 128), npy_header_bytes("|u1", {3}));
  expect_usage_error([&] { read_npy_int64(file("u.npy"), "--doc-lens", nullptr); }, "--doc-lens",
                     "dtype uint8 ('|u1') where int64");
}

// --- headers that are unusual but valid -----------------------------------------------------------

TEST_F(NpyTest, AcceptsAnyValidDictSpelling) {
  const std::string data = raw_bytes(std::vector<float>{1, 2, 3, 4, 5, 6});
  const struct {
    const char* dict;
    std::vector<int64_t> shape;
  } cases[] = {
      {"{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}", {2, 3}},
      {"{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(2,3)}\n", {2, 3}},
      {"{ 'descr' : '<f4' ,\n 'fortran_order' : False ,\t'shape' : ( 6 , ) , }   \n", {6}},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3,), }", {2, 3}},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2L, 3L), }", {1, 2, 3}},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (), }", {}},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6, 0), }", {6, 0}},
  };
  for (const auto& c : cases) {
    const std::string path = write_file("ok.npy", npy_file(c.dict, data));
    const NpyInfo info = inspect_npy(path, "--q");
    EXPECT_EQ(info.shape, c.shape) << c.dict;
    EXPECT_EQ(info.descr, "<f4");
  }
  // Versions 2.0 and 3.0 have a 4-byte header length.
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }";
  for (int major : {2, 3}) {
    const std::string path = write_file("v.npy", npy_file(dict, data, major));
    EXPECT_EQ(read_npy_float(path, "--q", nullptr), (std::vector<float>{1, 2, 3, 4, 5, 6})) << major;
    EXPECT_EQ(inspect_npy(path, "--q").data_offset, static_cast<int64_t>(12 + dict.size()));
  }
}

TEST_F(NpyTest, FileThatShrinksAfterInspectionIsAFault) {
  const std::vector<float> x(64, 1.0f);
  write_npy(file("x.npy"), "--q", {8, 8}, x.data());
  const NpyInfo info = inspect_npy(file("x.npy"), "--q");
  fs::resize_file(file("x.npy"), 200);
  const std::vector<int64_t> positions = {7};
  std::vector<float> out(8);
  EXPECT_THROW(read_npy_rows(info, rows_along(info.shape, 0, positions), out.data()), Fault);
}

TEST_F(NpyTest, AcceptsTrailingBytesAfterTheData) {
  const std::string path =
      write_file("t.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                                   raw_bytes(std::vector<float>{2.5f}) + "extra"));
  EXPECT_EQ(read_npy_float(path, "--q", nullptr), std::vector<float>{2.5f});
}

// --- malformed files ------------------------------------------------------------------------------

TEST_F(NpyTest, RejectsFilesThatAreNotNpy) {
  const std::string missing = file("missing.npy");
  expect_usage_error([&] { inspect_npy(missing, "--q"); }, "--q " + missing, "cannot open: No such file");
  expect_usage_error([&] { inspect_npy(dir_.string(), "--q"); }, "--q " + dir_.string(), "is a directory");
  const std::string empty = write_file("empty.npy", "");
  expect_usage_error([&] { inspect_npy(empty, "--q"); }, "--q " + empty, "not a .npy file (the file is empty)");
  const std::string text = write_file("text.npy", "hello, world\n");
  expect_usage_error([&] { inspect_npy(text, "--q"); }, "--q " + text, "not a .npy file (bad magic");
  const std::string zip = write_file("a.npz", std::string("PK\x03\x04\x14\x00\x00\x00", 8));
  expect_usage_error([&] { inspect_npy(zip, "--q"); }, "--q " + zip, "perhaps a .npz");
}

struct BadHeader {
  std::string bytes;
  std::string reason;
};

TEST_F(NpyTest, RejectsMalformedHeaders) {
  const std::string magic = "\x93NUMPY";
  auto dict = [](const std::string& shape_and_more) {
    return npy_file("{'descr': '<f4', 'fortran_order': False, " + shape_and_more);
  };
  std::string many_dims;
  for (int i = 0; i < 65; ++i) many_dims += "1, ";
  const std::vector<BadHeader> cases = {
      {magic.substr(0, 4), "truncated header: the file has only 4 bytes"},
      {magic + "\x01", "truncated header: the file has only 7 bytes"},
      {magic + std::string("\x01\x00\x50", 3), "truncated header: the file has only 9 bytes"},
      {magic + std::string("\x02\x00\x50\x00\x00", 5), "truncated header: the file has only 11 bytes"},
      {magic + std::string("\x01\x00\x00\x10", 4) + "{}", "header length 4096 goes beyond the end of the file (12 bytes)"},
      {magic + std::string("\x02\x00\xff\xff\xff\x7f", 6) + "{}", "header length 2147483647 is implausibly large"},
      {magic + std::string("\x04\x00\x02\x00", 4) + "{}", "unsupported .npy format version 4.0"},
      {magic + std::string("\x01\x01\x02\x00", 4) + "{}", "unsupported .npy format version 1.1"},
      {npy_file(""), "the header does not start with '{'"},
      {npy_file("'descr': '<f4'"), "the header does not start with '{'"},
      {npy_file("{'descr': '<f4', 'fortran_order': False}"), "the header has no 'shape' key"},
      {npy_file("{'fortran_order': False, 'shape': (1,)}"), "the header has no 'descr' key"},
      {npy_file("{'descr': '<f4', 'shape': (1,)}"), "the header has no 'fortran_order' key"},
      {dict("'shape': (1,), 'extra': 1}"), "unknown key 'extra'"},
      {dict("'shape': (1,), 'shape': (2,)}"), "key 'shape' appears twice"},
      {dict("'shape': (1,)"), "expected ',' or '}' after the value of 'shape'"},
      {dict("'shape': (1,)} x"), "unexpected text after the closing '}'"},
      {dict("'shape' (1,)}"), "expected ':' after key 'shape'"},
      {dict("'shape: (1,)}"), "unterminated string"},
      {dict("shape: (1,)}"), "expected a quoted key"},
      {dict("'shape': (5)}"), "'shape' (5) is not a tuple (a 1-D shape is written (5,))"},
      {dict("'shape': [2, 3]}"), "expected a tuple '(...)' as 'shape'"},
      {dict("'shape': (2 3)}"), "expected ',' or ')' in 'shape'"},
      {dict("'shape': (2, x)}"), "expected an integer in 'shape'"},
      {dict("'shape': (2, -3)}"), "negative dimension -3 in 'shape'"},
      {dict("'shape': (99999999999999999999,)}"), "dimension 99999999999999999999 in 'shape' is too large"},
      {dict("'shape': (4294967296, 4294967296)}"), "whose size overflows 64 bits"},
      {dict("'shape': (" + many_dims + ")}"), "'shape' has more than 64 dimensions"},
      {npy_file("{'descr': 'f4', 'fortran_order': False, 'shape': (1,)}", "abcd"), "does not say little-endian"},
      {npy_file("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}"), "expected True or False as 'fortran_order'"},
      {npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}"), "structured dtypes"},
      {npy_file("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}"), "escape sequences"},
      {npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}", std::string(16, '\0')),
       "Fortran order is not supported"},
      {npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (1,)}", "abcd"), "big-endian data ('>f4')"},
      {npy_file("{'descr': '<i2', 'fortran_order': False, 'shape': (1,)}", "ab"), "unsupported dtype '<i2'"},
      {npy_file("{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}", "abcdefgh"), "unsupported dtype '<c8'"},
      {npy_file("{'descr': '|O', 'fortran_order': False, 'shape': (1,)}", "abcdefgh"), "unsupported dtype '|O'"},
      {npy_file("{'descr': '<U3', 'fortran_order': False, 'shape': (1,)}", "abcdefghijkl"), "unsupported dtype '<U3'"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", std::string(23, '\0')),
       "header claims shape (2, 3) float32 = 24 B of data but the file holds 23 bytes after its"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000, 8, 128), }", std::string(1234, '\0')),
       "header claims shape (1000000000, 8, 128) float32 = 3.7 TiB of data but the file holds 1234 bytes"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = write_file("bad" + std::to_string(i) + ".npy", cases[i].bytes);
    expect_usage_error([&] { inspect_npy(path, "--q"); }, "--q " + path, cases[i].reason);
    // The readers refuse it the same way, before allocating anything.
    expect_usage_error([&] { read_npy_float(path, "--q", nullptr); }, "--q " + path, cases[i].reason);
  }
}

TEST(NpyHeader, ParsesFromMemoryAndChecksTheHeaderIsWhole) {
  const std::string h = npy_header_bytes("<f4", {2});
  EXPECT_EQ(parse_npy_header(h, 128 + 8, "mem.npy", "--q").shape, std::vector<int64_t>{2});
  expect_usage_error([&] { parse_npy_header(std::string_view(h).substr(0, 100), 136, "mem.npy", "--q"); },
                     "--q mem.npy", "truncated header: 100 of 128 header bytes given");
  expect_usage_error([&] { parse_npy_header(std::string_view(h).substr(0, 5), 136, "mem.npy", "--q"); },
                     "--q mem.npy", "truncated header: 5 of 12 header bytes given");
  expect_usage_error([&] { parse_npy_header(h, 128 + 7, "mem.npy", "--q"); }, "--q mem.npy",
                     "file holds 7 bytes after its 128-byte header");
}

// --- outputs ----------------------------------------------------------------------------------------

TEST_F(NpyTest, RanksWriteTheirRowsAndOneCommits) {
  const int64_t B = 2, L = 8, H = 2, D = 3;
  const std::vector<int64_t> shape = {B, L, H, D};
  const std::vector<float> o = testing::random_vector(static_cast<size_t>(B * L * H * D), 9);
  const std::string path = file("o.npy");
  // Zigzag over two ranks: rank 0 owns chunks 0 and 3, rank 1 chunks 1 and 2.
  const std::vector<std::vector<int64_t>> owned = {{0, 1, 6, 7}, {2, 3, 4, 5}};

  NpyOutput first = NpyOutput::create(path, "--out", shape);
  NpyOutput second = NpyOutput::open(path, first.temp_path(), "--out", shape);
  EXPECT_NE(first.temp_path().find(path + ".tmp-"), std::string::npos);
  EXPECT_FALSE(fs::exists(path)) << "nothing at the final path while writing";
  EXPECT_EQ(fs::file_size(first.temp_path()), 128u + o.size() * 4) << "the full size is reserved up front";
  NpyOutput* ranks[] = {&first, &second};
  for (int r = 0; r < 2; ++r) {
    const RowSelection rows = rows_along(shape, 1, owned[r]);
    const std::vector<float> mine = slice_rows(o, B, L, H * D, owned[r]);
    ranks[r]->write_rows(rows, mine.data());
    ranks[r]->finish();
  }
  first.commit();
  EXPECT_EQ(entries(), std::vector<std::string>{"o.npy"});
  EXPECT_EQ(read_npy_float(path, "--out", nullptr), o);
}

TEST_F(NpyTest, FailedWriteLeavesNothingAtTheFinalPath) {
  const std::vector<float> rows(6, 1.0f);
  const std::vector<int64_t> positions = {0};
  const std::string path = file("o.npy");
  {
    NpyOutput out = NpyOutput::create(path, "--out", {2, 6});
    out.write_rows(rows_along({2, 6}, 0, positions), rows.data());
    // Destroyed without commit, as when an exception unwinds.
  }
  EXPECT_TRUE(entries().empty());
  {
    NpyOutput out = NpyOutput::create(path, "--out", {2, 6});
    out.discard();
    out.discard();
  }
  EXPECT_TRUE(entries().empty());

  // An old file at the final path stays as it was until a new one is complete.
  write_file("o.npy", "old contents");
  {
    NpyOutput out = NpyOutput::create(path, "--out", {2, 6});
    out.write_rows(rows_along({2, 6}, 0, positions), rows.data());
  }
  EXPECT_EQ(read_file(path), "old contents");
  EXPECT_EQ(entries(), std::vector<std::string>{"o.npy"});
}

TEST_F(NpyTest, RanksMustAgreeOnTheOutput) {
  const std::string path = file("o.npy");
  NpyOutput out = NpyOutput::create(path, "--out", {4, 3});
  EXPECT_THROW(NpyOutput::open(path, out.temp_path(), "--out", {4, 2}), Fault);
  EXPECT_THROW(NpyOutput::open(path, out.temp_path() + "x", "--out", {4, 3}), Fault);
}

TEST_F(NpyTest, RejectsUnusableOutputPaths) {
  const float x = 0;
  const std::string nowhere = file("no/such/dir/o.npy");
  expect_usage_error([&] { write_npy(nowhere, "--out", {1}, &x); }, "--out " + nowhere, "cannot create");
  expect_usage_error([&] { write_npy(dir_.string(), "--out", {1}, &x); }, "--out " + dir_.string(), "is a directory");
  EXPECT_TRUE(entries().empty());
}

// A file size limit stands in for a full disk: the kernel refuses writes past it with EFBIG.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit limited = old_;
    limited.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limited);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  sighandler_t old_handler_;
};

TEST_F(NpyTest, FullDiskFailsWhenReservingAndLeavesNothing) {
  const std::string path = file("o.npy");
  {
    FileSizeLimit limit(4096);
    expect_error<Fault>([&] { NpyOutput::create(path, "--out", {1024, 1024}); }, "--out " + path,
                               "cannot reserve 4.0 MiB");
  }
  EXPECT_TRUE(entries().empty());
}

TEST_F(NpyTest, FailedRowWriteIsAFaultAndLeavesNothing) {
  const std::string path = file("o.npy");
  const std::vector<float> rows(2 * 1024, 1.0f);
  const std::vector<int64_t> positions = {1000, 1001};
  {
    NpyOutput out = NpyOutput::create(path, "--out", {1024, 1024});
    FileSizeLimit limit(4096);
    expect_error<Fault>([&] { out.write_rows(rows_along({1024, 1024}, 0, positions), rows.data()); },
                               "--out " + path, "write of 8192 bytes at offset");
  }
  EXPECT_TRUE(entries().empty());
}

}  // namespace
}  // namespace ringattn
