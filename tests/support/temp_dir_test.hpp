// A GoogleTest fixture that gives each test a fresh folder under /tmp, removed with everything in
// it afterwards, and names the files in it.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ringattn::testing {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/ringattn-test-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The path of `name` in the folder.
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  // Writes `bytes` to `name` in the folder; returns its path.
  std::string write_file(const std::string& name, const std::string& bytes) const {
    std::ofstream(file(name), std::ios::binary) << bytes;
    return file(name);
  }
  // The names of the files in the folder that start with `prefix`.
  std::vector<std::string> entries(const std::string& prefix = "") const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_))
      if (e.path().filename().string().rfind(prefix, 0) == 0) names.push_back(e.path().filename().string());
    return names;
  }

  std::filesystem::path dir_;
};

}  // namespace ringattn::testing
