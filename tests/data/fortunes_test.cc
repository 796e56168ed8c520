#include "dtrain/data/fortunes.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "dtrain/core/error.h"
#include "dtrain/data/tokenizer.h"
#include "testutil/expect_throws.h"
#include "testutil/temp_dir.h"

namespace dtrain::data {
namespace {

TEST(Fortunes, ListsTextFilesWithoutIndexesOrSubdirectories) {
  testutil::TempDir dir("dtrain_fortunes_test");
  testutil::write_bytes(dir.file("b"), "two\n%\nthree\n");
  testutil::write_bytes(dir.file("a"), "one");
  testutil::write_bytes(dir.file("a.dat"), std::string("\0\0\0\2", 4));
  std::filesystem::create_symlink("a", dir.file("a.u8"));
  std::filesystem::create_directory(dir.file("off"));
  testutil::write_bytes(dir.file("off/rude"), "no\n");
  EXPECT_EQ(fortunes::list_files(dir.path()),
            (std::vector<std::string>{dir.file("a"), dir.file("b")}));
  EXPECT_EQ(fortunes::load_text(dir.path()), "one\ntwo\n%\nthree\n");
}

TEST(Fortunes, MissingOrEmptyDirectoryNamesThePackage) {
  testutil::TempDir dir("dtrain_fortunes_test");
  std::string msg =
      testutil::expect_throws<NotFoundError>([&] { fortunes::list_files(dir.file("absent")); });
  EXPECT_NE(msg.find("apt-get install fortunes"), std::string::npos) << msg;
  testutil::write_bytes(dir.file("x.dat"), "index");
  msg = testutil::expect_throws<NotFoundError>([&] { fortunes::list_files(dir.path()); });
  EXPECT_NE(msg.find("apt-get install fortunes"), std::string::npos) << msg;
}

TEST(Fortunes, BinaryFileIsADataLossNamingIt) {
  testutil::TempDir dir("dtrain_fortunes_test");
  testutil::write_bytes(dir.file("good"), "fine\n");
  testutil::write_bytes(dir.file("junk"), std::string("ab\0cd", 5));
  const std::string msg =
      testutil::expect_throws<DataLossError>([&] { fortunes::load_text(dir.path()); });
  EXPECT_NE(msg.find(dir.file("junk")), std::string::npos) << msg;
}

// The installed corpus (scripts/install_deps.sh installs it): the numbers.
TEST(Fortunes, InstalledCorpusHas113Characters) {
  if (!std::filesystem::exists(fortunes::kDefaultDir)) {
    GTEST_SKIP() << fortunes::kDefaultDir << " is missing: run scripts/install_deps.sh";
  }
  const std::string text = fortunes::load_text();
  EXPECT_GT(text.size(), 2'000'000u);
  EXPECT_LT(text.size(), 3'000'000u);
  const CharTokenizer tok = CharTokenizer::build(text);
  EXPECT_EQ(tok.vocab_size(), 113);
  const std::string sample = text.substr(0, 2000);
  EXPECT_EQ(tok.decode(tok.encode(sample)), sample);
}

}  // namespace
}  // namespace dtrain::data
