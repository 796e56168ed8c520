#include "dtrain/data/csv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "testutil/expect_throws.h"
#include "testutil/temp_dir.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

class CsvTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testutil::make_temp_dir("dtrain_csv_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` to a file in the temp dir and returns its path.
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = (fs::path(dir_) / name).string();
    FILE* f = std::fopen(p.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    return p;
  }

  // The message of the InvalidArgumentError read_csv throws.
  std::string error_of(const std::string& p, const CsvOptions& options = {}) {
    return testutil::expect_throws<InvalidArgumentError>([&] { read_csv(p, options); });
  }

  std::string dir_;
};

TEST_F(CsvTest, ReadsNumbersWithAutoDetectedHeader) {
  const std::string p = write("a.csv",
                              "sepal_length, \"sepal width\",label\r\n"
                              "5.1, 3.5, 0\r\n"
                              "\n"
                              "-4.9,+3e0,\"1\"\r\n"
                              "1e-3,.5,2");
  const Tensor t = read_csv(p);
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.shape(), (Shape{3, 3}));
  EXPECT_EQ(t.to_vector<float>(),
            (std::vector<float>{5.1f, 3.5f, 0, -4.9f, 3.0f, 1, 0.001f, 0.5f, 2}));
}

TEST_F(CsvTest, HeaderOptionOverridesDetection) {
  const std::string p = write("n.csv", "1,2\n3,4\n");
  EXPECT_EQ(read_csv(p).shape(), (Shape{2, 2}));                    // auto: no header
  EXPECT_EQ(read_csv(p, {.header = true}).shape(), (Shape{1, 2}));  // first row skipped
  EXPECT_EQ(read_csv(p, {.header = true}).to_vector<float>(), (std::vector<float>{3, 4}));
  const std::string h = write("h.csv", "x,y\n1,2\n");
  const std::string msg = error_of(h, {.header = false});
  EXPECT_NE(msg.find(h + ":1:1: non-numeric field 'x'"), std::string::npos) << msg;
}

TEST_F(CsvTest, OtherDelimitersCommentsAndSpecialValues) {
  const std::string p = write("t.tsv", "# comment\n1\t nan\n-inf\t2\n");
  const Tensor t = read_csv(p, {.delimiter = '\t', .comment = '#'});
  ASSERT_EQ(t.shape(), (Shape{2, 2}));
  const std::vector<float> v = t.to_vector<float>();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_EQ(v[2], -INFINITY);
  EXPECT_EQ(v[3], 2.0f);
  EXPECT_EQ(read_csv(write("s.csv", "1;2;3\n"), {.delimiter = ';'}).shape(), (Shape{1, 3}));
}

TEST_F(CsvTest, NonNumericFieldNamesFileLineColumnAndText) {
  const std::string p = write("bad.csv", "a,b,c\n1,2,3\n4,abc,6\n");
  const std::string msg = error_of(p);
  EXPECT_NE(msg.find(p + ":3:3: non-numeric field 'abc'"), std::string::npos) << msg;
  const std::string e = write("empty_field.csv", "1,2,3\n4,,6\n");
  const std::string msg2 = error_of(e);
  EXPECT_NE(msg2.find(e + ":2:3: empty field"), std::string::npos) << msg2;
  // "1.5x" is not a number even though it starts like one.
  EXPECT_NE(error_of(write("suffix.csv", "1,2\n1,1.5x\n")).find(":2:3: non-numeric field '1.5x'"),
            std::string::npos);
}

TEST_F(CsvTest, RaggedRowNamesLineAndExpectedCount) {
  const std::string p = write("ragged.csv", "x,y,z\n1,2,3\n4,5,6,7\n8,9\n");
  const std::string msg = error_of(p);
  EXPECT_NE(msg.find(p + ":3:7: row has 4 fields, expected 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'4,5,6,7'"), std::string::npos) << msg;
  const std::string q = write("short.csv", "1,2,3\n8,9\n");
  const std::string msg2 = error_of(q);
  EXPECT_NE(msg2.find(q + ":2:4: row has 2 fields, expected 3 as on line 1"), std::string::npos)
      << msg2;
}

TEST_F(CsvTest, MissingFileIsNotFound) {
  const std::string p = (fs::path(dir_) / "missing.csv").string();
  try {
    read_csv(p);
    FAIL() << "expected NotFoundError";
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(CsvTest, HeaderOnlyFileHasZeroRows) {
  EXPECT_EQ(read_csv(write("h.csv", "a,b,c\n")).shape(), (Shape{0, 3}));
}

TEST(SplitLabelColumn, SplitsAndConvertsTheLabelColumn) {
  const Tensor table = Tensor::from_vector<float>({1, 2, 0, 3, 4, 1, 5, 6, 2}, Shape{3, 3});
  const LabeledTable last = split_label_column(table, -1, DType::kInt64);
  EXPECT_EQ(last.x.shape(), (Shape{3, 2}));
  EXPECT_EQ(last.x.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(last.y.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  const LabeledTable first = split_label_column(table, 0);
  EXPECT_EQ(first.x.to_vector<float>(), (std::vector<float>{2, 0, 4, 1, 6, 2}));
  EXPECT_EQ(first.y.to_vector<float>(), (std::vector<float>{1, 3, 5}));
  EXPECT_THROW(split_label_column(table, 3), InvalidArgumentError);
  const Tensor fractional = Tensor::from_vector<float>({1, 0.5f}, Shape{1, 2});
  EXPECT_THROW(split_label_column(fractional, 1, DType::kInt32), InvalidArgumentError);
  const Tensor big = Tensor::from_vector<float>({1, 256}, Shape{1, 2});
  EXPECT_THROW(split_label_column(big, 1, DType::kUInt8), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::data
