// The registry of temporary files that a fatal signal removes (runtime/io/temp_files.hpp): what is
// registered is removed, what is forgotten is not, and an output registers its temporary file
// from creation until it is committed or discarded.
#include "runtime/io/temp_files.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/io/npy.hpp"
#include "tests/support/temp_dir_test.hpp"

namespace ringattn {
namespace {

namespace fs = std::filesystem;

class TempFilesTest : public testing::TempDirTest {
 protected:
  std::string touch(const std::string& name) const { return write_file(name, "x"); }
  std::vector<std::string> files(const std::string& prefix) const { return entries(prefix); }
};

TEST_F(TempFilesTest, RemovesWhatIsRegisteredAndNotWhatIsForgotten) {
  const std::string kept = touch("kept"), removed = touch("removed");
  temp_files::add(kept);
  temp_files::add(removed);
  temp_files::forget(kept);
  EXPECT_EQ(temp_files::remove_all(), 1);
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_FALSE(fs::exists(removed));
  temp_files::forget(removed);
  EXPECT_EQ(temp_files::remove_all(), 0);
}

TEST_F(TempFilesTest, FullRegistryAndLongPathsAreIgnored) {
  std::vector<std::string> paths;
  for (size_t i = 0; i < temp_files::kSlots + 4; ++i) paths.push_back(touch("f" + std::to_string(i)));
  for (const auto& p : paths) temp_files::add(p);
  temp_files::add(std::string(temp_files::kPathBytes, 'x'));
  EXPECT_EQ(temp_files::remove_all(), static_cast<int>(temp_files::kSlots));
  for (const auto& p : paths) temp_files::forget(p);
  EXPECT_EQ(temp_files::remove_all(), 0);
}

TEST_F(TempFilesTest, AnOutputIsRegisteredUntilCommitted) {
  const std::string path = (dir_ / "o.npy").string();
  const float data[4] = {1, 2, 3, 4};
  {
    NpyOutput out = NpyOutput::create(path, "--out", {4});
    ASSERT_EQ(files("o.npy.tmp-").size(), 1u);
    EXPECT_EQ(temp_files::remove_all(), 1);  // as a signal handler would
    EXPECT_TRUE(files("o.npy").empty());
  }
  NpyOutput out = NpyOutput::create(path, "--out", {4});
  const int64_t all = 0;
  out.write_rows(RowSelection{1, 1, 4, std::span<const int64_t>(&all, 1)}, data);
  out.finish();
  out.commit();
  EXPECT_EQ(temp_files::remove_all(), 0);  // committed: forgotten
  EXPECT_EQ(files("o.npy"), std::vector<std::string>{"o.npy"});
}

}  // namespace
}  // namespace ringattn
