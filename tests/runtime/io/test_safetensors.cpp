// The safetensors reader and writer: a written file reads back (whole and by rows), float16 and
// bfloat16 are converted exactly, and each kind of malformed header is refused with a ArgumentError
// naming the file and the tensor.
#include "runtime/io/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/errors.hpp"
#include "runtime/io/safetensors_output.hpp"

namespace ringattn {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/ringattn-safetensors-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A file of this header (given as JSON text) and `data` bytes.
  std::string write(const std::string& name, const std::string& header, const std::string& data) const {
    std::string bytes(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(bytes.data(), &n, 8);
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes << header << data;
    return path;
  }
  // The message of the ArgumentError inspect_safetensors throws ("" when it accepts).
  static std::string refusal(const std::string& path) {
    try {
      inspect_safetensors(path, "--weights");
    } catch (const ArgumentError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(SafetensorsTest, WrittenFileReadsBackWholeAndByRows) {
  const std::string path = (dir_ / "w.safetensors").string();
  std::vector<float> a(12), b(3);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) + 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -float(i);
  {
    SafetensorsOutput out = SafetensorsOutput::create(path, "--out", {{"a", {4, 3}}, {"b", {3}}}, {{"format", "pt"}});
    const std::vector<int64_t> rows_0_2{0, 2}, rows_1_3{1, 3}, all{0};
    out.write_rows(0, RowSelection{1, 4, 3, rows_0_2}, std::vector<float>{0.5f, 1.5f, 2.5f, 6.5f, 7.5f, 8.5f}.data());
    out.write_rows(0, RowSelection{1, 4, 3, rows_1_3}, std::vector<float>{3.5f, 4.5f, 5.5f, 9.5f, 10.5f, 11.5f}.data());
    out.write_rows(1, RowSelection{1, 1, 3, all}, b.data());
    out.commit();
  }
  const SafetensorsInfo info = inspect_safetensors(path, "--weights");
  ASSERT_EQ(info.tensors.size(), 2u);
  EXPECT_EQ(info.metadata, (std::vector<std::pair<std::string, std::string>>{{"format", "pt"}}));
  const SafetensorsTensor& t = require_float_tensor(info, "a", {4, 3});
  EXPECT_EQ(t.offset % 8, 0);  // aligned data
  std::vector<float> got(12);
  const std::vector<int64_t> every{0, 1, 2, 3};
  read_safetensors_rows(info, t, RowSelection{1, 4, 3, every}, got.data());
  EXPECT_EQ(got, a);
  std::vector<float> column(4);  // column 1 of every row: inner 1, the column axis as "sequence"
  const std::vector<int64_t> col1{1};
  read_safetensors_rows(info, t, RowSelection{4, 3, 1, col1}, column.data());
  EXPECT_EQ(column, (std::vector<float>{1.5f, 4.5f, 7.5f, 10.5f}));
  EXPECT_EQ(refusal(path), "");  // accepted
}

TEST_F(SafetensorsTest, Float16AndBfloat16AreConverted) {
  // 1.0 and -2.5 in float16 (0x3c00, 0xc100) and bfloat16 (0x3f80, 0xc020), little-endian.
  const std::string data("\x00\x3c\x00\xc1\x80\x3f\x20\xc0", 8);
  const std::string path = write("h.safetensors",
                                 R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                                 R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]}})",
                                 data);
  const SafetensorsInfo info = inspect_safetensors(path, "--weights");
  const std::vector<int64_t> zero{0};
  for (const char* name : {"h", "b"}) {
    std::vector<float> v(2);
    read_safetensors_rows(info, require_float_tensor(info, name, {2}), RowSelection{1, 1, 2, zero}, v.data());
    EXPECT_EQ(v, (std::vector<float>{1.0f, -2.5f})) << name;
  }
}

TEST_F(SafetensorsTest, MalformedFilesAreRefusedNamingTheTensor) {
  struct Case {
    std::string header, data, message;
  };
  const std::string f32x4 = R"({"dtype":"F32","shape":[4],"data_offsets":)";
  const std::vector<Case> cases = {
      {"{" + std::string(R"("a":)") + f32x4 + "[0,16]}," + R"("b":)" + f32x4 + "[8,24]}}", std::string(24, '\0'),
       "tensors \"a\" and \"b\" overlap"},
      {"{" + std::string(R"("a":)") + f32x4 + "[0,16]}}", std::string(8, '\0'),
       "tensor \"a\": data_offsets [0, 16) run past the end of the data (8 bytes; is the file truncated?)"},
      {R"({"a":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'),
       "tensor \"a\": holds 8 bytes, but shape (3,) of F16 needs 6"},
      {R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'),
       "tensor \"a\": missing or unknown dtype"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0'),
       "tensor \"a\": a shape entry is not a non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", std::string(4, '\0'),
       "tensor \"a\": data_offsets end before they begin"},
      {"{" + std::string(R"("a":)") + f32x4 + "[0,16]}," + R"("a":)" + f32x4 + "[16,32]}}", std::string(32, '\0'),
       "tensor \"a\": appears twice"},
      {R"({"a":{"dtype":"F32",)", "", "invalid JSON"},
      {R"([1,2])", "", "the safetensors header is not a JSON object"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = write("bad" + std::to_string(i) + ".safetensors", cases[i].header, cases[i].data);
    const std::string message = refusal(path);
    EXPECT_NE(message.find(cases[i].message), std::string::npos) << cases[i].header << "\n" << message;
    EXPECT_NE(message.find(path), std::string::npos) << message;
  }
  // A header length beyond the file, and a file too short for one.
  std::ofstream((dir_ / "long").string(), std::ios::binary) << std::string("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10);
  EXPECT_NE(refusal((dir_ / "long").string()).find("header length 65535 does not fit the file"), std::string::npos);
  std::ofstream((dir_ / "short").string(), std::ios::binary) << "abc";
  EXPECT_NE(refusal((dir_ / "short").string()).find("too short"), std::string::npos);
  // Missing tensors and wrong shapes or dtypes, for the caller's expectations.
  const std::string path = write("ok.safetensors", R"({"n":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                                 std::string(8, '\0'));
  const SafetensorsInfo info = inspect_safetensors(path, "--weights");
  auto require = [&](const std::string& name, std::vector<int64_t> shape) {
    try {
      require_float_tensor(info, name, shape);
    } catch (const ArgumentError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(require("m", {1}).find("tensor \"m\" is missing"), std::string::npos);
  EXPECT_NE(require("n", {1}).find("tensor \"n\": dtype I64, expected F32, F16 or BF16"), std::string::npos);
}

}  // namespace
}  // namespace ringattn
